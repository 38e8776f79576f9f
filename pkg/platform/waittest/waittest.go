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

// Until polls cond until it holds, and fails the test when it has not
// within the given time.
func Until(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, within)
		}
		time.Sleep(poll)
	}
}
