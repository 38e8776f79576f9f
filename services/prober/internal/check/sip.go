package check

import (
	"context"
	"fmt"
	"time"

	"github.com/fanpbx/fan/pkg/sipoptions"
)

// DefaultSIPCodes are the final responses that mean "a live SIP stack
// answered": anything outside 5xx. Asterisk answers an unknown source with
// 401 and an unknown user with 404 (docs/asterisk22.md); both are alive. 503
// is what it says while shutting down.
var DefaultSIPCodes = []string{"2xx", "3xx", "4xx", "6xx"}

// SIP sends SIP OPTIONS over UDP (retransmitted) or TCP (one kept
// connection) and judges the final response by its status code.
type SIP struct {
	p     *sipoptions.Pinger
	codes Codes
}

// NewSIP makes the check; over UDP the socket is opened now, over TCP the
// connection is dialed on the first run.
func NewSIP(target string, o sipoptions.Options, codes Codes) (*SIP, error) {
	p, err := sipoptions.NewPingerWith(target, o)
	if err != nil {
		return nil, fmt.Errorf("sip check: %w", err)
	}
	return &SIP{p: p, codes: codes}, nil
}

func (s *SIP) Kind() string   { return "sip" }
func (s *SIP) Target() string { return string(s.p.Transport()) + ":" + s.p.Target().String() }

func (s *SIP) Run(ctx context.Context) Result {
	start := time.Now()
	rep, err := s.p.Ping(ctx)
	if err == nil && !s.codes.Has(rep.Status) {
		err = fmt.Errorf("sip: %d %s: %w", rep.Status, rep.Reason, ErrUnhealthy)
	}
	r := finish(start, err)
	if rep.Status != 0 {
		r.Figures = map[string]float64{"sip_status": float64(rep.Status), "sip_sent": float64(rep.Sent)}
	}
	return r
}

func (s *SIP) Close() error { return s.p.Close() }
