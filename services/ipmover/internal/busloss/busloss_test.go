package busloss

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/platform/waittest"
)

func TestValidateLease(t *testing.T) {
	if err := ValidateLease(DefaultReleaseAfter, DefaultCheckEvery, DefaultHeartbeat, DefaultSilentAfter); err != nil {
		t.Fatalf("defaults rejected: %v", err)
	}
	if err := ValidateLease(2*time.Second, DefaultCheckEvery, DefaultHeartbeat, DefaultSilentAfter); err == nil {
		t.Fatal("a lease that outlives the arbiter's silence threshold was accepted")
	}
	if err := ValidateLease(0, DefaultCheckEvery, DefaultHeartbeat, DefaultSilentAfter); err == nil {
		t.Fatal("zero lease accepted")
	}
}

type harness struct {
	ctx       context.Context // the monitor's: ends when it is stopped
	reachable atomic.Bool     // this node's own server answers
	checks    atomic.Int64
	// The cluster's side, for the tests that ask it (clusterAnswers).
	clusterUp     atomic.Bool
	clusterChecks atomic.Int64
	mu            sync.Mutex
	released      []time.Duration
	regained      []time.Duration
}

// run starts a monitor checking every 10 ms with a 60 ms lease; with
// cluster set, it also asks the cluster every 20 ms through it.
func run(t *testing.T, p Policy, cluster func(h *harness, ctx context.Context) error) (*harness, func()) {
	h := &harness{}
	h.reachable.Store(true)
	h.clusterUp.Store(true)
	ctx, cancel := context.WithCancel(t.Context())
	h.ctx = ctx
	cfg := Config{
		Policy: p, ReleaseAfter: 60 * time.Millisecond, CheckEvery: 10 * time.Millisecond,
		Check: func(context.Context) error {
			h.checks.Add(1)
			if h.reachable.Load() {
				return nil
			}
			return errors.New("no pong")
		},
		OnRelease:  func(d time.Duration) { h.mu.Lock(); h.released = append(h.released, d); h.mu.Unlock() },
		OnRegained: func(d time.Duration) { h.mu.Lock(); h.regained = append(h.regained, d); h.mu.Unlock() },
	}
	if cluster != nil {
		cfg.ClusterEvery = 20 * time.Millisecond
		cfg.ClusterCheck = func(ctx context.Context) error { return cluster(h, ctx) }
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		Run(ctx, cfg)
	}()
	return h, func() { cancel(); <-done }
}

// clusterAnswers is a cluster check that answers while clusterUp.
func clusterAnswers(h *harness, _ context.Context) error {
	h.clusterChecks.Add(1)
	if h.clusterUp.Load() {
		return nil
	}
	return errors.New("no raft leader")
}

func (h *harness) snapshot() (rel, reg []time.Duration) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]time.Duration(nil), h.released...), append([]time.Duration(nil), h.regained...)
}

// Release: once contact has been gone for the lease, the addresses go,
// exactly once per loss, never earlier; contact regained is reported.
func TestReleaseAfterLease(t *testing.T) {
	h, stop := run(t, Release, nil)
	defer stop()
	waittest.Until(t, 5*time.Second, "first good check", func() bool { return h.checks.Load() > 0 })
	h.reachable.Store(false)
	waittest.Until(t, 5*time.Second, "release", func() bool { rel, _ := h.snapshot(); return len(rel) == 1 })
	// Many more failing checks: still one release.
	n := h.checks.Load()
	waittest.Until(t, 5*time.Second, "more failing checks", func() bool { return h.checks.Load() > n+10 })
	rel, _ := h.snapshot()
	if len(rel) != 1 || rel[0] < 60*time.Millisecond {
		t.Fatalf("releases %v: want exactly one, after at least the 60ms lease", rel)
	}
	h.reachable.Store(true)
	waittest.Until(t, 5*time.Second, "regained", func() bool { _, reg := h.snapshot(); return len(reg) == 1 })
}

// Hold: however long the bus is gone, nothing is released; contact
// regained is still reported so desired state is re-read.
func TestHoldNeverReleases(t *testing.T) {
	h, stop := run(t, Hold, nil)
	defer stop()
	waittest.Until(t, 5*time.Second, "first good check", func() bool { return h.checks.Load() > 0 })
	h.reachable.Store(false)
	n := h.checks.Load()
	// 30 failing checks at 10ms is five leases' worth.
	waittest.Until(t, 5*time.Second, "failing checks", func() bool { return h.checks.Load() > n+30 })
	if rel, _ := h.snapshot(); len(rel) != 0 {
		t.Fatalf("hold policy released: %v", rel)
	}
	h.reachable.Store(true)
	waittest.Until(t, 5*time.Second, "regained", func() bool { _, reg := h.snapshot(); return len(reg) == 1 })
}

// The cluster's leaders stop answering while this node's own server
// still does (the host is cut off from the other servers): under the
// release policy nothing is released, however long it lasts, and when the
// cluster answers again desired state is re-read, once.
func TestClusterLossNeverReleasesAndResyncsOnReturn(t *testing.T) {
	h, stop := run(t, Release, clusterAnswers)
	defer stop()
	waittest.Until(t, 5*time.Second, "first cluster check", func() bool { return h.clusterChecks.Load() > 0 })
	h.clusterUp.Store(false)
	n := h.clusterChecks.Load()
	// 20 failing cluster checks at 20ms is six leases' worth.
	waittest.Until(t, 5*time.Second, "failing cluster checks", func() bool { return h.clusterChecks.Load() > n+20 })
	if rel, reg := h.snapshot(); len(rel) != 0 || len(reg) != 0 {
		t.Fatalf("on a cluster loss with the local server answering: released %v, regained %v; want neither", rel, reg)
	}
	h.clusterUp.Store(true)
	waittest.Until(t, 5*time.Second, "regained", func() bool { _, reg := h.snapshot(); return len(reg) == 1 })
	n = h.clusterChecks.Load()
	waittest.Until(t, 5*time.Second, "more good cluster checks", func() bool { return h.clusterChecks.Load() > n+5 })
	if _, reg := h.snapshot(); len(reg) != 1 {
		t.Fatalf("regained reported %d times for one return, want 1", len(reg))
	}
}

// A cluster check that hangs never holds the bus check back: the release
// lease has no slack for it. Here the cluster's answer never comes while
// the node's own server is lost; the release still happens.
func TestHungClusterCheckNeverDelaysRelease(t *testing.T) {
	// Hangs until the monitor stops, whatever its own deadline.
	hang := func(h *harness, _ context.Context) error { h.clusterChecks.Add(1); <-h.ctx.Done(); return h.ctx.Err() }
	h, stop := run(t, Release, hang)
	defer stop()
	waittest.Until(t, 5*time.Second, "the cluster check hanging", func() bool { return h.clusterChecks.Load() > 0 })
	h.reachable.Store(false)
	waittest.Until(t, 5*time.Second, "release", func() bool { rel, _ := h.snapshot(); return len(rel) == 1 })
}
