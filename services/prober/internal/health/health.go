// Package health turns a stream of check results into health transitions
// with hysteresis: a check goes up after rise successes in a row and down
// after fall failures in a row, so one lost packet never moves an address.
// It is pure: results and times in, transitions out.
package health

import "github.com/fanpbx/fan/pkg/events"

// Tracker follows one check. The zero value is not usable; use New.
type Tracker struct {
	rise, fall int
	state      events.Health
	// run counts consecutive results that agree with each other; runOK says
	// which way.
	run   int
	runOK bool
	// recent holds the last max(rise, fall) results, oldest first: the
	// evidence a transition carries.
	recent []events.Evidence
}

// New starts a tracker in the unknown state.
func New(rise, fall int) *Tracker {
	return &Tracker{rise: rise, fall: fall, state: events.HealthUnknown, recent: make([]events.Evidence, 0, max(rise, fall))}
}

// State is the current health.
func (t *Tracker) State() events.Health { return t.state }

// Transition is a crossing of rise or fall.
type Transition struct {
	From, To    events.Health
	Consecutive int
	Evidence    []events.Evidence
}

// Observe feeds one result; it returns a transition when the state changes.
func (t *Tracker) Observe(e events.Evidence) (Transition, bool) {
	if len(t.recent) == cap(t.recent) {
		copy(t.recent, t.recent[1:])
		t.recent = t.recent[:len(t.recent)-1]
	}
	t.recent = append(t.recent, e)
	if t.run > 0 && e.OK == t.runOK {
		t.run++
	} else {
		t.run, t.runOK = 1, e.OK
	}
	var to events.Health
	switch {
	case e.OK && t.state != events.HealthUp && t.run >= t.rise:
		to = events.HealthUp
	case !e.OK && t.state != events.HealthDown && t.run >= t.fall:
		to = events.HealthDown
	default:
		return Transition{}, false
	}
	n := min(t.run, len(t.recent))
	ev := make([]events.Evidence, n)
	copy(ev, t.recent[len(t.recent)-n:])
	tr := Transition{From: t.state, To: to, Consecutive: t.run, Evidence: ev}
	t.state = to
	return tr, true
}
