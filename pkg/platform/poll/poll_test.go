package poll

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestUntilReturnsOnceTheAttemptWorks(t *testing.T) {
	var n atomic.Int32
	err := Until(t.Context(), 5*time.Second, "third try", func() error {
		if n.Add(1) < 3 {
			return errors.New("not yet")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n.Load() != 3 {
		t.Fatalf("tried %d times, want 3", n.Load())
	}
}

func TestEveryTimesOutWithWhatHowLongAndTheLastError(t *testing.T) {
	down := errors.New("still down")
	var n atomic.Int32
	err := Every(t.Context(), time.Millisecond, 30*time.Millisecond, "the server up", func() error {
		n.Add(1)
		return down
	})
	if err == nil {
		t.Fatal("an attempt that never worked returned no error")
	}
	if want := "the server up: not within 30ms: still down"; err.Error() != want {
		t.Fatalf("error %q, want %q", err, want)
	}
	if !errors.Is(err, down) {
		t.Fatalf("error %v does not wrap the last error", err)
	}
	if n.Load() < 5 {
		t.Fatalf("tried %d times every millisecond for 30 ms, want it retried at that pace", n.Load())
	}
}

func TestUntilStopsWhenTheContextEnds(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	var n atomic.Int32
	err := Until(ctx, time.Hour, "the server up", func() error {
		if n.Add(1) == 2 {
			cancel()
		}
		return errors.New("still down")
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("error %v does not wrap context.Canceled", err)
	}
	if !strings.Contains(err.Error(), "the server up") || !strings.Contains(err.Error(), "still down") {
		t.Fatalf("error %q names neither what was waited for nor the last error", err)
	}
	if n.Load() != 2 {
		t.Fatalf("tried %d times after the context ended, want no try after it", n.Load())
	}
}
