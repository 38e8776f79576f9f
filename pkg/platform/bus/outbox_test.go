package bus_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/bus/bustest"
	"github.com/fanpbx/fan/pkg/platform/waittest"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
)

func transition(check string, to events.Health) events.HealthTransition {
	from := events.HealthUp
	if to == events.HealthUp {
		from = events.HealthDown
	}
	return events.HealthTransition{Check: check, TargetNode: "n1", Role: events.RoleSelf, From: from, To: to,
		Reason: "test", Consecutive: 1, Rise: 1, Fall: 1, Evidence: []events.Evidence{{At: time.Now(), OK: to == events.HealthUp}}}
}

// storedIDs reads every event on the audit stream, in stream order.
func storedIDs(t *testing.T, b *bus.Bus) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := b.JS.Stream(ctx, bus.EventsStream)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for seq := uint64(1); ; {
		m, err := st.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(">"))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return ids
		}
		if err != nil {
			t.Fatal(err)
		}
		env, _, err := events.Decode(m.Data)
		if err != nil {
			t.Fatal(err)
		}
		if env.Type == events.TypeHealthTransition {
			ids = append(ids, env.ID)
		}
		seq = m.Sequence + 1
	}
}

func newOutbox(t *testing.T, b *bus.Bus, cfg bus.OutboxConfig) *bus.Outbox {
	t.Helper()
	o := bus.NewOutbox(b, cfg, slog.New(slog.DiscardHandler))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = o.Close(ctx)
	})
	return o
}

// post queues transitions in order and returns their ids.
func post(t *testing.T, o *bus.Outbox, posts ...[2]string) []string {
	t.Helper()
	ids := make([]string, len(posts))
	for i, p := range posts {
		to := events.HealthDown
		if i%2 == 1 {
			to = events.HealthUp
		}
		env, err := o.Post(p[0], transition(p[1], to))
		if err != nil {
			t.Fatal(err)
		}
		ids[i] = env.ID
	}
	return ids
}

// TestOutboxStreamGoneThenBack: while the audit stream is missing (as good
// as a stream without a leader: nothing stores), posted events wait; once
// it is back they are stored in post order, a superseded one never, and
// each exactly once.
func TestOutboxStreamGoneThenBack(t *testing.T) {
	s := bustest.Server(t)
	b := bustest.Connect(t, s, ident("prober", "n1"))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := b.JS.DeleteStream(ctx, bus.EventsStream); err != nil {
		t.Fatal(err)
	}
	o := newOutbox(t, b, bus.OutboxConfig{Attempt: 200 * time.Millisecond})
	ids := post(t, o, [2]string{"check/a", "a"}, [2]string{"check/b", "b"}, [2]string{"", "c"},
		[2]string{"check/a", "a"}, [2]string{"", "c"}, [2]string{"check/b", "b"}, [2]string{"check/d", "d"})
	// a1 and b1 are superseded by a2 and b2.
	want := []string{ids[2], ids[3], ids[4], ids[5], ids[6]}
	waittest.Until(t, 20*time.Second, "retries", func() bool { return metric(o, "fan_outbox_retries_total") >= 3 })
	if n := o.Pending(); n != len(want) {
		t.Fatalf("pending %d, want %d", n, len(want))
	}

	if err := b.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	waittest.Until(t, 20*time.Second, "the outbox to empty", func() bool { return o.Pending() == 0 })
	got := storedIDs(t, b)
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("stored %v\nwant   %v (post order, superseded skipped, each once)", got, want)
	}
	if n := metric(o, "fan_outbox_superseded_total"); n != 2 {
		t.Fatalf("superseded %v, want 2", n)
	}
	if n := metric(o, "fan_outbox_stored_total"); n != float64(len(want)) {
		t.Fatalf("stored counter %v, want %d", n, len(want))
	}
}

// metric sums a metric of the outbox over its labels.
func metric(o *bus.Outbox, name string) float64 {
	reg := prometheus.NewRegistry()
	reg.MustRegister(o)
	mfs, _ := reg.Gather()
	var v float64
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				v += m.GetCounter().GetValue() + m.GetGauge().GetValue()
			}
		}
	}
	return v
}

// TestOutboxServerRestart: the only server stops (the client is cut off
// from the bus) and comes back on the same port and store; what was posted
// meanwhile is stored after it is back, in order, once.
func TestOutboxServerRestart(t *testing.T) {
	dir := t.TempDir()
	start := func(port int) *server.Server {
		s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: port, JetStream: true,
			StoreDir: dir, NoLog: true, NoSigs: true})
		if err != nil {
			t.Fatal(err)
		}
		go s.Start()
		if !s.ReadyForConnections(10 * time.Second) {
			t.Fatal("nats server not ready")
		}
		return s
	}
	s := start(server.RANDOM_PORT)
	_, portStr, _ := net.SplitHostPort(s.Addr().String())
	port, _ := strconv.Atoi(portStr)
	b := bustest.Connect(t, s, ident("prober", "n1"))
	o := newOutbox(t, b, bus.OutboxConfig{Attempt: 200 * time.Millisecond})
	before := post(t, o, [2]string{"check/a", "a"})
	waittest.Until(t, 20*time.Second, "the first event stored", func() bool { return o.Pending() == 0 })

	s.Shutdown()
	s.WaitForShutdown()
	ids := post(t, o, [2]string{"check/a", "a"}, [2]string{"check/b", "b"}, [2]string{"check/a", "a"})
	waittest.Until(t, 20*time.Second, "retries", func() bool { return metric(o, "fan_outbox_retries_total") >= 2 })

	s = start(port)
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	waittest.Until(t, 20*time.Second, "the outbox to empty", func() bool { return o.Pending() == 0 })
	want := []string{before[0], ids[1], ids[2]}
	if got := storedIDs(t, b); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("stored %v\nwant   %v", got, want)
	}
}

// TestOutboxCap: at the cap the oldest waiting event is dropped and the
// outbox says it is full; it recovers once the bus stores again.
func TestOutboxCap(t *testing.T) {
	s := bustest.Server(t)
	b := bustest.Connect(t, s, ident("prober", "n1"))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := b.JS.DeleteStream(ctx, bus.EventsStream); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var told []bool
	o := newOutbox(t, b, bus.OutboxConfig{Cap: 3, Attempt: 200 * time.Millisecond, OnFull: func(full bool) {
		mu.Lock()
		told = append(told, full)
		mu.Unlock()
	}})
	ids := post(t, o, [2]string{"", "a"}, [2]string{"", "b"}, [2]string{"", "c"}, [2]string{"", "d"}, [2]string{"", "e"})
	if !o.Full() || o.Pending() != 3 {
		t.Fatalf("full %v pending %d, want full with 3", o.Full(), o.Pending())
	}
	if n := metric(o, "fan_outbox_dropped_total"); n != 2 {
		t.Fatalf("dropped %v, want 2", n)
	}
	if err := b.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	waittest.Until(t, 20*time.Second, "the outbox to empty", func() bool { return o.Pending() == 0 })
	if got, want := storedIDs(t, b), ids[2:]; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("stored %v, want the newest %v", got, want)
	}
	if o.Full() {
		t.Fatal("still full after draining")
	}
	mu.Lock()
	defer mu.Unlock()
	if fmt.Sprint(told) != "[true false]" {
		t.Fatalf("OnFull told %v, want [true false]", told)
	}
}

// TestOutboxCloseDrainsWithDeadline: Close returns by its deadline when the
// bus cannot store, reporting what was left; posts after Close fail.
func TestOutboxCloseDrainsWithDeadline(t *testing.T) {
	s := bustest.Server(t)
	b := bustest.Connect(t, s, ident("prober", "n1"))
	o := bus.NewOutbox(b, bus.OutboxConfig{}, slog.New(slog.DiscardHandler))
	post(t, o, [2]string{"", "a"})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := o.Close(ctx); err != nil {
		t.Fatalf("close with a live bus: %v", err)
	}
	if got := storedIDs(t, b); len(got) != 1 {
		t.Fatalf("stored %d events before close returned, want 1", len(got))
	}

	if err := b.JS.DeleteStream(ctx, bus.EventsStream); err != nil {
		t.Fatal(err)
	}
	o = bus.NewOutbox(b, bus.OutboxConfig{}, slog.New(slog.DiscardHandler))
	post(t, o, [2]string{"", "a"})
	dctx, dcancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer dcancel()
	begun := time.Now()
	if err := o.Close(dctx); err == nil {
		t.Fatal("close reported nothing lost with the stream gone")
	}
	if took := time.Since(begun); took > 3*time.Second {
		t.Fatalf("close took %v past a 300ms deadline", took)
	}
	if _, err := o.Post("", transition("a", events.HealthDown)); !errors.Is(err, bus.ErrOutboxClosed) {
		t.Fatalf("post after close: %v, want ErrOutboxClosed", err)
	}
}

func TestOutboxRefusesCommands(t *testing.T) {
	s := bustest.Server(t)
	b := bustest.Connect(t, s, ident("arbiter", "ctl"))
	o := newOutbox(t, b, bus.OutboxConfig{})
	cmd := events.ClaimIP{Group: "g", Node: "n1", NotAfter: time.Now().Add(time.Minute)}
	if _, err := o.Post("", cmd); !errors.Is(err, bus.ErrOutboxCommand) {
		t.Fatalf("post of a command: %v, want ErrOutboxCommand", err)
	}
}

// BenchmarkOutboxPost measures what posting costs the caller (building the
// envelope included) while the background loop publishes; compare with
// BenchmarkEmitSync, a publish that waits for the server's ack.
func BenchmarkOutboxPost(bb *testing.B) {
	s := bustest.Server(bb)
	b := bustest.Connect(bb, s, ident("prober", "n1"))
	o := bus.NewOutbox(b, bus.OutboxConfig{Cap: 1 << 20}, slog.New(slog.DiscardHandler))
	defer func() { _ = o.Close(context.Background()) }()
	p := transition("a", events.HealthDown)
	bb.ReportAllocs()
	bb.ResetTimer()
	for i := 0; bb.Loop(); i++ {
		if _, err := o.Post("check/"+strconv.Itoa(i%64), p); err != nil {
			bb.Fatal(err)
		}
	}
}

func BenchmarkEmitSync(bb *testing.B) {
	s := bustest.Server(bb)
	b := bustest.Connect(bb, s, ident("prober", "n1"))
	p := transition("a", events.HealthDown)
	ctx := context.Background()
	for bb.Loop() {
		if _, err := b.Emit(ctx, p); err != nil {
			bb.Fatal(err)
		}
	}
}
