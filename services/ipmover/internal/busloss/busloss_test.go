package busloss

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
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
	reachable atomic.Bool
	checks    atomic.Int64
	mu        sync.Mutex
	released  []time.Duration
	regained  []time.Duration
}

func run(t *testing.T, p Policy) (*harness, func()) {
	h := &harness{}
	h.reachable.Store(true)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		Run(ctx, Config{
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
		})
	}()
	return h, func() { cancel(); <-done }
}

func (h *harness) snapshot() (rel, reg []time.Duration) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]time.Duration(nil), h.released...), append([]time.Duration(nil), h.regained...)
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Release: once contact has been gone for the lease, the addresses go,
// exactly once per loss, never earlier; contact regained is reported.
func TestReleaseAfterLease(t *testing.T) {
	h, stop := run(t, Release)
	defer stop()
	waitFor(t, "first good check", func() bool { return h.checks.Load() > 0 })
	h.reachable.Store(false)
	waitFor(t, "release", func() bool { rel, _ := h.snapshot(); return len(rel) == 1 })
	// Many more failing checks: still one release.
	n := h.checks.Load()
	waitFor(t, "more failing checks", func() bool { return h.checks.Load() > n+10 })
	rel, _ := h.snapshot()
	if len(rel) != 1 || rel[0] < 60*time.Millisecond {
		t.Fatalf("releases %v: want exactly one, after at least the 60ms lease", rel)
	}
	h.reachable.Store(true)
	waitFor(t, "regained", func() bool { _, reg := h.snapshot(); return len(reg) == 1 })
}

// Hold: however long the bus is gone, nothing is released; contact
// regained is still reported so desired state is re-read.
func TestHoldNeverReleases(t *testing.T) {
	h, stop := run(t, Hold)
	defer stop()
	waitFor(t, "first good check", func() bool { return h.checks.Load() > 0 })
	h.reachable.Store(false)
	n := h.checks.Load()
	// 30 failing checks at 10ms is five leases' worth.
	waitFor(t, "failing checks", func() bool { return h.checks.Load() > n+30 })
	if rel, _ := h.snapshot(); len(rel) != 0 {
		t.Fatalf("hold policy released: %v", rel)
	}
	h.reachable.Store(true)
	waitFor(t, "regained", func() bool { _, reg := h.snapshot(); return len(reg) == 1 })
}
