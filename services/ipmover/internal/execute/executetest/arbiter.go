package executetest

import (
	"context"
	"encoding/json"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/bus/bustest"
	"github.com/fanpbx/fan/pkg/platform/waittest"
)

// Terms is how many lease terms an Arbiter starts before anything else,
// so the tests' epochs 1..Terms are terms that exist (the first records of
// a fresh command stream have sequences 1, 2, ...).
const Terms = 10

// Arbiter is a JetStream server and a test client playing the arbiter for
// executor tests: it starts lease terms, writes the state bucket, publishes
// commands (fenced, or forged as anyone with access to the subject could),
// and records every event of the cluster.
type Arbiter struct {
	T   *testing.T
	Srv *server.Server
	Ctl *bus.Bus
	// Dir is a directory removed with the test, for state files and configs.
	Dir string

	mu    sync.Mutex
	evs   []events.Envelope
	pays  []events.Payload
	terms []uint64
}

// NewArbiter starts the server, Terms lease terms, and the recording.
func NewArbiter(t *testing.T) *Arbiter {
	t.Helper()
	srv := bustest.Server(t)
	a := &Arbiter{T: t, Srv: srv, Dir: t.TempDir()}
	a.Ctl = bustest.Connect(t, srv, bus.Identity{Cluster: Cluster, Service: "arbiter", Node: "ctl"})
	for i := range Terms {
		if term := a.StartTerm(); term != uint64(i+1) {
			t.Fatalf("lease record %d stored at sequence %d: the command stream is not fresh", i+1, term)
		}
		a.terms = append(a.terms, uint64(i+1))
	}
	ctx, cancel := context.WithCancel(context.Background())
	watching := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		close(watching)
		_ = a.Ctl.Watch(ctx, bus.WatchOptions{Subjects: []string{events.ClusterEvents(Cluster)}, All: true},
			func(env events.Envelope, p events.Decoded, _ uint64) {
				a.mu.Lock()
				a.evs, a.pays = append(a.evs, env), append(a.pays, p)
				a.mu.Unlock()
			})
	}()
	<-watching
	t.Cleanup(func() { cancel(); <-done })
	return a
}

// URL is the server's client URL.
func (a *Arbiter) URL() string { return a.Srv.ClientURL() }

// Events returns what was recorded so far, in stream order.
func (a *Arbiter) Events() ([]events.Envelope, []events.Payload) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.evs), slices.Clone(a.pays)
}

// Term checks that the test's epoch n is one of the terms started, and
// returns it.
func (a *Arbiter) Term(n uint64) uint64 {
	a.T.Helper()
	if n < 1 || n > uint64(len(a.terms)) {
		a.T.Fatalf("epoch %d: the harness started terms 1..%d only", n, len(a.terms))
	}
	return a.terms[n-1]
}

// StartTerm publishes a lease record that starts a term, as the arbiter
// does when it acquires the lease, and returns the term.
func (a *Arbiter) StartTerm() uint64 {
	a.T.Helper()
	data, err := json.Marshal(events.LeaseRecord{Holder: "ctl", At: time.Now()})
	if err != nil {
		a.T.Fatal(err)
	}
	ack, err := a.Ctl.JS.Publish(a.T.Context(), events.LeaseSubject(Cluster, events.ArbiterLease), data)
	if err != nil {
		a.T.Fatal(err)
	}
	return ack.Sequence
}

// LastSeq is the command stream's last sequence.
func (a *Arbiter) LastSeq() uint64 {
	a.T.Helper()
	st, err := a.Ctl.JS.Stream(a.T.Context(), bus.CommandsStream)
	if err != nil {
		a.T.Fatal(err)
	}
	return st.CachedInfo().State.LastSeq
}

// Send publishes cmd under epoch as the arbiter does.
func (a *Arbiter) Send(epoch uint64, cmd events.Command) events.Envelope {
	a.T.Helper()
	env, err := events.New(a.Ctl.Source(), Cluster, cmd, events.WithEpoch(epoch))
	if err != nil {
		a.T.Fatal(err)
	}
	if err := a.Ctl.Publish(a.T.Context(), env, cmd); err != nil {
		a.T.Fatal(err)
	}
	return env
}

// SendRaw publishes cmd with any epoch at all, as a stranger could.
func (a *Arbiter) SendRaw(epoch uint64, cmd events.Command) events.Envelope {
	a.T.Helper()
	env, err := events.New(a.Ctl.Source(), Cluster, cmd, events.WithEpoch(1))
	if err != nil {
		a.T.Fatal(err)
	}
	env.Epoch = epoch
	data, err := env.Encode()
	if err != nil {
		a.T.Fatal(err)
	}
	if _, err := a.Ctl.JS.Publish(a.T.Context(), events.Subject(env, cmd), data); err != nil {
		a.T.Fatal(err)
	}
	return env
}

// WaitEvent waits for the first recorded event that matches.
func (a *Arbiter) WaitEvent(what string, match func(events.Envelope, events.Payload) bool) (events.Envelope, events.Payload) {
	a.T.Helper()
	var env events.Envelope
	var p events.Payload
	waittest.Until(a.T, 15*time.Second, what, func() bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		for i := range a.evs {
			if match(a.evs[i], a.pays[i]) {
				env, p = a.evs[i], a.pays[i]
				return true
			}
		}
		return false
	})
	return env, p
}

// Result waits for the result of cmd, caused by it.
func (a *Arbiter) Result(cmd events.Envelope) *events.CommandResult {
	a.T.Helper()
	_, p := a.WaitEvent("result of "+cmd.ID, func(env events.Envelope, p events.Payload) bool {
		r, ok := p.(*events.CommandResult)
		return ok && r.CommandID == cmd.ID && env.CausationID == cmd.ID
	})
	return p.(*events.CommandResult)
}

// PutStatus writes a group's status, and the arbiter's own state when
// arbiterState is not empty, to the state bucket.
func (a *Arbiter) PutStatus(gs events.GroupStatus, arbiterState string) {
	a.T.Helper()
	kv, err := a.Ctl.StateKV(a.T.Context())
	if err != nil {
		a.T.Fatal(err)
	}
	b, _ := json.Marshal(gs)
	if _, err := kv.Put(a.T.Context(), events.GroupStatusKey(Cluster, gs.Group), b); err != nil {
		a.T.Fatal(err)
	}
	if arbiterState != "" {
		if _, err := kv.Put(a.T.Context(), events.ArbiterStateKey(Cluster), []byte(arbiterState)); err != nil {
			a.T.Fatal(err)
		}
	}
}

// PutRecord writes a node's registry record to the state bucket.
func (a *Arbiter) PutRecord(rec events.NodeRecord) {
	a.T.Helper()
	kv, err := a.Ctl.StateKV(a.T.Context())
	if err != nil {
		a.T.Fatal(err)
	}
	b, _ := json.Marshal(rec)
	if _, err := kv.Put(a.T.Context(), events.RegistryKey(Cluster, rec.Node), b); err != nil {
		a.T.Fatal(err)
	}
}

// WaitStarted waits for service's start announcement from node.
func (a *Arbiter) WaitStarted(service, node string) {
	a.T.Helper()
	a.WaitEvent(service+" on "+node+" started", func(_ events.Envelope, p events.Payload) bool {
		s, ok := p.(*events.ServiceAnnounce)
		return ok && s.Service == service && s.Node == node && s.State == events.ServiceStarted
	})
}

// StateFile is a state file path for node under Dir.
func (a *Arbiter) StateFile(node string) string { return filepath.Join(a.Dir, node+"-state.json") }

// StepNames lists a result's step names in order.
func StepNames(r *events.CommandResult) []string {
	var out []string
	for _, s := range r.Steps {
		out = append(out, s.Name)
	}
	return out
}

// StepAt is when a result's step name happened; it fails t when the
// result has no such step.
func StepAt(t testing.TB, r *events.CommandResult, name string) time.Time {
	t.Helper()
	for _, s := range r.Steps {
		if s.Name == name {
			return s.At
		}
	}
	t.Fatalf("result of %s has no step %q (steps %v)", r.CommandID, name, StepNames(r))
	return time.Time{}
}

// FormatSteps writes a result's steps as name=elapsed_ms, for test logs.
func FormatSteps(r *events.CommandResult) string {
	var b strings.Builder
	for _, s := range r.Steps {
		b.WriteString(s.Name + "=" + strconv.FormatFloat(s.ElapsedMS, 'f', -1, 64) + " ")
	}
	return b.String()
}

// Start runs a service (its Run) until the test ends or stop is called,
// and returns once the service announced its start as service on node.
// stop waits for Run to return.
func (a *Arbiter) Start(service, node string, run func(context.Context) error) (stop func()) {
	a.T.Helper()
	stop = Serve(a.T, run)
	a.WaitStarted(service, node)
	return stop
}

// Serve runs run until the test ends or stop is called; stop cancels its
// context and waits for it to return.
func Serve(t *testing.T, run func(context.Context) error) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	stop = sync.OnceFunc(func() {
		cancel()
		if err := <-done; err != nil {
			t.Logf("stopped: %v", err)
		}
	})
	t.Cleanup(stop)
	return stop
}
