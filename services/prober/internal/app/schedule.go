package app

import (
	"context"
	"math/rand/v2"
	"time"
)

// epoch anchors every check's slot grid, so checks with the same slot size
// share boundaries.
var epoch = time.Now()

// maxSlot is the widest a run's start is rounded up to (timer slack). Runs
// that fall into the same slot become due at the same instant, so the
// runtime wakes a thread once for all of them instead of once per run: 200
// checks at 200 ms with jitter are 1,000 scattered wake-ups a second, at most
// 100 slots. In the cost benchmark this saved about a fifth of the prober's
// CPU (5 ms slots a little less). A slot is at most 1/16 of the interval;
// it delays a run by less than one slot and never changes a check's period.
const maxSlot = 10 * time.Millisecond

// schedule says when a check runs next: every interval (a missed turn is
// skipped, as with a ticker), plus a fresh random jitter each turn, rounded
// up to the check's slot. One timer per check, reset each turn: the jitter
// costs no extra timer and no extra wake-up.
type schedule struct {
	interval, jitter, slot time.Duration
	base                   time.Time // the turn the next run belongs to
	t                      *time.Timer
}

func newSchedule(interval, jitter time.Duration) *schedule {
	return &schedule{interval: interval, jitter: jitter, slot: min(maxSlot, interval/16), base: time.Now()}
}

// due is when the current turn runs: its base, plus jitter, rounded up to
// the slot grid.
func (s *schedule) due() time.Time {
	at := s.base
	if s.jitter > 0 {
		at = at.Add(rand.N(s.jitter))
	}
	if s.slot > 0 {
		off := at.Sub(epoch)
		if r := off % s.slot; r != 0 {
			at = at.Add(s.slot - r)
		}
	}
	return at
}

// wait blocks until the current turn is due; false when ctx ended first.
func (s *schedule) wait(ctx context.Context) bool {
	d := time.Until(s.due())
	if d <= 0 {
		return ctx.Err() == nil
	}
	if s.t == nil {
		s.t = time.NewTimer(d)
	} else {
		s.t.Reset(d)
	}
	select {
	case <-ctx.Done():
		return false
	case <-s.t.C:
		return true
	}
}

// next moves to the turn after the one that just ran. Like a ticker, a turn
// whose time has passed still runs (at once), but only the latest one: turns
// missed entirely are skipped, so runs never overlap or pile up.
func (s *schedule) next() {
	s.base = s.base.Add(s.interval)
	if late := time.Since(s.base); late >= s.interval {
		s.base = s.base.Add(late / s.interval * s.interval)
	}
}

func (s *schedule) stop() {
	if s.t != nil {
		s.t.Stop()
	}
}
