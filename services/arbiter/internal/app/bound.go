package app

import "time"

// Backoff between attempts while a replica holds the lease but cannot
// command: short, because every second here is a second without failover.
const (
	retryFirst = 100 * time.Millisecond
	retryMax   = time.Second
)

// bound tracks one way a replica can hold the lease without commanding
// (its state unreadable, its decisions unpersistable): since when it
// lasts, when to try again, and whether it has lasted too long. The owner
// retries when due, and gives the lease up once over says so. Pure, so the
// bound is tested with a fake clock.
type bound struct {
	within time.Duration // give up after this long
	since  time.Time     // first failure; zero while not failing
	next   time.Time     // next attempt
	wait   time.Duration // current backoff
}

// failing reports whether an attempt has failed and none succeeded since.
func (b *bound) failing() bool { return !b.since.IsZero() }

// due reports whether the next attempt should run now.
func (b *bound) due(now time.Time) bool { return b.failing() && !now.Before(b.next) }

// failed records a failed attempt at now and reports whether the bound is
// spent (the owner then gives up its role).
func (b *bound) failed(now time.Time) (over bool) {
	if !b.failing() {
		b.since, b.wait = now, retryFirst
	} else {
		b.wait = min(2*b.wait, retryMax)
	}
	// The last attempt falls on the bound itself, not a backoff past it.
	b.next = now.Add(b.wait)
	if limit := b.since.Add(b.within); b.next.After(limit) {
		b.next = limit
	}
	return now.Sub(b.since) >= b.within
}

// reset forgets the failure: the attempt succeeded or the role is gone.
func (b *bound) reset() { b.since, b.next, b.wait = time.Time{}, time.Time{}, 0 }
