package bus_test

import (
	"context"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/bus/bustest"
)

// TestWatchReturnsPromptly: a cancelled Watch returns at once.
func TestWatchReturnsPromptly(t *testing.T) {
	s := bustest.Server(t)
	b := bustest.Connect(t, s, ident("w", "n1"))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		_ = b.Watch(ctx, bus.WatchOptions{Subjects: []string{events.ClusterEvents("lab")}}, func(events.Envelope, events.Decoded, uint64) {})
		close(done)
	}()
	time.Sleep(300 * time.Millisecond)
	start := time.Now()
	cancel()
	<-done
	// Shutdown waits for the consumer to report it stopped; that must not
	// cost the bounded wait's full 5 s.
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("Watch returned %v after cancel", took)
	}
}
