package doctor

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/fanpbx/fan/pkg/sipoptions"
)

// sipAsk sends SIP OPTIONS to addr as the prober's SIP checks do and returns
// the status of the answer. Any final answer proves a live SIP stack: an
// Asterisk answers an OPTIONS from an address it has no endpoint for with
// 401 (docs/asterisk22.md).
func sipAsk(ctx context.Context, addr, transport string, within time.Duration) (int, error) {
	o := sipoptions.Options{Transport: sipoptions.UDP, T1: 200 * time.Millisecond, FailFast: true}
	if transport == "tcp" {
		o.Transport = sipoptions.TCP
	}
	p, err := sipoptions.NewPingerWith(addr, o)
	if err != nil {
		return 0, err
	}
	defer p.Close()
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	reply, err := p.Ping(ctx)
	if err != nil {
		return 0, err
	}
	return reply.Status, nil
}

// sipFailure says how an OPTIONS went unanswered.
func sipFailure(err error) string {
	var ne net.Error
	switch {
	case errors.Is(err, sipoptions.ErrRefused):
		return "refused (nothing listens on the port: ICMP port unreachable)"
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return "no answer (dropped on the way, or nothing answers there)"
	}
	return err.Error()
}

// checkSelfSIP: the address each of the prober's own SIP checks asks is
// answered, so the check can come up; a transport bound to the node's own
// address does that on every node, the one holding the floating address or
// not.
func (r *run) checkSelfSIP(ctx context.Context) {
	p := r.files.prober
	if p == nil {
		return
	}
	for i, c := range p.Checks {
		if c.Kind != "sip" || c.role() != "self" {
			continue
		}
		subject := fmt.Sprintf("prober.yaml checks[%d] %s %s", i, c.Name, c.Address)
		status, err := sipAsk(ctx, c.Address, c.Transport, r.o.Step)
		if err != nil {
			fix := fmt.Sprintf("bind a PJSIP transport to %s (deploy/asterisk/pjsip.conf, transport-node) and restart Asterisk, or point the check at the address one is bound to", c.Address)
			if ap, perr := netip.ParseAddrPort(c.Address); perr == nil && !r.hostHas(ap.Addr()) {
				fix = fmt.Sprintf("%s is not an address of this host: a self check asks this node's own address", ap.Addr())
			}
			r.out.addf(Error, "sip.self", subject, fix,
				"SIP OPTIONS %s: the prober's check stays down, so this node is never healthy and never gets the floating address", sipFailure(err))
			continue
		}
		r.out.addf(OK, "sip.self", subject, "", "answered %d", status)
	}
}
