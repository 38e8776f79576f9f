package bus_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/bus/bustest"
	"github.com/fanpbx/fan/pkg/platform/waittest"
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
	// Cancelled once it reads, so that its consumer has to be stopped.
	stream, err := events.StreamOf(events.ClusterEvents("lab"))
	if err != nil {
		t.Fatal(err)
	}
	waittest.Succeeds(t, 5*time.Second, "the watch's consumer", func() error {
		st, err := b.JS.Stream(ctx, stream)
		if err != nil {
			return err
		}
		info, err := st.Info(ctx)
		if err != nil {
			return err
		}
		if info.State.Consumers == 0 {
			return errors.New("none yet")
		}
		return nil
	})
	start := time.Now()
	cancel()
	<-done
	// Shutdown waits for the consumer to report it stopped; that must not
	// cost the bounded wait's full 5 s.
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("Watch returned %v after cancel", took)
	}
}
