package view

import (
	"fmt"
	"time"

	"github.com/fanpbx/fan/pkg/events"
)

// HoldNote says what the leaders hold record says now: the hold in force
// (who, where, why, since and until when, and what it suspends), or that
// none is, with how the last one ended.
func HoldNote(r *events.LeadersHoldRecord, now time.Time) string {
	const none = "no leaders hold: the steward keeps the raft leaders on bus.leader_servers, and a standby replica hands the lease back"
	switch {
	case r == nil || r.Since.IsZero():
		return none
	case !r.InForce(now):
		ended := r.EndedAt
		why := r.Why
		if ended.IsZero() { // its end came; the leader records it within a second
			ended, why = r.Until, "ended at its end"
		}
		return fmt.Sprintf("%s (the last hold, by %s: %s; %s ago)", none, r.Operator, why, HumanDuration(now.Sub(ended)))
	}
	return "LEADERS HELD " + heldFor(r, now)
}

// HoldNotes are the status lines of the leaders holds in force.
func HoldNotes(recs []Keyed[events.LeadersHoldRecord], now time.Time) []string {
	var out []string
	for _, k := range recs {
		if r := k.Value; r.InForce(now) {
			out = append(out, "leaders: HELD "+heldFor(&r, now))
		}
	}
	return out
}

func heldFor(r *events.LeadersHoldRecord, now time.Time) string {
	where := "where they are"
	if r.Server != "" {
		where = "on " + r.Server
	}
	s := fmt.Sprintf("%s by %s", where, r.Operator)
	if r.Reason != "" {
		s += fmt.Sprintf(" (%q)", r.Reason)
	}
	s += fmt.Sprintf(" since %s (%s ago) until %s (in %s)", Time(r.Since), HumanDuration(now.Sub(r.Since)), Time(r.Until),
		HumanDuration(r.Until.Sub(now)))
	if r.HeldSince.Before(r.Since) {
		s += fmt.Sprintf(", held without a gap since %s", Time(r.HeldSince))
	}
	return s + ": the steward moves no leader back to bus.leader_servers and a standby replica that leads keeps the lease; fanctl leaders release ends it"
}
