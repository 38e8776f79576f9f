package bus_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/bus/bustest"
	"github.com/fanpbx/fan/pkg/platform/waittest"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestLiveStateIsKeptApart: a heartbeat and a probe result are stored in
// the live stream, never in the audit stream; a transition in the audit
// stream only; one Watch over both kinds of subjects delivers all three;
// and every stream and the state bucket has a byte limit that discards old
// messages, which the usage gauges report.
func TestLiveStateIsKeptApart(t *testing.T) {
	s := bustest.Server(t)
	b := bustest.Connect(t, s, ident("prober", "n1"))
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()

	var mu sync.Mutex
	got := map[events.Type]int{}
	wctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- b.Watch(wctx, bus.WatchOptions{All: true, Subjects: []string{
			events.AllHealth("lab"), events.AllHeartbeats("lab"), events.ProbeResultSubject("lab", "n1")}},
			func(env events.Envelope, _ events.Decoded, _ uint64) {
				mu.Lock()
				got[env.Type]++
				mu.Unlock()
			})
	}()
	hb := events.NodeHeartbeat{Node: "n1", Seq: 1, IntervalMS: 1000, Version: "test"}
	pr := events.ProbeResult{Check: "ami", Kind: "ami", Target: "127.0.0.1:5038", TargetNode: "n1", Role: events.RoleSelf, OK: true, At: time.Now()}
	tr := events.HealthTransition{Check: "ami", TargetNode: "n1", Role: events.RoleSelf, From: events.HealthUnknown, To: events.HealthUp,
		Reason: "test", Consecutive: 1, Rise: 1, Fall: 1, Evidence: []events.Evidence{{At: time.Now(), OK: true}}}
	for _, p := range []events.Payload{hb, pr, tr} {
		if _, err := b.Emit(ctx, p); err != nil {
			t.Fatalf("emit %s: %v", p.EventType(), err)
		}
	}
	waittest.Succeeds(t, 10*time.Second, "three events from the watch over both streams", func() error {
		mu.Lock()
		defer mu.Unlock()
		if len(got) != 3 {
			return fmt.Errorf("delivered %v", got)
		}
		return nil
	})
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	msgs := func(stream string) uint64 {
		st, err := b.JS.Stream(ctx, stream)
		if err != nil {
			t.Fatal(err)
		}
		return st.CachedInfo().State.Msgs
	}
	if a, l := msgs(bus.EventsStream), msgs(bus.LiveStream); a != 1 || l != 2 {
		t.Fatalf("audit stream holds %d (want the transition only), live stream %d (want heartbeat and result)", a, l)
	}

	for _, name := range []string{bus.EventsStream, bus.LiveStream, bus.CommandsStream, events.KVStreamName(bus.StateBucket)} {
		st, err := b.JS.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		c := st.CachedInfo().Config
		if c.MaxBytes <= 0 || c.Discard != jetstream.DiscardOld {
			t.Errorf("%s: max bytes %d, discard %v: want a byte limit discarding old", name, c.MaxBytes, c.Discard)
		}
	}
	if st, _ := b.JS.Stream(ctx, bus.LiveStream); st.CachedInfo().Config.MaxAge != bus.DefaultLiveMaxAge {
		t.Errorf("live stream keeps %v, want %v", st.CachedInfo().Config.MaxAge, bus.DefaultLiveMaxAge)
	}

	u := bus.NewUsage()
	b.ReadUsage(ctx, u)
	cols := u.Collectors()
	if got := testutil.ToFloat64(metricFor(t, cols[1], bus.EventsStream)); got != bus.DefaultEventsMiB<<20 {
		t.Errorf("fan_stream_max_bytes{stream=%s} = %v", bus.EventsStream, got)
	}
	if got := testutil.ToFloat64(metricFor(t, cols[0], bus.LiveStream)); got <= 0 {
		t.Errorf("fan_stream_bytes{stream=%s} = %v, want the two messages' size", bus.LiveStream, got)
	}
}

func metricFor(t *testing.T, c any, stream string) interface {
	Describe(chan<- *prometheus.Desc)
	Collect(chan<- prometheus.Metric)
} {
	t.Helper()
	v, ok := c.(*prometheus.GaugeVec)
	if !ok {
		t.Fatalf("collector %T", c)
	}
	return v.WithLabelValues(stream)
}

// TestWatchToEnd: a watch that reads to the end returns once both streams
// delivered what they held, even when the last stored message is one it
// refuses, and at once (after a quiet second) when nothing matches.
func TestWatchToEnd(t *testing.T) {
	s := bustest.Server(t)
	n1 := bustest.Connect(t, s, ident("prober", "n1"))
	reader := bustest.Connect(t, s, ident("fanctl", "ops"))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var want []string
	for i := range 5 {
		env, err := n1.Emit(ctx, events.NodeHeartbeat{Node: "n1", Seq: uint64(i + 1), IntervalMS: 1000, Version: "t"})
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, env.ID)
	}
	tr := events.HealthTransition{Check: "pbx", TargetNode: "n1", Role: events.RoleSelf, From: events.HealthUnknown, To: events.HealthUp,
		Reason: "test", Consecutive: 1, Rise: 1, Fall: 1, Evidence: []events.Evidence{{At: time.Now(), OK: true}}}
	env, err := n1.Emit(ctx, tr)
	if err != nil {
		t.Fatal(err)
	}
	want = append(want, env.ID)
	// Last in the audit stream: n1's transition forged on n2's subject.
	forge(t, n1, events.HealthSubject("lab", "n2"), mustNew(t, events.Source{Service: "prober", Node: "n1"}, tr))
	var got []string
	err = reader.Watch(ctx, bus.WatchOptions{All: true, ToEnd: true,
		Subjects: []string{events.ClusterEvents("lab"), events.ClusterLiveState("lab")}},
		func(env events.Envelope, _ events.Decoded, _ uint64) { got = append(got, env.ID) })
	if err != nil || ctx.Err() != nil {
		t.Fatalf("watch to the end: %v (context %v)", err, ctx.Err())
	}
	if len(got) != len(want) {
		t.Fatalf("read %d events to the end, want %d", len(got), len(want))
	}
	start := time.Now()
	err = reader.Watch(ctx, bus.WatchOptions{All: true, ToEnd: true, Subjects: []string{events.ClusterEvents("other")}},
		func(events.Envelope, events.Decoded, uint64) { t.Error("an event of another cluster") })
	if err != nil || time.Since(start) > 10*time.Second {
		t.Fatalf("an empty read took %v: %v", time.Since(start), err)
	}
}
