package registry

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/bus/bustest"
	"github.com/google/uuid"
)

var t0 = time.Date(2026, 11, 30, 2, 30, 0, 0, time.UTC)

// recorder collects presence events in the order the registry emitted them.
type recorder struct {
	mu  sync.Mutex
	got []events.NodePresence
}

func (r *recorder) emit(_ context.Context, p events.Payload, opts ...events.Option) (events.Envelope, error) {
	env, err := events.New(events.Source{Service: "arbiter", Node: "ctl"}, "lab", p, opts...)
	if err != nil {
		return env, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got = append(r.got, p.(events.NodePresence))
	return env, nil
}

func (r *recorder) all() []events.NodePresence {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]events.NodePresence(nil), r.got...)
}

func heartbeat(node string, seq uint64, at time.Time) (events.Envelope, *events.NodeHeartbeat) {
	hb := &events.NodeHeartbeat{Node: node, Seq: seq, IntervalMS: 1000, Version: "t", CPUPercent: float64(seq)}
	env := events.Envelope{ID: uuid.Must(uuid.NewV7()).String(), Time: at, Cluster: "lab", Source: events.Source{Service: "prober", Node: node}}
	return env, hb
}

func newRegistry(t testing.TB, offlineAfter time.Duration) (*Registry, *recorder) {
	t.Helper()
	s := bustest.Server(t)
	b := bustest.Connect(t, s, bus.Identity{Cluster: "lab", Service: "arbiter", Node: "ctl"})
	kv, err := b.StateKV(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	rec := &recorder{}
	return New(kv, "lab", offlineAfter, rec.emit, slog.New(slog.DiscardHandler)), rec
}

func TestOfflineAfterSilenceOnlineWhenHeard(t *testing.T) {
	ctx := context.Background()
	r, rec := newRegistry(t, 5*time.Minute)
	env, hb := heartbeat("n1", 1, t0)
	if err := r.Heartbeat(ctx, env, hb, t0); err != nil {
		t.Fatal(err)
	}
	// Redelivery of the same heartbeat changes nothing.
	if err := r.Heartbeat(ctx, env, hb, t0.Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	if n, err := r.Sweep(ctx, t0.Add(5*time.Minute)); err != nil || n != 0 {
		t.Fatalf("swept a node silent exactly the threshold: %d %v", n, err)
	}
	if n, err := r.Sweep(ctx, t0.Add(5*time.Minute+time.Millisecond)); err != nil || n != 1 {
		t.Fatalf("sweep past the threshold: %d %v", n, err)
	}
	if n, _ := r.Sweep(ctx, t0.Add(time.Hour)); n != 0 {
		t.Fatalf("an offline node was marked offline again")
	}
	env2, hb2 := heartbeat("n1", 2, t0.Add(time.Hour))
	if err := r.Heartbeat(ctx, env2, hb2, t0.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	got := rec.all()
	if len(got) != 3 || got[0].Presence != events.PresenceOnline || got[1].Presence != events.PresenceOffline ||
		got[2].Presence != events.PresenceOnline || got[2].SilentMS != time.Hour.Milliseconds() {
		t.Fatalf("presence events %+v", got)
	}
	n1, err := r.Get(ctx, "n1")
	if err != nil {
		t.Fatal(err)
	}
	if n1.Beats != 2 || n1.Seq != 2 || n1.Presence != events.PresenceOnline || !n1.PresenceSince.Equal(t0.Add(time.Hour)) {
		t.Fatalf("record %+v", n1)
	}
}

func TestThresholdInSeconds(t *testing.T) {
	ctx := context.Background()
	r, rec := newRegistry(t, 2*time.Second)
	env, hb := heartbeat("n1", 1, t0)
	if err := r.Heartbeat(ctx, env, hb, t0); err != nil {
		t.Fatal(err)
	}
	if n, _ := r.Sweep(ctx, t0.Add(2100*time.Millisecond)); n != 1 || len(rec.all()) != 2 {
		t.Fatalf("2 s threshold: marked %d, events %+v", n, rec.all())
	}
}

// TestConcurrentWritersLoseNothing: many writers heartbeat the same nodes
// while sweepers (with a clock far ahead, so every sweep wants to mark them
// offline) race them. Compare-and-set must keep every heartbeat counted and
// every presence change reported exactly once, in alternation.
func TestConcurrentWritersLoseNothing(t *testing.T) {
	ctx := context.Background()
	r, rec := newRegistry(t, time.Minute)
	const writers, beats, sweepers = 8, 25, 3
	nodes := []string{"n1", "n2"}
	var wg sync.WaitGroup
	errs := make(chan error, writers*beats+sweepers*beats)
	for w := range writers {
		wg.Go(func() {
			for i := range beats {
				node := nodes[(w+i)%len(nodes)]
				at := t0.Add(time.Duration(w*beats+i) * time.Millisecond)
				env, hb := heartbeat(node, uint64(w*beats+i+1), at)
				if err := r.Heartbeat(ctx, env, hb, at); err != nil {
					errs <- fmt.Errorf("writer %d: %w", w, err)
				}
			}
		})
	}
	for range sweepers {
		wg.Go(func() {
			for range beats {
				if _, err := r.Sweep(ctx, t0.Add(time.Hour)); err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	total := uint64(0)
	for _, n := range nodes {
		rc, err := r.Get(ctx, n)
		if err != nil {
			t.Fatal(err)
		}
		total += rc.Beats
		// Presence events for this node, in the order of the writes that
		// flipped it (concurrent writers publish in any order), alternate,
		// start online, and end where the record ends.
		var flips []events.NodePresence
		for _, p := range rec.all() {
			if p.Node == n {
				flips = append(flips, p)
			}
		}
		slices.SortFunc(flips, func(a, b events.NodePresence) int { return cmp.Compare(a.Revision, b.Revision) })
		var seq []events.Presence
		for i, p := range flips {
			if p.Revision == 0 || (i > 0 && p.Revision == flips[i-1].Revision) {
				t.Fatalf("%s: flip without a distinct revision: %+v", n, flips)
			}
			seq = append(seq, p.Presence)
		}
		if len(seq) == 0 || seq[0] != events.PresenceOnline {
			t.Fatalf("%s: presence events %v", n, seq)
		}
		for i := 1; i < len(seq); i++ {
			if seq[i] == seq[i-1] {
				t.Fatalf("%s: presence %s reported twice in a row (a lost or duplicated flip): %v", n, seq[i], seq)
			}
		}
		if seq[len(seq)-1] != rc.Presence {
			t.Fatalf("%s: last event %s, record %s", n, seq[len(seq)-1], rc.Presence)
		}
		t.Logf("%s: %d beats, %d presence changes", n, rc.Beats, len(seq))
	}
	if total != writers*beats {
		t.Fatalf("%d heartbeats recorded of %d written: lost updates", total, writers*beats)
	}
}
