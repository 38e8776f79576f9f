// Package check runs single health checks. A check answers one question with
// a deadline; hysteresis, quorum and scheduling live elsewhere.
package check

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/fanpbx/fan/pkg/ami"
	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/sipoptions"
)

// Result is one run of a check.
type Result struct {
	OK       bool
	At       time.Time
	Duration time.Duration
	Err      error
	Class    events.ErrorClass
	// Figures are numbers the check learned (active channels, calls, status).
	Figures map[string]float64
	// SystemName is the PBX's systemname (AMI CoreSettings), when the check
	// knows it: an AMI check asks once per session.
	SystemName *string
	// NoVerdict says the run could not tell yet (an AMI login still in
	// flight that may be Asterisk's one-second wait before "Authentication
	// failed"). It is neither a success nor a failure and must not feed
	// hysteresis. It is bounded: the login has its own deadline.
	NoVerdict bool
}

// Checker is one configured check.
type Checker interface {
	Kind() string
	Target() string
	// Run must return by ctx's deadline.
	Run(ctx context.Context) Result
	Close() error
}

// ErrUnhealthy is a peer that answered, with an answer that means "not
// healthy" (an HTTP 500, a SIP 503, a DNS SERVFAIL, a non-zero exit).
var ErrUnhealthy = errors.New("unhealthy answer")

// ErrProtocol is a peer that answered something that is not the protocol.
var ErrProtocol = errors.New("protocol error")

// classify maps an error to the class a result reports. Timeouts must be told
// apart from refusals and from wrong answers: they mean different failures.
func classify(err error) events.ErrorClass {
	switch {
	case err == nil:
		return ""
	case errors.Is(err, ErrUnhealthy):
		return events.ErrorUnhealth
	case errors.Is(err, ErrProtocol):
		return events.ErrorProtocol
	case errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, sipoptions.ErrRefused):
		return events.ErrorRefused
	}
	var ne net.Error
	if errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()) {
		return events.ErrorTimeout
	}
	return ami.Classify(err)
}

// finish fills the common fields of a result.
func finish(start time.Time, err error) Result {
	r := Result{At: start, Duration: time.Since(start), OK: err == nil, Err: err}
	if err != nil {
		r.Class = classify(err)
	}
	return r
}

// Codes is a set of status codes, written as "200", "2xx" or "200-399".
type Codes []codeRange

type codeRange struct{ lo, hi int }

// ParseCodes reads a list like ["2xx", "401", "400-499"].
func ParseCodes(specs []string) (Codes, error) {
	var cs Codes
	for _, s := range specs {
		s = strings.TrimSpace(s)
		var r codeRange
		switch {
		case len(s) == 3 && strings.HasSuffix(strings.ToLower(s), "xx") && s[0] >= '1' && s[0] <= '6':
			r.lo = int(s[0]-'0') * 100
			r.hi = r.lo + 99
		case strings.Contains(s, "-"):
			a, b, _ := strings.Cut(s, "-")
			lo, err1 := strconv.Atoi(strings.TrimSpace(a))
			hi, err2 := strconv.Atoi(strings.TrimSpace(b))
			if err1 != nil || err2 != nil || lo > hi {
				return nil, fmt.Errorf("status code range %q: want LOW-HIGH", s)
			}
			r = codeRange{lo, hi}
		default:
			n, err := strconv.Atoi(s)
			if err != nil {
				return nil, fmt.Errorf("status code %q: want NNN, Nxx or LOW-HIGH", s)
			}
			r = codeRange{n, n}
		}
		if r.lo < 100 || r.hi > 699 {
			return nil, fmt.Errorf("status code %q: outside 100-699", s)
		}
		cs = append(cs, r)
	}
	return cs, nil
}

// Has reports whether code is in the set.
func (cs Codes) Has(code int) bool {
	for _, r := range cs {
		if code >= r.lo && code <= r.hi {
			return true
		}
	}
	return false
}
