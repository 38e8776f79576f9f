// Package waittest waits for a condition rather than sleeping a guessed
// time: the caller goes on as soon as the condition holds and, when it has
// not within the given patience, learns what was waited for, for how long,
// and why the condition did not hold. Until and Succeeds fail a test; Poll
// returns an error, for the lab's harness code, which starts real
// processes and reports errors instead of holding a testing.T.
package waittest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
)

// poll is how often the condition is looked at; a condition that sends a
// request (is it up yet?) sends about fifty a second. A slower attempt
// paces itself: the next one starts an interval after the last returned.
const poll = 20 * time.Millisecond

// Poll calls try until it returns nil, and returns nil then. When try has
// not succeeded within the given time, or ctx ends first, it returns an
// error naming what it waited for, how long, and try's last error (both it
// and ctx's error are wrapped, for errors.Is).
func Poll(ctx context.Context, within time.Duration, what string, try func() error) error {
	return PollEvery(ctx, poll, within, what, try)
}

// PollEvery is Poll looking every given interval instead of the package's:
// finer where a few milliseconds are the figure being waited on, coarser
// where each attempt costs the system under test (a large dump over its
// management interface, a burst of registrations from many phones).
func PollEvery(ctx context.Context, every, within time.Duration, what string, try func() error) error {
	start := time.Now()
	deadline := start.Add(within)
	stopped := func(err error) error {
		return fmt.Errorf("%s: %w after %v: %w", what, context.Cause(ctx), time.Since(start).Round(time.Millisecond), err)
	}
	for {
		err := try()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return stopped(err)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: not within %v: %w", what, within, err)
		}
		t := time.NewTimer(every)
		select {
		case <-ctx.Done():
			t.Stop()
			return stopped(err)
		case <-t.C:
		}
	}
}

// errNotYet is the attempt Until makes of a condition that does not hold.
var errNotYet = errors.New("not yet")

// Until polls cond until it holds, and fails the test, naming what it
// waited for, when it has not within the given time. It returns how long
// the condition took, for a test that reports it.
func Until(t testing.TB, within time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	if Poll(context.Background(), within, what, func() error {
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
	if err := Poll(context.Background(), within, what, try); err != nil {
		t.Fatalf("%v", err)
	}
	return time.Since(start)
}
