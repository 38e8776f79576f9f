package view_test

import (
	"testing"
	"time"

	"github.com/fanpbx/fan/cmd/internal/view"
	"github.com/fanpbx/fan/pkg/events"
)

func TestDecisionSummaries(t *testing.T) {
	for _, c := range []struct {
		d    events.ArbiterDecision
		want string
	}{
		{events.ArbiterDecision{Group: "pbx", Action: events.ActionHold, Reason: "waiting"}, "pbx HOLD (no holder): waiting"},
		{events.ArbiterDecision{Group: "pbx", Action: events.ActionHold, From: "n1", Reason: "n2 silent"}, "pbx HOLD (holder n1): n2 silent"},
		{events.ArbiterDecision{Group: "pbx", Action: events.ActionPlace, To: "n1", Reason: "first"}, "pbx PLACE (none)->n1: first"},
		{events.ArbiterDecision{Group: "pbx", Action: events.ActionFailover, From: "n1", To: "n2", Reason: "down"}, "pbx FAILOVER n1->n2: down"},
	} {
		if got := view.Summary(&c.d); got != c.want {
			t.Errorf("Summary = %q, want %q", got, c.want)
		}
	}
}

// A target's confirmation says what it applied: the tree, the counts and
// the generation, and a failure when there is one.
func TestReplicationAppliedSummaries(t *testing.T) {
	ok := events.ReplicationApplied{Node: "n2", Source: "n1", Group: "pbx", Tree: "voicemail", Epoch: 3, Generation: 7,
		Digest: "d", Files: 12, Bytes: 40960, Deleted: 1, DurationMS: 3.24}
	failed := ok
	failed.Files, failed.Bytes, failed.Deleted, failed.Conflicts = 10, 2048, 0, 2
	failed.Error, failed.Missing = "fetch: timeout", []string{"aa", "bb"}
	for _, c := range []struct {
		a    events.ReplicationApplied
		want string
	}{
		{ok, "n1->n2 voicemail gen=7 files=12 bytes=40960 deleted=1 in 3.2ms"},
		{failed, "n1->n2 voicemail gen=7 files=10 bytes=2048 deleted=0 conflicts=2 in 3.2ms FAILED: fetch: timeout (missing 2)"},
	} {
		if got := view.Summary(&c.a); got != c.want {
			t.Errorf("Summary = %q, want %q", got, c.want)
		}
	}
}

func TestHumanDuration(t *testing.T) {
	for d, want := range map[time.Duration]string{
		112*time.Hour + 35*time.Minute:                 "4d16h35m",
		3*time.Hour - 200*time.Millisecond:             "3h0m",
		80 * time.Minute:                               "1h20m",
		35*time.Minute + 12*time.Second:                "35m12s",
		1234 * time.Millisecond:                        "1.2s",
		350 * time.Millisecond:                         "350ms",
		-(2*time.Hour + 5*time.Minute):                 "-2h5m",
		24*time.Hour + 30*time.Second:                  "1d0h1m",
		6*24*time.Hour + 23*time.Hour + 59*time.Minute: "6d23h59m",
	} {
		if got := view.HumanDuration(d); got != want {
			t.Errorf("HumanDuration(%v) = %q, want %q", d, got, want)
		}
	}
}

// A hold the arbiter cannot resolve alone says so in the situation lines,
// in the words an operator greps for; an ordinary hold does not.
func TestNotesSayWhenAHumanIsNeeded(t *testing.T) {
	now := time.Date(2026, 12, 1, 22, 0, 0, 0, time.UTC)
	groups := []events.GroupStatus{
		{Group: "pbx", Holder: "n1", UpdatedAt: now, NeedsHuman: true, Frozen: "3 moves in the last hour",
			Situation: "frozen after 3 moves in an hour; n1 keeps the address"},
		{Group: "fax", Holder: "f1", UpdatedAt: now, Situation: "holding: f1 is preferred and healthy"},
		{Group: "lab", UpdatedAt: now, NeedsHuman: true},
	}
	got := view.Notes(groups, nil, now)
	want := map[string]bool{
		"pbx: FROZEN: 3 moves in the last hour":                                     true,
		"pbx: NEEDS A HUMAN: frozen after 3 moves in an hour; n1 keeps the address": true,
		"fax: holding: f1 is preferred and healthy":                                 true,
		"lab: NEEDS A HUMAN": true,
	}
	if len(got) != len(want) {
		t.Fatalf("notes %q, want %d lines", got, len(want))
	}
	for _, n := range got {
		if !want[n] {
			t.Errorf("unexpected note %q in %q", n, got)
		}
	}
}
