package ipexec

import (
	"context"
	"time"
)

// condResyncIncomplete is raised while a re-sync (at start, after the bus
// came back) has not aligned every group with the arbiter's state: the
// state could not be read, or an address could not be recorded, taken or
// released. It clears at the first complete re-sync.
const condResyncIncomplete = "resync_incomplete"

// Re-sync retries back off from resyncRetryMin, doubling to resyncRetryMax,
// for as long as it takes. The ipmover never exits over it: a stopped
// ipmover releases every address, and what to do with the addresses while
// the bus is unreachable is the bus_loss policy's decision, not this one's.
// The cap is short because a retry is cheap (a key listing and a read per
// group) and a holder that has not re-synced may be a second holder.
const (
	resyncRetryMin = 250 * time.Millisecond
	resyncRetryMax = time.Second
)

// resyncOrRetry re-syncs once and, if that was incomplete, raises
// resync_incomplete and leaves the rest to runResyncRetries.
func (s *Service) resyncOrRetry(ctx context.Context, why string) {
	err := s.resync(ctx, why)
	if err == nil {
		s.conds.Clear(condResyncIncomplete)
		return
	}
	if ctx.Err() != nil {
		return
	}
	s.resyncLater(why, why+": "+err.Error())
}

// resyncLater raises resync_incomplete (saying detail) and has
// runResyncRetries re-sync soon (resyncRetryMin), then with backoff until
// one completes.
func (s *Service) resyncLater(why, detail string) {
	s.conds.Raise(condResyncIncomplete, detail)
	select {
	case s.resyncRetry <- why:
	default: // a retry is already due
	}
}

// runResyncRetries retries an incomplete re-sync until one completes.
func (s *Service) runResyncRetries(ctx context.Context) {
	wait := resyncRetryMin
	t := time.NewTimer(time.Hour)
	t.Stop()
	var why string
	for {
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case w := <-s.resyncRetry:
			if why == "" {
				wait = resyncRetryMin
				t.Reset(wait)
			}
			why = w
		case <-t.C:
			err := s.resync(ctx, why+" (retry)")
			if ctx.Err() != nil {
				return
			}
			if err == nil {
				s.conds.Clear(condResyncIncomplete)
				s.log.Info("resync complete", "why", why)
				why = ""
				continue
			}
			s.conds.Raise(condResyncIncomplete, why+": "+err.Error())
			wait = min(2*wait, resyncRetryMax)
			t.Reset(wait)
		}
	}
}
