package calls_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/fanpbx/fan/lab/amipeer"
	"github.com/fanpbx/fan/pkg/events"
	"github.com/nats-io/nats.go/jetstream"
)

// BenchmarkRecordCalls places 500 calls on the AMI peer, 50 a second, each
// direct at its answer, and times each from its answer to its record on
// the bus (as a watch of the node's keys sees it), then hangs them up at
// the same rate and times each hang-up to its record's deletion; it
// reports the medians, the 99th percentiles and the worst.
//
//	cd services/replicator && go test -run '^$' -bench BenchmarkRecordCalls -benchtime 1x ./internal/calls/
func BenchmarkRecordCalls(b *testing.B) {
	const n = 500
	for range b.N {
		l := newLab(b)
		l.hold("n1", 1)
		l.start(nil)
		benchCalls(b, l, n)
	}
}

func benchCalls(b *testing.B, l *lab, n int) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	w, err := l.kv.WatchFiltered(ctx, []string{events.CallKey(cluster, group, "n1", "*")}, jetstream.UpdatesOnly())
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = w.Stop() }()
	var mu sync.Mutex
	seen, gone := map[string]time.Time{}, map[string]time.Time{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for e := range w.Updates() {
			if e == nil {
				continue
			}
			now := time.Now()
			mu.Lock()
			if e.Operation() == jetstream.KeyValuePut {
				if _, ok := seen[e.Key()]; !ok {
					seen[e.Key()] = now
				}
			} else {
				gone[e.Key()] = now
			}
			all := len(gone) == n
			mu.Unlock()
			if all {
				return
			}
		}
	}()
	answered, hung := map[string]time.Time{}, map[string]time.Time{}
	var calls []*amipeer.Call
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	b.ResetTimer()
	for i := range n {
		<-tick.C
		c := l.answer(i, true)
		answered[events.CallKey(cluster, group, "n1", c.BridgeID())] = time.Now()
		calls = append(calls, c)
	}
	for _, c := range calls {
		<-tick.C
		key := events.CallKey(cluster, group, "n1", c.BridgeID())
		c.HungUp(true)
		hung[key] = time.Now()
	}
	select {
	case <-done:
	case <-ctx.Done():
		b.Fatalf("%d of %d records deleted", len(gone), n)
	}
	b.StopTimer()
	mu.Lock()
	defer mu.Unlock()
	var rec, del []time.Duration
	for k, at := range answered {
		rec = append(rec, seen[k].Sub(at))
		del = append(del, gone[k].Sub(hung[k]))
	}
	report(b, "record", rec)
	report(b, "delete", del)
}

func report(b *testing.B, what string, ds []time.Duration) {
	slices.Sort(ds)
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	b.ReportMetric(ms(ds[len(ds)/2]), what+"_p50_ms")
	b.ReportMetric(ms(ds[len(ds)*99/100]), what+"_p99_ms")
	b.ReportMetric(ms(ds[len(ds)-1]), what+"_max_ms")
}
