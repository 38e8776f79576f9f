package health

import (
	"time"

	"github.com/fanpbx/fan/pkg/events"
)

// Decisive reports whether the next run decides: one more failure would
// bring the check down, and at least one failure is already behind it (with
// fall 1 no run has that evidence, so none is decisive).
func (t *Tracker) Decisive() bool {
	failures := 0
	if t.run > 0 && !t.runOK {
		failures = t.run
	}
	return t.state != events.HealthDown && failures > 0 && failures+1 >= t.fall
}

// RoundTrips estimates how long the target takes to answer, the way TCP
// estimates its retransmission timeout (RFC 6298): a smoothed round trip
// and its mean deviation, both updated by every answered run. The zero
// value has seen nothing.
//
// It exists for the decisive probe: once fall-1 probes in a row went
// unanswered, waiting the whole timeout for the last one adds the timeout's
// margin to every verdict on a dead target, although the answers seen so
// far say how long an answer takes. Waiting the estimate instead puts the
// verdict fall intervals plus that estimate after the last answer, the same
// shape as a VRRP backup's master-down interval. One slow answer raises the
// estimate at once (four deviations), and quiet answers lower it only
// gradually, so a target that slows down is given the longer wait before
// its probes start timing out.
type RoundTrips struct {
	srtt, rttvar time.Duration
	seen         bool
}

// Observe adds the duration of an answered run.
func (r *RoundTrips) Observe(d time.Duration) {
	if d < 0 {
		return
	}
	if !r.seen {
		r.srtt, r.rttvar, r.seen = d, d/2, true
		return
	}
	dev := r.srtt - d
	if dev < 0 {
		dev = -dev
	}
	r.rttvar = (3*r.rttvar + dev) / 4
	r.srtt = (7*r.srtt + d) / 8
}

// Wait is how long the decisive probe waits: the smoothed round trip plus
// four deviations or margin, whichever is more (RFC 6298's RTO, with margin
// as its clock granularity), at most most. Before any answer it is most:
// nothing says an answer comes sooner.
func (r *RoundTrips) Wait(margin, most time.Duration) time.Duration {
	if !r.seen {
		return most
	}
	return min(most, r.srtt+max(margin, 4*r.rttvar))
}
