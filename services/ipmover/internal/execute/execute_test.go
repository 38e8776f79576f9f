package execute_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/services/ipmover/internal/execute"
	"github.com/fanpbx/fan/services/ipmover/internal/execute/executetest"
	"github.com/fanpbx/fan/services/ipmover/internal/fence"
)

// memory is an executor whose back end is a list of what it applied: the
// contract's own rules, without a network.
type memory struct {
	mu      sync.Mutex
	applied []string
}

func (m *memory) Admit(cmd events.Command) ([]string, error) {
	if g, _ := cmd.Target(); g != "pbx" {
		return nil, fmt.Errorf("group %s: %w", g, execute.ErrNotAllowed)
	}
	return nil, nil
}

func (m *memory) Apply(_ context.Context, env events.Envelope, _ events.Command, tl *execute.Timeline) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.applied = append(m.applied, env.ID)
	tl.At("applied", time.Now())
	return nil
}

func claim(group string) func(time.Time) events.Command {
	return func(notAfter time.Time) events.Command {
		return &events.ClaimIP{Group: group, Node: "n1", Addresses: []string{"198.51.100.10/32"}, NotAfter: notAfter}
	}
}

func TestContract(t *testing.T) {
	executetest.Run(t, func(t *testing.T) executetest.Subject {
		m := &memory{}
		return executetest.Subject{
			Node: "n1", Admitted: claim("pbx"), NotAllowed: claim("other"), UnknownGroup: claim("billing"),
			Start: func(t *testing.T, url, stateFile string) func() {
				return startMemory(t, m, url, stateFile)
			},
		}
	})
}

func startMemory(t *testing.T, m *memory, url, stateFile string) func() {
	ctx, cancel := context.WithCancel(context.Background())
	b, err := bus.Connect(ctx, bus.Config{URL: url}, bus.Identity{Cluster: executetest.Cluster, Service: "ipmover", Node: "n1"}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	f, err := fence.Open(stateFile, 0)
	if err != nil {
		t.Fatal(err)
	}
	leases, err := b.LeaseRecords(ctx, events.ArbiterLease)
	if err != nil {
		t.Fatal(err)
	}
	c := execute.New(execute.Config{Fence: f, Terms: execute.NewLeaseTerms(leases), Executor: m, Publisher: b, Node: "n1"})
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = c.Consume(ctx, b, "n1")
	}()
	return func() { cancel(); <-done; b.Close() }
}

// slow is an executor whose apply waits for the test (or its context).
type slow struct {
	entered chan struct{}
	release chan struct{}
	mu      sync.Mutex
	notes   []string
}

func (s *slow) note(n string) { s.mu.Lock(); s.notes = append(s.notes, n); s.mu.Unlock() }

func (s *slow) Admit(events.Command) ([]string, error) { return nil, nil }

func (s *slow) Apply(ctx context.Context, _ events.Envelope, _ events.Command, _ *execute.Timeline) error {
	close(s.entered)
	select {
	case <-s.release:
		s.note("apply returned")
		return nil
	case <-ctx.Done():
		s.note("apply cancelled")
		return ctx.Err()
	}
}

// A stop while a command is being applied lets it finish (its context
// lives on) and publishes its result before Consume returns; past Finish
// the command in hand is cancelled, and still answered.
func TestConsumeFinishesTheCommandInHand(t *testing.T) {
	for _, tc := range []struct {
		name    string
		finish  time.Duration
		release bool
		want    events.Outcome
		notes   []string
	}{
		{"finished", time.Minute, true, events.OutcomeApplied, []string{"apply returned", "consume returned"}},
		{"bounded", 50 * time.Millisecond, false, events.OutcomeFailed, []string{"apply cancelled", "consume returned"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := executetest.NewArbiter(t)
			b, err := bus.Connect(t.Context(), bus.Config{URL: a.URL()}, bus.Identity{Cluster: executetest.Cluster, Service: "ipmover", Node: "n1"}, slog.New(slog.DiscardHandler))
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			f, err := fence.Open(t.TempDir()+"/state.json", 0)
			if err != nil {
				t.Fatal(err)
			}
			leases, err := b.LeaseRecords(t.Context(), events.ArbiterLease)
			if err != nil {
				t.Fatal(err)
			}
			x := &slow{entered: make(chan struct{}), release: make(chan struct{})}
			c := execute.New(execute.Config{Fence: f, Terms: execute.NewLeaseTerms(leases), Executor: x, Publisher: b, Node: "n1", Finish: tc.finish})
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- c.Consume(ctx, b, "n1") }()
			cmd := a.Send(a.Term(1), claim("pbx")(time.Now().Add(time.Minute)))
			<-x.entered
			cancel() // the stop, while the claim is in hand
			if tc.release {
				close(x.release)
			}
			if err := <-done; err != nil {
				t.Fatalf("Consume = %v", err)
			}
			x.note("consume returned")
			if r := a.Result(cmd); r.Outcome != tc.want {
				t.Fatalf("the command in hand at the stop: %s (%s), want %s", r.Outcome, r.Error, tc.want)
			}
			if fmt.Sprint(x.notes) != fmt.Sprint(tc.notes) {
				t.Fatalf("order %q, want %q", x.notes, tc.notes)
			}
		})
	}
}
