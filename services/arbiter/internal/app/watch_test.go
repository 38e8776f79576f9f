package app

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/platform/bus"
)

// A leader whose watch of the audit stream dies is deaf: it would keep
// ticking, feeding the watchdog and holding the lease while hearing no
// health. Its run ends instead, with the watch named, so systemd restarts it.
func TestWatchFailureEndsTheRun(t *testing.T) {
	l := newLab(t, "n1")
	svc, err := New(l.cfg("n1"), testLogger("n1"), "test")
	if err != nil {
		t.Fatal(err)
	}
	died := errors.New("audit stream consumer gone")
	var arb *arbiter
	svc.wired = func(a *arbiter) { arb = a }
	svc.watch = func(ctx context.Context, _ bus.WatchOptions, _ bus.EventHandler) error {
		// Die only once this replica leads: the deaf leader is the case.
		for !arb.lease.Leading() {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(10 * time.Millisecond):
			}
		}
		return died
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- svc.Run(ctx) }()
	select {
	case err := <-done:
		if !errors.Is(err, died) || !strings.Contains(err.Error(), "watch") {
			t.Fatalf("Run = %v, want the watch's failure", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the arbiter kept running with a dead watch")
	}
}
