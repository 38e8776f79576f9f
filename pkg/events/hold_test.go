package events

import (
	"errors"
	"testing"
	"time"
)

func TestLeadersHoldSubjectAndValidation(t *testing.T) {
	h := samples()[TypeLeadersHold].(LeadersHold)
	e := goldenEnvelope(t, h)
	if got := Subject(e, h); got != "fan.evt.lab.arbiter.leaders_hold" {
		t.Fatalf("subject %q", got)
	}
	if got := LeadersHoldKey("lab"); got != "arbiter.lab.leaders_hold" {
		t.Fatalf("key %q", got)
	}
	ended := h
	ended.Stage, ended.End = HoldEnded, HoldBroken
	if err := ended.Validate(); err != nil {
		t.Fatalf("an end: %v", err)
	}
	bad := map[string]func(*LeadersHold){
		"no stage":              func(h *LeadersHold) { h.Stage = "" },
		"an end on a start":     func(h *LeadersHold) { h.End = HoldExpired },
		"no operator":           func(h *LeadersHold) { h.Operator = "" },
		"longer than a day":     func(h *LeadersHold) { h.Until = h.Since.Add(MaxLeadersHold + time.Second) },
		"until before since":    func(h *LeadersHold) { h.Until = h.Since },
		"held since after":      func(h *LeadersHold) { h.HeldSince = h.Since.Add(time.Second) },
		"no request":            func(h *LeadersHold) { h.RequestID = "" },
		"a server with a space": func(h *LeadersHold) { h.Server = "nats pbx" },
		"no causes":             func(h *LeadersHold) { h.CausedBy = nil },
	}
	for name, mut := range bad {
		q := h
		mut(&q)
		if err := q.Validate(); !errors.Is(err, ErrInvalidField) && !errors.Is(err, ErrMissingField) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

func TestLeadersHoldRecordInForce(t *testing.T) {
	h := samples()[TypeLeadersHold].(LeadersHold)
	r := LeadersHoldRecord{LeadersHoldFacts: h.LeadersHoldFacts, EventID: "x"}
	for _, c := range []struct {
		at   time.Time
		want bool
	}{{r.Since, true}, {r.Until.Add(-time.Nanosecond), true}, {r.Until, false}} {
		if got := r.InForce(c.at); got != c.want {
			t.Errorf("InForce(%s) = %v, want %v", c.at, got, c.want)
		}
	}
	r.EndedAt, r.End = r.Since.Add(time.Minute), HoldReleased
	if r.InForce(r.Since.Add(2 * time.Minute)) {
		t.Error("a released hold is in force")
	}
	if (LeadersHoldRecord{}).InForce(r.Since) {
		t.Error("no hold is in force")
	}
}
