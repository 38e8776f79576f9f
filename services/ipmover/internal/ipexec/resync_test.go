package ipexec

import (
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/platform/daemon"
	"github.com/fanpbx/fan/pkg/platform/waittest"
	"github.com/fanpbx/fan/services/ipmover/internal/fence"
)

// A re-sync that cannot read the state raises resync_incomplete and is
// retried with backoff until one completes, which clears it.
func TestResyncRetriesUntilComplete(t *testing.T) {
	f, err := fence.Open(filepath.Join(t.TempDir(), "state.json"), fence.DefaultKeep)
	if err != nil {
		t.Fatal(err)
	}
	var reads atomic.Int32
	s := &Service{
		log: slog.New(slog.DiscardHandler), fence: f,
		conds: daemon.NewConditions(slog.New(slog.DiscardHandler)), resyncRetry: make(chan string, 1),
		kv: func(context.Context, string) ([]byte, error) { return nil, nil },
		listKeys: func(context.Context) ([]string, error) {
			if reads.Add(1) <= 4 {
				return nil, errors.New("no responders")
			}
			return nil, nil
		},
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan struct{})
	go func() { defer close(done); s.runResyncRetries(ctx) }()
	start := time.Now()
	s.resyncOrRetry(ctx, "start")
	if !s.conds.Is(condResyncIncomplete) {
		t.Fatal("resync_incomplete not raised after a failed re-sync")
	}
	waittest.Until(t, 10*time.Second, "resync_incomplete cleared", func() bool {
		return !s.conds.Is(condResyncIncomplete)
	})
	// Retries after 250, 500, 1000 and 2000 ms: complete on the fifth read.
	if n := reads.Load(); n != 5 {
		t.Fatalf("%d reads, want 5", n)
	}
	t.Logf("complete after %s", time.Since(start).Round(time.Millisecond))
	cancel()
	<-done
}
