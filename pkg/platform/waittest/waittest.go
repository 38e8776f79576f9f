// Package waittest waits in tests for a condition rather than sleeping a
// guessed time: the test goes on as soon as the condition holds and fails,
// naming what it waited for, when it has not within the test's patience.
package waittest

import (
	"testing"
	"time"
)

// poll is how often the condition is looked at; a condition that sends a
// request (is it up yet?) sends about fifty a second.
const poll = 20 * time.Millisecond

// Until polls cond until it holds, and fails the test, naming what it
// waited for, when it has not within the given time. It returns how long
// the condition took, for a test that reports it.
func Until(t testing.TB, within time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	deadline := start.Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, within)
		}
		time.Sleep(poll)
	}
	return time.Since(start)
}

// Succeeds is Until for an attempt that says why it has not worked yet:
// it calls try until it returns nil, and fails the test with what it waited
// for and the last error when that has not happened within the given time.
func Succeeds(t testing.TB, within time.Duration, what string, try func() error) time.Duration {
	t.Helper()
	start := time.Now()
	deadline := start.Add(within)
	for {
		err := try()
		if err == nil {
			return time.Since(start)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v: %v", what, within, err)
		}
		time.Sleep(poll)
	}
}
