package stack

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	"github.com/fanpbx/fan/lab/netlab"
	"github.com/fanpbx/fan/lab/phone"
	"github.com/fanpbx/fan/pkg/platform/poll"
)

// Phones of the lab: lab/phone user agents on client hosts (the lab's
// netlab.PhoneHosts), each an Endpoint of the stack's PBXs, registering
// and calling through the floating address as desk phones do.

// NewPhone starts a phone for endpoint user on host, its SIP socket on
// port of the host's address, its server the floating address's SIP port.
// tune, when set, adjusts its configuration (auto-answer, timeouts). The
// phone's sockets live in host's namespace; Close it when done (the lab's
// Close removes the namespace under it anyway).
func (s *Stack) NewPhone(host, user string, port uint16, tune func(*phone.Config)) (*phone.Phone, error) {
	for _, e := range s.opts.Endpoints {
		if e.User == user {
			return NewPhone(s.Lab, host, e, port, func(c *phone.Config) {
				c.Logger = s.opts.Log.With("host", host)
				if tune != nil {
					tune(c)
				}
			})
		}
	}
	return nil, fmt.Errorf("phone %s: not one of the stack's endpoints", user)
}

// NewPhone starts a phone for endpoint e on host of l (Stack.NewPhone).
func NewPhone(l *netlab.Lab, host string, e Endpoint, port uint16, tune func(*phone.Config)) (*phone.Phone, error) {
	h, err := l.Host(host)
	if err != nil {
		return nil, err
	}
	cfg := phone.Config{User: e.User, Password: e.Password, Server: netip.AddrPortFrom(l.FloatingIP().Addr(), netlab.SIPPort),
		Addr: netip.AddrPortFrom(h.Addr.Addr(), port)}
	if tune != nil {
		tune(&cfg)
	}
	var p *phone.Phone
	err = l.Do(host, func() error {
		var err error
		p, err = phone.New(cfg)
		return err
	})
	return p, err
}

// RegisterPhone registers p, trying again until the holder's PBX answers
// or within passes (a PBX that has just started answers late).
func RegisterPhone(ctx context.Context, p *phone.Phone, within time.Duration) error {
	// Every phone of a run asks at once; a fifth of a second apart keeps
	// their retries from flooding a PBX that is starting.
	return poll.Every(ctx, 200*time.Millisecond, within, "register "+p.User(), func() error {
		rctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		return p.Register(rctx)
	})
}
