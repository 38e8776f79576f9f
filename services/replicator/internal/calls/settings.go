package calls

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/fanpbx/fan/pkg/ami"
	"github.com/fanpbx/fan/pkg/ami/pjsip"
	"github.com/fanpbx/fan/pkg/events"
)

// The settings of this node's Asterisk that keep a call from surviving a
// failover, read after each reconcile and reported in the summary, so
// that fanctl status and the status page warn about the holder from afar:
// endpoints that negotiate session timers (a carried call ends at its
// first refresh), transports that make dialogs on the floating address
// carry the node's own address in their Contact (the phones' in-dialog
// requests go to the dead node), and transports that rewrite the media
// address (direct-media calls get no audio). fanctl doctor judges the
// same settings on the host, with the same code (pkg/ami/pjsip).

const (
	// settingsTimeout bounds one read of the settings; endpointBudget and
	// endpointMax the endpoints read in detail within it, one action each
	// (a PBX with thousands gets the first ones read every reconcile).
	settingsTimeout = 5 * time.Second
	endpointBudget  = 2 * time.Second
	endpointMax     = 1000
)

// settings are the last settings read; nil endpoints or transports were
// never read, or Asterisk refused to say.
type settings struct {
	endpoints  *pjsip.Endpoints
	transports []pjsip.Transport
	// transportsRead: transports is what Asterisk listed (maybe none).
	transportsRead bool
	// failed remembers the last failure of each read, so that it is
	// logged once, not at every reconcile.
	failed map[string]string
}

type settingsResult struct {
	endpoints    pjsip.Endpoints
	endpointsErr error
	transports   []pjsip.Transport
	transportErr error
}

func readSettings(ctx context.Context, a Actioner) settingsResult {
	ctx, cancel := context.WithTimeout(ctx, settingsTimeout)
	defer cancel()
	act := func(name string, f ...ami.Field) (ami.Response, error) { return a.Action(ctx, name, f...) }
	var res settingsResult
	res.transports, res.transportErr = pjsip.ReadTransports(act)
	res.endpoints, res.endpointsErr = pjsip.ReadEndpoints(ctx, act, endpointBudget, endpointMax)
	return res
}

func (r *Recorder) startSettings(ctx context.Context) {
	if !r.settingsDue || r.settingsReading || !r.current {
		return
	}
	r.settingsDue, r.settingsReading = false, true
	r.spawn(func() { send(ctx, r.settingsCh, readSettings(ctx, r.cfg.AMI)) })
}

// onSettings keeps what was read. A read Asterisk refused forgets the
// last one (the user may not run it now: nothing is known); one it did
// not answer keeps it (a busy moment says nothing of the settings).
func (r *Recorder) onSettings(res settingsResult) {
	r.settingsReading = false
	st := &r.settings
	switch {
	case res.endpointsErr == nil:
		eps := res.endpoints
		st.endpoints = &eps
	case errors.Is(res.endpointsErr, pjsip.ErrRefused):
		st.endpoints = nil
	}
	switch {
	case res.transportErr == nil:
		st.transports, st.transportsRead = res.transports, true
	case errors.Is(res.transportErr, pjsip.ErrRefused):
		st.transports, st.transportsRead = nil, false
	}
	if st.failed == nil {
		st.failed = map[string]string{}
	}
	for what, err := range map[string]error{"endpoints": res.endpointsErr, "transports": res.transportErr} {
		msg := ""
		if err != nil {
			msg = err.Error()
		}
		if msg != "" && st.failed[what] == "" {
			r.log.Warn("reading Asterisk's PJSIP settings failed: the calls summary does not report them", "what", what, "err", err)
		}
		st.failed[what] = msg
	}
}

// addSettings reports the settings last read in s.
func (r *Recorder) addSettings(s *events.CallsSummary) {
	st := r.settings
	if e := st.endpoints; e != nil {
		n := len(e.Timers)
		s.TimersEndpoints = &n
		for _, t := range e.Timers {
			if len(s.TimersSample) == events.MaxCallsSample {
				break
			}
			if fit(t.Name) {
				s.TimersSample = append(s.TimersSample, t.Name)
			}
		}
	}
	if !st.transportsRead {
		return
	}
	s.TransportsRead = true
	s.MediaAddressRewritten = names(pjsip.MediaRewriters(st.transports))
	s.ContactNodeAddress = names(contactCulprits(st.transports, r.role.Addresses))
}

// contactCulprits are the transports that make dialogs on any of the
// group's floating addresses carry the node's own address in their
// Contact. The port on each is that of a UDP transport bound to it (the
// replicator does not read the ipmover's sip_port), else 5060.
func contactCulprits(ts []pjsip.Transport, addresses []string) []string {
	var out []string
	for _, a := range addresses {
		p, err := netip.ParsePrefix(a)
		if err != nil {
			continue
		}
		fl, ok := pjsip.Floating(p)
		if !ok {
			continue
		}
		ok, culprits, _ := pjsip.ContactVerdict(ts, netip.AddrPortFrom(fl, pjsip.FloatingPort(ts, fl)))
		if ok {
			continue
		}
		// No culprit: nothing answers there at all, which the
		// prober's SIP check reports; it is not a Contact to warn of.
		for _, c := range culprits {
			if !slices.Contains(out, c) {
				out = append(out, c)
			}
		}
	}
	return out
}

// names keeps the ids a summary may carry, within its bound.
func names(ids []string) []string {
	var out []string
	for _, id := range ids {
		if fit(id) && len(out) < events.MaxListLen {
			out = append(out, id)
		}
	}
	return out
}

// fit says whether an Asterisk object id may go in a summary as it is.
func fit(id string) bool {
	return id != "" && len(id) <= events.MaxShortLen && !strings.ContainsAny(id, "\r\n\x00")
}
