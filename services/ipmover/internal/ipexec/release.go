package ipexec

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/fanpbx/fan/services/ipmover/internal/fence"
	"github.com/fanpbx/fan/services/ipmover/internal/vip"
)

// ReleaseAll removes, without the bus, every floating address this node may
// hold: the addresses its state file records as ever claimed (IPv4 and IPv6)
// and any IPv4 address carrying fan's label. systemd runs it from
// ExecStopPost (`fan-ipmover -release-all`), which runs even after the
// process was killed, so a crashed or OOM-killed ipmover never leaves an
// address answering on its node (keepalived does, after SIGKILL). It is
// idempotent: after a clean stop there is nothing left to remove.
//
// It does not undo the gateway role's routes and sysctls: their previous
// values lived in the dead process's memory. The routes go with the address
// they use as source; the sysctls stay as set.
func (s *Service) ReleaseAll(ctx context.Context) error {
	var managed []netip.Prefix
	st, ferr := fence.Open(s.cfg.StateFile, fence.DefaultKeep)
	if ferr != nil {
		// Still remove the labelled addresses, then report the state file.
		ferr = fmt.Errorf("release-all: state file: %w", ferr)
	} else {
		for _, a := range st.Snapshot().Managed {
			if p, err := netip.ParsePrefix(a); err == nil {
				managed = append(managed, p)
			}
		}
	}
	var opts []vip.Option
	if s.ns.IsOpen() {
		opts = append(opts, vip.WithNamespace(s.ns))
	}
	mgr, err := vip.New(s.cfg.Interface, s.log, opts...)
	if err != nil {
		return errors.Join(ferr, fmt.Errorf("release-all: %w", err))
	}
	defer mgr.Close()
	present, err := mgr.List()
	if err != nil {
		return errors.Join(ferr, fmt.Errorf("release-all: list %s: %w", s.cfg.Interface, err))
	}
	label := vip.Label(s.cfg.Interface)
	var errs []error
	for _, a := range present {
		// The exact address and length: the node's own address on the same
		// subnet must never match.
		if !(label != "" && a.Label == label) && !slices.Contains(managed, a.Prefix) {
			continue
		}
		if err := mgr.Delete(a.Prefix); err != nil {
			errs = append(errs, fmt.Errorf("release-all: delete %s: %w", a.Prefix, err))
			continue
		}
		s.log.Info("released floating address without the bus", "prefix", a.Prefix.String(), "interface", s.cfg.Interface)
	}
	return errors.Join(append(errs, ferr)...)
}
