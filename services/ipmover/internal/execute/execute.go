// Package execute is the command path, written once. An executor (floating
// addresses, a DNS name) provides only Admit and Apply (Executor) and its
// own configuration; a Contract consumes its commands (Consume: one at a
// time, the one in hand finished before Consume returns) and, for each:
//
//  1. acknowledges a command already applied as a duplicate, whatever its
//     epoch or deadline now (the arbiter must learn it was carried out);
//  2. refuses a command past its deadline;
//  3. refuses an epoch that is not a lease term that exists (Terms): a
//     stranger cannot make an executor believe in a term nobody holds;
//  4. refuses an epoch older than the newest one recorded;
//  5. refuses a command this executor may never carry out (Executor.Admit:
//     its group, node and addresses against the executor's own
//     configuration);
//  6. only then records the command and its epoch, durably, before acting:
//     at most once, even across a crash half-way;
//  7. applies it and always publishes a CommandResult caused by the
//     command, with the step timeline and the cause of any refusal.
//
// Nothing a refused command carries is ever recorded: a forged or stale
// command cannot raise the epoch that fences every later one.
package execute

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/services/ipmover/internal/fence"
)

// The contract's own steps (named in events), in every applied command's
// result before the executor's: received; the epoch found to be a lease
// term (a read of the lease's records at a term's first command, else the
// cache); the command recorded on disk (an fdatasync). A slow failover
// shows here whether the time went to the bus, to the disk or to the
// executor.
const (
	StepReceived    = events.StepReceived
	StepTermChecked = events.StepTermChecked
	StepRecorded    = events.StepRecorded
)

// ErrNotAllowed refuses a command outside the executor's own configuration
// (a group, node or address it may never hold).
var ErrNotAllowed = errors.New("not allowed by this executor's configuration")

// Executor is what one kind of executor provides; the Contract does the rest.
type Executor interface {
	// Admit decides, before anything is recorded, whether this executor
	// may carry cmd out at all. It returns the addresses the command may
	// put on the node, recorded with it so that a release without the bus
	// knows them. An error (wrapping ErrNotAllowed) refuses the command.
	Admit(cmd events.Command) (managed []string, err error)
	// Apply carries out an admitted, recorded command, noting its steps.
	Apply(ctx context.Context, env events.Envelope, cmd events.Command, tl *Timeline) error
}

// Terms checks that epoch is a lease term that exists, for a command stored
// at seq in the command stream. An error wrapping ErrNoTerm refuses it.
type Terms interface {
	Check(ctx context.Context, epoch, seq uint64) error
}

// Publisher publishes results (*bus.Bus).
type Publisher interface {
	Emit(ctx context.Context, p events.Payload, opts ...events.Option) (events.Envelope, error)
}

// Config assembles a Contract.
type Config struct {
	Fence    *fence.Store
	Terms    Terms
	Executor Executor
	// Publisher may be nil (no bus): results are then only logged.
	Publisher Publisher
	// Node names this executor in results; empty means the command's own
	// target node (an executor serving several sites).
	Node   string
	Logger *slog.Logger
	// Observe, when set, receives every step's time since reception.
	Observe func(step string, elapsed time.Duration)
	// Count, when set, counts every command by type and outcome; Refused
	// counts refusals by reason (not_allowed, no_term).
	Count   func(t events.Type, o events.Outcome)
	Refused func(reason string)
	// Finish bounds how long the command in hand may still run once
	// Consume is asked to stop (DefaultFinish when zero).
	Finish time.Duration
}

// DefaultFinish lets the command in hand finish on stop: a claim's answer
// and verification take a few seconds at most.
const DefaultFinish = 5 * time.Second

// Contract applies commands under the rules in the package comment. Its
// Handle is safe for concurrent use: commands are handled one at a time,
// because they share the fencing state.
type Contract struct {
	cfg Config
	mu  sync.Mutex
}

// New returns a Contract; Fence, Terms and Executor are required.
func New(cfg Config) *Contract {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Finish <= 0 {
		cfg.Finish = DefaultFinish
	}
	return &Contract{cfg: cfg}
}

// Timeline records the timed steps of one command.
type Timeline struct {
	received time.Time
	steps    []events.Step
	observe  func(string, time.Duration)
	calls    *events.CallsAdoption
	dns      []events.DNSServerState
}

func newTimeline(received time.Time, observe func(string, time.Duration)) *Timeline {
	return &Timeline{received: received, steps: []events.Step{{Name: StepReceived, At: received}}, observe: observe}
}

// At notes that step name happened at at.
func (t *Timeline) At(name string, at time.Time) {
	el := at.Sub(t.received)
	t.steps = append(t.steps, events.Step{Name: name, At: at, ElapsedMS: float64(el.Microseconds()) / 1000})
	if t.observe != nil {
		t.observe(name, el)
	}
}

// Steps returns the steps so far.
func (t *Timeline) Steps() []events.Step { return t.steps }

// SetCalls records what a claim did with its group's calls in progress,
// for the command's result (events.CommandResult.Calls).
func (t *Timeline) SetCalls(c events.CallsAdoption) { t.calls = &c }

// SetDNS records what each authoritative server serves after a DNS
// executor's command, for the command's result (events.CommandResult.DNS).
func (t *Timeline) SetDNS(states []events.DNSServerState) { t.dns = states }

// Reason labels of Config.Refused.
const (
	RefusedNoTerm      = "no_term"
	RefusedNotAllowed  = "not_allowed"
	RefusedFarDeadline = "far_deadline"
)

// Handle applies one command at most once and always reports what happened
// to it. seq is the command's sequence in the command stream.
func (c *Contract) Handle(ctx context.Context, env events.Envelope, cmd events.Command, seq uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	received := time.Now()
	tl := newTimeline(received, c.cfg.Observe)
	group, node := cmd.Target()
	log := c.cfg.Logger.With("event_id", env.ID, "type", env.Type, "epoch", env.Epoch, "seq", seq, "group", group, "target", node)

	outcome, err, termOK := c.decide(ctx, env, cmd, seq, received, tl)
	if c.cfg.Count != nil {
		c.cfg.Count(env.Type, outcome)
	}
	resNode := c.cfg.Node
	if resNode == "" {
		resNode = node
	}
	res := events.CommandResult{CommandID: env.ID, CommandType: env.Type, Node: resNode, Group: group, Outcome: outcome, Steps: tl.steps,
		Calls: tl.calls, DNS: tl.dns}
	if err != nil {
		res.Error = err.Error()
		log.Warn("command not applied", "outcome", outcome, "err", err)
	} else {
		log.Info("command done", "outcome", outcome, "elapsed_ms", tl.steps[len(tl.steps)-1].ElapsedMS)
	}
	if c.cfg.Publisher == nil {
		return
	}
	opts := []events.Option{events.CausedBy(env)}
	if termOK {
		// A refused epoch is not repeated into the trail as if it were one.
		opts = append(opts, events.WithEpoch(env.Epoch))
	}
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if _, err := c.cfg.Publisher.Emit(pctx, res, opts...); err != nil {
		log.Error("publish command result failed", "err", err)
	}
}

// decide runs the contract's checks in order, then records and applies.
// termOK reports whether the epoch was found to be a lease term.
func (c *Contract) decide(ctx context.Context, env events.Envelope, cmd events.Command, seq uint64, received time.Time, tl *Timeline) (_ events.Outcome, _ error, termOK bool) {
	v := c.cfg.Fence.Check(env.ID, env.Epoch, cmd.Deadline(), received)
	switch v {
	case fence.Duplicate:
		return events.OutcomeDuplicate, nil, true
	case fence.Expired:
		return events.OutcomeExpired, fmt.Errorf("deadline %s passed %v ago", cmd.Deadline().Format(time.RFC3339Nano), received.Sub(cmd.Deadline())), false
	}
	if reach := cmd.Deadline().Sub(received); reach > events.MaxCommandReach {
		c.refused(RefusedFarDeadline)
		return events.OutcomeFailed, fmt.Errorf("deadline %s lies %v ahead, beyond the %v any arbiter sets",
			cmd.Deadline().Format(time.RFC3339Nano), reach.Round(time.Second), events.MaxCommandReach), false
	}
	// Reads that fail are retried, but not past the command's own deadline:
	// by then it is expired whatever the answer.
	tctx, cancel := context.WithDeadline(ctx, cmd.Deadline())
	err := c.cfg.Terms.Check(tctx, env.Epoch, seq)
	cancel()
	if err != nil {
		c.refused(RefusedNoTerm)
		return events.OutcomeStaleEpoch, err, false
	}
	tl.At(StepTermChecked, time.Now())
	if v == fence.StaleEpoch {
		recorded := c.cfg.Fence.Snapshot().MaxEpoch
		if recorded < seq {
			return events.OutcomeStaleEpoch, fmt.Errorf("epoch %d is older than epoch %d already seen", env.Epoch, recorded), true
		}
		// The recorded epoch is not below this command's sequence, so it
		// cannot be a term of this stream: it was recorded before epochs
		// were checked (a forgery), or the stream was re-created. Keeping
		// it would refuse every legitimate command for ever.
		if err := c.cfg.Fence.ForgetEpoch(); err != nil {
			return events.OutcomeFailed, fmt.Errorf("forget impossible epoch %d: %w", recorded, err), true
		}
		c.cfg.Logger.Warn("recorded epoch is no term of the command stream; forgot it", "recorded_epoch", recorded,
			"epoch", env.Epoch, "seq", seq)
	}
	managed, err := c.cfg.Executor.Admit(cmd)
	if err != nil {
		c.refused(RefusedNotAllowed)
		return events.OutcomeFailed, err, true
	}
	// Record before acting: at most once, even if we crash half-way.
	if err := c.cfg.Fence.Record(env.ID, env.Epoch, managed...); err != nil {
		return events.OutcomeFailed, fmt.Errorf("persist command record: %w", err), true
	}
	tl.At(StepRecorded, time.Now())
	if err := c.cfg.Executor.Apply(ctx, env, cmd, tl); err != nil {
		return events.OutcomeFailed, err, true
	}
	return events.OutcomeApplied, nil, true
}

func (c *Contract) refused(reason string) {
	if c.cfg.Refused != nil {
		c.cfg.Refused(reason)
	}
}
