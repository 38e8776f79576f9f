package waittest

import (
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestUntilReturnsOnceTheConditionHolds(t *testing.T) {
	var n atomic.Int32
	Until(t, 5*time.Second, "three looks", func() bool { return n.Add(1) >= 3 })
	if n.Load() != 3 {
		t.Fatalf("looked %d times, want 3", n.Load())
	}
}

// fatal records a failure instead of ending the test that checks it.
type fatal struct {
	testing.TB
	failed string
}

func (f *fatal) Helper() {}
func (f *fatal) Fatalf(format string, args ...any) {
	f.failed = fmt.Sprintf(format, args...)
	panic(f)
}

func TestUntilFailsWhenTheConditionNeverHolds(t *testing.T) {
	f := &fatal{TB: t}
	func() {
		defer func() {
			if r := recover(); r != nil && r != any(f) {
				panic(r)
			}
		}()
		Until(f, 30*time.Millisecond, "never", func() bool { return false })
	}()
	if f.failed == "" {
		t.Fatal("a condition that never held did not fail the test")
	}
}

func TestSucceedsFailsWithTheLastError(t *testing.T) {
	f := &fatal{TB: t}
	var n atomic.Int32
	func() {
		defer func() {
			if r := recover(); r != nil && r != any(f) {
				panic(r)
			}
		}()
		Succeeds(f, 30*time.Millisecond, "never", func() error { n.Add(1); return errors.New("still down") })
	}()
	if f.failed == "" {
		t.Fatal("an attempt that never worked did not fail the test")
	}
	if !strings.Contains(f.failed, "never") || !strings.Contains(f.failed, "still down") {
		t.Fatalf("failure %q names neither what was waited for nor the last error", f.failed)
	}
	if n.Load() < 2 {
		t.Fatalf("tried %d times, want it retried", n.Load())
	}
}

func TestSucceedsReturnsOnceTheAttemptWorks(t *testing.T) {
	var n atomic.Int32
	Succeeds(t, 5*time.Second, "third try", func() error {
		if n.Add(1) < 3 {
			return errors.New("not yet")
		}
		return nil
	})
	if n.Load() != 3 {
		t.Fatalf("tried %d times, want 3", n.Load())
	}
}
