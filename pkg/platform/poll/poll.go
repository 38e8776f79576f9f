// Package poll waits for an attempt to succeed rather than sleeping a
// guessed time: the caller goes on as soon as the attempt works and, when
// it has not within the given patience, gets an error naming what was
// waited for, for how long, and why the last attempt failed. It returns
// errors instead of failing a test, so the lab's harness programs use it
// without linking the testing package; waittest builds its test helpers
// on it.
package poll

import (
	"context"
	"fmt"
	"time"
)

// Interval is how often Until tries; an attempt that sends a request (is it
// up yet?) sends about fifty a second. A slower attempt paces itself: the
// next one starts an interval after the last returned.
const Interval = 20 * time.Millisecond

// Until calls try until it returns nil, and returns nil then. When try has
// not succeeded within the given time, or ctx ends first, it returns an
// error naming what it waited for, how long, and try's last error (both it
// and ctx's error are wrapped, for errors.Is).
func Until(ctx context.Context, within time.Duration, what string, try func() error) error {
	return Every(ctx, Interval, within, what, try)
}

// Every is Until trying every given interval instead of the package's:
// finer where a few milliseconds are the figure being waited on, coarser
// where each attempt costs the system under test (a large dump over its
// management interface, a burst of registrations from many phones).
func Every(ctx context.Context, every, within time.Duration, what string, try func() error) error {
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
