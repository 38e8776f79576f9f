// Package executetest is the executor contract's test suite: every executor
// runs it against its real back end, so the rules of package execute hold
// for each of them, not only for the code that implements them once.
package executetest

import (
	"math"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/waittest"
	"github.com/fanpbx/fan/services/ipmover/internal/execute"
	"github.com/fanpbx/fan/services/ipmover/internal/fence"
)

// Cluster is the cluster name the suite's bus uses.
const Cluster = "lab"

// Subject is one executor under test.
type Subject struct {
	// Node is the node whose command consumer the executor reads.
	Node string
	// Admitted returns a command the executor carries out (addressed to
	// Node), valid until notAfter.
	Admitted func(notAfter time.Time) events.Command
	// NotAllowed returns a command addressed to Node for a group or an
	// address outside the executor's configuration.
	NotAllowed func(notAfter time.Time) events.Command
	// UnknownGroup returns a command addressed to Node for a group the
	// executor's configuration does not name.
	UnknownGroup func(notAfter time.Time) events.Command
	// Start runs the executor on the bus at url, with its state in
	// stateFile, until stop is called (stop waits for it to end). Start
	// is called again with the same file to play a restart.
	Start func(t *testing.T, url, stateFile string) (stop func())
	// Effect, when set, reports whether the back end shows what Admitted
	// commands do. The back end must start without it: the suite then
	// checks it after every applied command, and its absence after every
	// refusal.
	Effect func(t *testing.T) bool
	// Undo, when set with Effect, takes that effect off the back end by
	// hand, so the suite can see that a duplicate does not act again.
	Undo func(t *testing.T)
}

// Run runs the contract suite; newSubject is called once per case.
func Run(t *testing.T, newSubject func(t *testing.T) Subject) {
	cases := []struct {
		name string
		run  func(*env)
	}{
		{"AppliedOnceAcrossRestart", appliedOnceAcrossRestart},
		{"OlderTermRefused", olderTermRefused},
		{"PassedDeadlineRefused", passedDeadlineRefused},
		{"FarDeadlineRefusedAndNotRecorded", farDeadlineRefused},
		{"NotAllowedRefusedAndNotRecorded", notAllowedRefused},
		{"UnknownGroupRefusedAndNotRecorded", unknownGroupRefused},
		{"ForgedEpochsRefusedAndNotRecorded", forgedEpochsRefused},
		{"ForgedHugeEpochDoesNotBlockTheLeaseHolder", hugeEpochDoesNotBlock},
		{"PoisonedStateFileHeals", poisonedStateHeals},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, newSubject(t))
			c.run(e)
		})
	}
}

type env struct {
	*Arbiter
	t     *testing.T
	sub   Subject
	state string
	stop  func()
	// since is how many events were recorded when a result was last
	// forgotten: result looks only after it.
	since int
}

func newEnv(t *testing.T, sub Subject) *env {
	e := &env{Arbiter: NewArbiter(t), t: t, sub: sub, state: filepath.Join(t.TempDir(), "state.json")}
	e.start()
	t.Cleanup(func() {
		if e.stop != nil {
			e.stop()
		}
	})
	return e
}

func (e *env) start() {
	e.stop = sync.OnceFunc(e.sub.Start(e.t, e.URL(), e.state))
}

func (e *env) restart() {
	e.stop()
	e.stop = nil
	e.start()
}

// startTerm publishes a lease record starting a term, as the arbiter does
// when it acquires the lease.
func (e *env) startTerm() uint64 { return e.StartTerm() }

// forget makes result wait for results recorded from now on.
func (e *env) forget() {
	evs, _ := e.Events()
	e.since = len(evs)
}

// send publishes cmd under epoch as anyone with access to the command
// subject could (no lease condition), and returns its envelope and sequence.
func (e *env) send(epoch uint64, cmd events.Command) (events.Envelope, uint64) {
	e.t.Helper()
	env, err := events.New(e.Ctl.Source(), Cluster, cmd, events.WithEpoch(1))
	if err != nil {
		e.t.Fatal(err)
	}
	env.Epoch = epoch // even 0, which events.New would refuse: a forger is not bound by it
	data, err := env.Encode()
	if err != nil {
		e.t.Fatal(err)
	}
	ack, err := e.Ctl.JS.Publish(e.t.Context(), events.Subject(env, cmd), data, jetstream.WithMsgID(env.ID))
	if err != nil {
		e.t.Fatal(err)
	}
	return env, ack.Sequence
}

func (e *env) result(env events.Envelope) events.CommandResult {
	e.t.Helper()
	var result events.CommandResult
	waittest.Until(e.t, 20*time.Second, "a result for command "+env.ID, func() bool {
		evs, pays := e.Events()
		for i := e.since; i < len(evs); i++ {
			r, ok := pays[i].(*events.CommandResult)
			if !ok || r.CommandID != env.ID {
				continue
			}
			if evs[i].CausationID != env.ID {
				e.t.Fatalf("the result of command %s is caused by %q", env.ID, evs[i].CausationID)
			}
			result = *r
			return true
		}
		return false
	})
	return result
}

func (e *env) expect(env events.Envelope, want events.Outcome) events.CommandResult {
	e.t.Helper()
	r := e.result(env)
	if r.Outcome != want {
		e.t.Fatalf("command %s: outcome %s (%s), want %s", env.Type, r.Outcome, r.Error, want)
	}
	if want != events.OutcomeApplied && want != events.OutcomeDuplicate && r.Error == "" {
		e.t.Fatalf("command %s refused (%s) without a cause", env.Type, r.Outcome)
	}
	return r
}

// recorded is the epoch the executor's state file holds.
func (e *env) recorded() uint64 {
	e.t.Helper()
	st, err := fence.Open(e.state, 0)
	if err != nil {
		e.t.Fatal(err)
	}
	return st.Snapshot().MaxEpoch
}

// effect checks the back end against the outcomes so far, when the subject
// can tell.
func (e *env) effect(want bool, after string) {
	e.t.Helper()
	if e.sub.Effect == nil {
		return
	}
	if got := e.sub.Effect(e.t); got != want {
		e.t.Fatalf("after %s the back end shows the admitted command's effect: %v, want %v", after, got, want)
	}
}

func (e *env) soon() time.Time { return time.Now().Add(30 * time.Second) }

func appliedOnceAcrossRestart(e *env) {
	term := e.startTerm()
	cmd := e.sub.Admitted(e.soon())
	env, _ := e.send(term, cmd)
	r := e.expect(env, events.OutcomeApplied)
	// Every applied result opens with the contract's own steps, in order,
	// so a slow command shows whether the lease read or the disk took it.
	contract := []string{execute.StepReceived, execute.StepTermChecked, execute.StepRecorded}
	if names := StepNames(&r); len(names) < len(contract) || !slices.Equal(names[:len(contract)], contract) {
		e.t.Fatalf("applied result's steps %v do not open with the contract's %v", names, contract)
	}
	for i := 1; i < len(r.Steps); i++ {
		if r.Steps[i].At.Before(r.Steps[i-1].At) {
			e.t.Fatalf("steps out of time order: %+v", r.Steps)
		}
	}
	e.effect(true, "the command")
	if got := e.recorded(); got != term {
		e.t.Fatalf("recorded epoch %d, want %d", got, term)
	}
	e.restart()
	undone := e.sub.Undo != nil && e.sub.Effect != nil
	if undone {
		e.sub.Undo(e.t)
		e.effect(false, "undoing it by hand")
	}
	// The same command again (the arbiter re-publishing it after the
	// server forgot the message id): done once, acknowledged.
	e.forget()
	data, _ := env.Encode()
	if _, err := e.Ctl.JS.Publish(e.t.Context(), events.Subject(env, cmd), data); err != nil {
		e.t.Fatal(err)
	}
	e.expect(env, events.OutcomeDuplicate)
	if undone {
		// Without an undo there is nothing to tell: an executor may give
		// everything up on stop (the IP executor does) and take back only
		// what the state bucket names, which the suite does not write.
		e.effect(false, "the duplicate")
	}
}

func olderTermRefused(e *env) {
	older, newer := e.startTerm(), e.startTerm()
	env, _ := e.send(newer, e.sub.Admitted(e.soon()))
	e.expect(env, events.OutcomeApplied)
	e.effect(true, "the newer term's command")
	env, _ = e.send(older, e.sub.Admitted(e.soon()))
	e.expect(env, events.OutcomeStaleEpoch)
	if got := e.recorded(); got != newer {
		e.t.Fatalf("recorded epoch %d, want %d", got, newer)
	}
}

func passedDeadlineRefused(e *env) {
	term := e.startTerm()
	env, _ := e.send(term, e.sub.Admitted(time.Now().Add(-time.Second)))
	e.expect(env, events.OutcomeExpired)
	e.effect(false, "an expired command")
	if got := e.recorded(); got != 0 {
		e.t.Fatalf("an expired command recorded epoch %d", got)
	}
}

func farDeadlineRefused(e *env) {
	term := e.startTerm()
	env, _ := e.send(term, e.sub.Admitted(time.Now().Add(events.MaxCommandReach+time.Hour)))
	r := e.expect(env, events.OutcomeFailed)
	if !strings.Contains(r.Error, "ahead") {
		e.t.Fatalf("a command with a deadline an hour past any arbiter's refused with %q, which does not say why", r.Error)
	}
	if got := e.recorded(); got != 0 {
		e.t.Fatalf("a command with a far deadline recorded epoch %d", got)
	}
}

func notAllowedRefused(e *env) {
	term := e.startTerm()
	env, _ := e.send(term, e.sub.NotAllowed(e.soon()))
	e.expect(env, events.OutcomeFailed)
	e.effect(false, "a command outside the configuration")
	if got := e.recorded(); got != 0 {
		e.t.Fatalf("a command outside the configuration recorded epoch %d", got)
	}
}

func unknownGroupRefused(e *env) {
	term := e.startTerm()
	cmd := e.sub.UnknownGroup(e.soon())
	group, _ := cmd.Target()
	env, _ := e.send(term, cmd)
	r := e.expect(env, events.OutcomeFailed)
	e.effect(false, "a command for an unknown group")
	if !strings.Contains(r.Error, group) {
		e.t.Fatalf("a command for unknown group %s refused with %q, which does not name it", group, r.Error)
	}
	if got := e.recorded(); got != 0 {
		e.t.Fatalf("a command for an unknown group recorded epoch %d", got)
	}
}

func forgedEpochsRefused(e *env) {
	e.startTerm()
	// A command's sequence is not a term; nor is the sequence the command
	// itself will get, or anything above. (Epoch 0 never decodes as a
	// command: the bus drops it before any executor sees it.)
	_, last := e.send(1, e.sub.Admitted(time.Now().Add(-time.Hour))) // expired filler: only its sequence matters
	for _, c := range []struct {
		name  string
		epoch func(last uint64) uint64
	}{
		{"a command's sequence", func(last uint64) uint64 { return last }},
		{"its own sequence", func(last uint64) uint64 { return last + 1 }},
		{"beyond the stream", func(last uint64) uint64 { return last + 1000 }},
		{"2^64-1", func(uint64) uint64 { return math.MaxUint64 }},
	} {
		env, seq := e.send(c.epoch(last), e.sub.Admitted(e.soon()))
		r := e.expect(env, events.OutcomeStaleEpoch)
		e.t.Logf("%s (epoch %d at seq %d): %s", c.name, env.Epoch, seq, r.Error)
		last = seq
	}
	e.effect(false, "forged epochs")
	if got := e.recorded(); got != 0 {
		e.t.Fatalf("forged epochs recorded epoch %d", got)
	}
}

func hugeEpochDoesNotBlock(e *env) {
	e.startTerm()
	forged, _ := e.send(math.MaxUint64, e.sub.Admitted(e.soon()))
	e.expect(forged, events.OutcomeStaleEpoch)
	e.effect(false, "a forged epoch")
	term := e.startTerm() // the real lease holder's term
	env, _ := e.send(term, e.sub.Admitted(e.soon()))
	e.expect(env, events.OutcomeApplied)
	e.effect(true, "the lease holder's command")
	e.restart()
	env, _ = e.send(term, e.sub.Admitted(e.soon()))
	e.expect(env, events.OutcomeApplied)
}

func poisonedStateHeals(e *env) {
	// A state file that recorded 2^64-1 before epochs were checked.
	e.stop()
	e.stop = nil
	st, err := fence.Open(e.state, 0)
	if err != nil {
		e.t.Fatal(err)
	}
	if err := st.Record("0193a1b2-0000-7000-8000-00000000dead", math.MaxUint64); err != nil {
		e.t.Fatal(err)
	}
	e.start()
	term := e.startTerm()
	env, _ := e.send(term, e.sub.Admitted(e.soon()))
	e.expect(env, events.OutcomeApplied)
	e.effect(true, "the command after healing")
	if got := e.recorded(); got != term {
		e.t.Fatalf("recorded epoch %d after healing, want %d", got, term)
	}
}
