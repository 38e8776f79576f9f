package bus_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/bus/bustest"
)

// forge publishes env, built honestly, on a subject of the forger's choice:
// what a client with publish rights on that subject can do.
func forge(t *testing.T, b *bus.Bus, subject string, env events.Envelope) {
	t.Helper()
	data, err := env.Encode()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.JS.Publish(context.Background(), subject, data); err != nil {
		t.Fatal(err)
	}
}

func mustNew(t *testing.T, src events.Source, p events.Payload, opts ...events.Option) events.Envelope {
	t.Helper()
	env, err := events.New(src, "lab", p, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return env
}

// A command whose target is another node, published on this node's command
// subject, never reaches the executor; the next, honest one does.
func TestConsumeCommandsRefusesAnotherNodesCommand(t *testing.T) {
	s := bustest.Server(t)
	arb := bustest.Connect(t, s, ident("arbiter", "ctl"))
	n1 := bustest.Connect(t, s, ident("ipmover", "n1"))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	src := events.Source{Service: "arbiter", Node: "ctl"}
	forged := mustNew(t, src, claim("n2", time.Now().Add(10*time.Second)), events.WithEpoch(1))
	forge(t, arb, events.CommandSubject("lab", "n1", events.VerbClaim), forged)
	honest, err := arb.Emit(ctx, claim("n1", time.Now().Add(10*time.Second)), events.WithEpoch(1))
	if err != nil {
		t.Fatal(err)
	}
	seen := make(chan events.Envelope, 4)
	go func() {
		_ = n1.ConsumeCommands(ctx, "n1", func(_ context.Context, env events.Envelope, _ events.Command, _ uint64) { seen <- env })
	}()
	select {
	case env := <-seen:
		if env.ID != honest.ID {
			t.Fatalf("executor got %s (forged %s), want the honest %s", env.ID, forged.ID, honest.ID)
		}
	case <-ctx.Done():
		t.Fatal("the honest command was not delivered")
	}
	if got := n1.RefusedCount(events.RefusedSubject); got != 1 {
		t.Fatalf("refused %v commands for a subject mismatch, want 1", got)
	}
}

// Watch hands its handler only events whose subject vouches for them.
func TestWatchRefusesSubjectMismatch(t *testing.T) {
	s := bustest.Server(t)
	n2 := bustest.Connect(t, s, ident("prober", "n2"))
	reader := bustest.Connect(t, s, ident("arbiter", "ctl"))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	down := events.HealthTransition{Check: "pbx", TargetNode: "n1", Role: events.RoleSelf, From: events.HealthUp, To: events.HealthDown,
		Reason: "forged", Consecutive: 3, Rise: 2, Fall: 3, Evidence: []events.Evidence{{At: time.Now(), Error: "x"}}}
	// n1's health on n2's subject, and n2 claiming n1's self check.
	forge(t, n2, events.HealthSubject("lab", "n2"), mustNew(t, events.Source{Service: "prober", Node: "n1"}, down))
	forge(t, n2, events.HealthSubject("lab", "n2"), mustNew(t, events.Source{Service: "prober", Node: "n2"}, down))
	forge(t, n2, events.HealthSubject("lab", "n2"), events.Envelope{ID: "garbage"})
	honest, err := n2.Emit(ctx, events.NodeHeartbeat{Node: "n2", IntervalMS: 1000, Version: "t"})
	if err != nil {
		t.Fatal(err)
	}
	// The forgeries are in the audit stream, the heartbeat in the live
	// stream: read both to their end.
	var got []events.Envelope
	_ = reader.Watch(ctx, bus.WatchOptions{Subjects: []string{events.ClusterEvents("lab"), events.ClusterLiveState("lab")}, All: true, ToEnd: true},
		func(env events.Envelope, _ events.Decoded, _ uint64) { got = append(got, env) })
	if len(got) != 1 || got[0].ID != honest.ID {
		t.Fatalf("watch delivered %d events, want only the honest heartbeat", len(got))
	}
	if n := reader.RefusedCount(events.RefusedSubject); n != 2 {
		t.Errorf("refused %v for a subject mismatch, want 2", n)
	}
	if n := reader.RefusedCount(events.RefusedUndecodable); n != 1 {
		t.Errorf("refused %v undecodable, want 1", n)
	}
}

// refusalLines counts a logger's "message refused" lines.
type refusalLines struct {
	mu sync.Mutex
	n  int
}

func (r *refusalLines) Enabled(context.Context, slog.Level) bool { return true }
func (r *refusalLines) WithAttrs([]slog.Attr) slog.Handler       { return r }
func (r *refusalLines) WithGroup(string) slog.Handler            { return r }
func (r *refusalLines) Handle(_ context.Context, rec slog.Record) error {
	if rec.Message == "message refused" {
		r.mu.Lock()
		r.n++
		r.mu.Unlock()
	}
	return nil
}

// A peer with publish rights on one subject floods it with garbage: every
// message is refused and counted, but the reader's log gets a burst of
// lines, not one per message.
func TestRefusalFloodIsCountedNotLoggedLineByLine(t *testing.T) {
	s := bustest.Server(t)
	n2 := bustest.Connect(t, s, ident("prober", "n2"))
	lines := &refusalLines{}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	reader, err := bus.Connect(ctx, bus.Config{URL: s.ClientURL()}, ident("arbiter", "ctl"), slog.New(lines))
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()
	const flood = 300
	for i := range flood {
		forge(t, n2, events.HealthSubject("lab", "n2"), events.Envelope{ID: fmt.Sprintf("garbage-%d", i)})
	}
	_ = reader.Watch(ctx, bus.WatchOptions{Subjects: []string{events.ClusterEvents("lab")}, All: true, ToEnd: true},
		func(events.Envelope, events.Decoded, uint64) {})
	if n := reader.RefusedCount(events.RefusedUndecodable); n != flood {
		t.Fatalf("refused %v of %d, want every one counted", n, flood)
	}
	lines.mu.Lock()
	defer lines.mu.Unlock()
	if lines.n == 0 || lines.n > 20 {
		t.Fatalf("%d refusal lines for a flood of %d, want a burst (at most 20)", lines.n, flood)
	}
	t.Logf("%d messages refused and counted, %d log lines", flood, lines.n)
}
