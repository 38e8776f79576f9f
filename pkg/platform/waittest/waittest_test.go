package waittest

import (
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
	f.failed = format
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
