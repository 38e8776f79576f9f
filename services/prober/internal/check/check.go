// Package check runs single health checks against a PBX. A check answers one
// question with a deadline; hysteresis and scheduling live elsewhere.
package check

import (
	"context"
	"log/slog"
	"time"

	"github.com/fanpbx/fan/pkg/ami"
	"github.com/fanpbx/fan/pkg/events"
)

// Result is one run of a check.
type Result struct {
	OK       bool
	At       time.Time
	Duration time.Duration
	Err      error
	Class    events.ErrorClass
	// Figures are numbers the check learned (active channels, calls).
	Figures map[string]float64
}

// Checker is one configured check.
type Checker interface {
	Kind() string
	Target() string
	// Run must return by ctx's deadline.
	Run(ctx context.Context) Result
	Close() error
}

// AMI asks Asterisk `core show channels count` over one persistent AMI
// session: a question only a live Asterisk core can answer, which is what
// FAN2's seed asked. Healthy only on Response: Success with output that
// parses; anything else, or no answer before the deadline, is a failure.
type AMI struct {
	addr string
	sess *ami.Session
}

// NewAMI prepares the check; the session dials lazily and redials on failure.
func NewAMI(cfg ami.Config, log *slog.Logger) *AMI {
	return &AMI{addr: cfg.Addr, sess: ami.NewSession(cfg, log)}
}

func (a *AMI) Kind() string   { return "ami" }
func (a *AMI) Target() string { return a.addr }

func (a *AMI) Run(ctx context.Context) Result {
	start := time.Now()
	counts, err := a.sess.CoreShowChannelsCount(ctx)
	r := Result{At: start, Duration: time.Since(start)}
	if err != nil {
		r.Err, r.Class = err, ami.Classify(err)
		return r
	}
	r.OK = true
	r.Figures = map[string]float64{
		"active_channels": float64(counts.Channels),
		"active_calls":    float64(counts.Calls),
		"calls_processed": float64(counts.Processed),
	}
	return r
}

func (a *AMI) Close() error { return a.sess.Close() }
