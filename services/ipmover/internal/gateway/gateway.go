// Package gateway gives a node the LAN-gateway role that comes with a
// floating address in sites where the floating IP is also the LAN's
// default gateway: while the node holds the address it forwards, and
// may need routes of its own; when it gives the address up both are undone,
// so a standby never routes for a LAN that no longer sends to it.
package gateway

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/fanpbx/fan/services/ipmover/internal/sysctl"
)

// Route is one route installed while holding.
type Route struct {
	To  netip.Prefix
	Via netip.Addr // optional: a directly connected route when invalid
	Dev string     // optional: the floating interface when empty
	// Src, optional, is the preferred source; usually the floating address.
	Src    netip.Addr
	Metric int
}

// Config is the gateway role. The zero value does nothing.
type Config struct {
	// Sysctls are written on Apply; the values found before are restored
	// on Undo. Typically net.ipv4.ip_forward: "1".
	Sysctls map[string]string
	Routes  []Route
}

// Empty reports whether there is anything to do.
func (c Config) Empty() bool { return len(c.Sysctls) == 0 && len(c.Routes) == 0 }

// Gateway applies and undoes one Config on one namespace.
type Gateway struct {
	cfg    Config
	ifname string
	h      *netlink.Handle
	sys    sysctl.Namespace
	log    *slog.Logger

	mu      sync.Mutex
	applied bool
	saved   map[string]string // sysctl values found before the first Apply
}

// New prepares the role for the floating interface ifname. ns is
// netns.None() for the caller's namespace.
func New(cfg Config, ifname string, ns netns.NsHandle, log *slog.Logger) (*Gateway, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	var (
		h   *netlink.Handle
		err error
	)
	if ns.IsOpen() {
		h, err = netlink.NewHandleAt(ns)
	} else {
		h, err = netlink.NewHandle()
	}
	if err != nil {
		return nil, fmt.Errorf("gateway: netlink handle: %w", err)
	}
	return &Gateway{cfg: cfg, ifname: ifname, h: h, sys: sysctl.Namespace{NS: ns}, log: log.With("component", "gateway")}, nil
}

// Close releases the netlink handle.
func (g *Gateway) Close() { g.h.Close() }

// Configured reports whether there is a role to apply at all.
func (g *Gateway) Configured() bool { return !g.cfg.Empty() }

// Applied reports whether the role is in force.
func (g *Gateway) Applied() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.applied
}

// Apply puts the role in force. It is idempotent (routes are replaced),
// so the reconcile path may call it again after an address came back.
func (g *Gateway) Apply() error {
	if g.cfg.Empty() {
		return nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	var errs []error
	if g.saved == nil {
		g.saved = map[string]string{}
		for k := range g.cfg.Sysctls {
			v, err := g.sys.Get(k)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			g.saved[k] = v
		}
	}
	for k, v := range g.cfg.Sysctls {
		if err := g.sys.Set(k, v); err != nil {
			errs = append(errs, err)
		}
	}
	for _, r := range g.cfg.Routes {
		nr, err := g.route(r)
		if err == nil {
			err = g.h.RouteReplace(nr)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("gateway: route %s: %w", r.To, err))
		}
	}
	g.applied = true
	if err := errors.Join(errs...); err != nil {
		return err
	}
	g.log.Info("gateway role applied", "sysctls", len(g.cfg.Sysctls), "routes", len(g.cfg.Routes))
	return nil
}

// Undo removes the routes and restores the sysctls. Absent routes are not
// an error (the kernel drops routes whose source address went away).
func (g *Gateway) Undo() error {
	if g.cfg.Empty() {
		return nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.applied {
		return nil
	}
	var errs []error
	for _, r := range g.cfg.Routes {
		nr, err := g.route(r)
		if err == nil {
			err = g.h.RouteDel(nr)
		}
		if err != nil && !errors.Is(err, errNoRoute) && !isAbsent(err) {
			errs = append(errs, fmt.Errorf("gateway: delete route %s: %w", r.To, err))
		}
	}
	for k, v := range g.saved {
		if err := g.sys.Set(k, v); err != nil {
			errs = append(errs, err)
		}
	}
	g.applied = false
	if err := errors.Join(errs...); err != nil {
		return err
	}
	g.log.Info("gateway role undone")
	return nil
}

var errNoRoute = errors.New("gateway: no such interface")

func (g *Gateway) route(r Route) (*netlink.Route, error) {
	dev := r.Dev
	if dev == "" {
		dev = g.ifname
	}
	l, err := g.h.LinkByName(dev)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", errNoRoute, dev, err)
	}
	nr := &netlink.Route{
		LinkIndex: l.Attrs().Index,
		Dst:       &net.IPNet{IP: net.IP(r.To.Masked().Addr().AsSlice()), Mask: net.CIDRMask(r.To.Bits(), r.To.Addr().BitLen())},
		Priority:  r.Metric,
	}
	if r.Via.IsValid() {
		nr.Gw = net.IP(r.Via.AsSlice())
	} else {
		nr.Scope = netlink.SCOPE_LINK
	}
	if r.Src.IsValid() {
		nr.Src = net.IP(r.Src.AsSlice())
	}
	return nr, nil
}

// isAbsent reports the kernel's "no such route" answer to a delete.
func isAbsent(err error) bool {
	return errors.Is(err, unix.ESRCH) || errors.Is(err, unix.ENOENT)
}
