// Package waittest waits for a condition rather than sleeping a guessed
// time: the test goes on as soon as the condition holds and, when it has
// not within the given patience, fails naming what was waited for, for how
// long, and why the condition did not hold. Code that returns errors
// instead of holding a testing.T (the lab's harness) waits with package
// poll, which these helpers are built on.
package waittest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/platform/poll"
)

// errNotYet is the attempt Until makes of a condition that does not hold.
var errNotYet = errors.New("not yet")

// Until polls cond until it holds, and fails the test, naming what it
// waited for, when it has not within the given time. It returns how long
// the condition took, for a test that reports it.
func Until(t testing.TB, within time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	if poll.Until(context.Background(), within, what, func() error {
		if cond() {
			return nil
		}
		return errNotYet
	}) != nil {
		t.Fatalf("%s: not within %v", what, within)
	}
	return time.Since(start)
}

// Succeeds is Until for an attempt that says why it has not worked yet:
// it calls try until it returns nil, and fails the test with what it waited
// for and the last error when that has not happened within the given time.
func Succeeds(t testing.TB, within time.Duration, what string, try func() error) time.Duration {
	t.Helper()
	start := time.Now()
	if err := poll.Until(context.Background(), within, what, try); err != nil {
		t.Fatalf("%v", err)
	}
	return time.Since(start)
}
