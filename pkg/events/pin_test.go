package events

import (
	"errors"
	"testing"
	"time"
)

func init() {
	since := time.Date(2026, 12, 8, 2, 10, 0, 0, time.UTC)
	addSamples(map[Type]Payload{
		TypeGroupPin: GroupPin{Group: "pbx", Stage: PinEnded, PinFacts: PinFacts{Node: "n2", Operator: "alice", Reason: "rolling upgrade",
			RequestID: "0193a1b2-0000-7000-8000-000000000001", ActionID: "0193a1b2-0000-7000-8000-000000000002",
			Since: since, Until: since.Add(2 * time.Hour)}, End: PinExpired,
			Why:      "pin of pbx to n2 by alice (rolling upgrade) ended at its end, 2026-12-08T04:10:00Z",
			CausedBy: []string{"0193a1b2-0000-7000-8000-000000000003"}, Trigger: TriggerTick},
		TypeLeadersHold: LeadersHold{Stage: HoldStarted, LeadersHoldFacts: LeadersHoldFacts{Operator: "alice", Reason: "witness reboot",
			Server: "nats-pbx-b", Since: since, Until: since.Add(30 * time.Minute), HeldSince: since,
			RequestID: "0193a1b2-0000-7000-8000-000000000004", ActionID: "0193a1b2-0000-7000-8000-000000000005"},
			Why:      "leaders held on nats-pbx-b by alice (witness reboot) until 2026-12-08T02:40:00Z",
			CausedBy: []string{"0193a1b2-0000-7000-8000-000000000005"}},
	})
}

func TestGroupPinSubjectAndValidation(t *testing.T) {
	p := samples()[TypeGroupPin].(GroupPin)
	e := goldenEnvelope(t, p)
	if got := Subject(e, p); got != "fan.evt.lab.arbiter.pbx.pin" {
		t.Fatalf("subject %q", got)
	}
	started := p
	started.Stage, started.End = PinStarted, ""
	if err := started.Validate(); err != nil {
		t.Fatalf("a start: %v", err)
	}
	bad := map[string]func(*GroupPin){
		"no stage":             func(p *GroupPin) { p.Stage = "" },
		"an end on a start":    func(p *GroupPin) { p.Stage = PinStarted },
		"an end of no kind":    func(p *GroupPin) { p.End = "later" },
		"no node":              func(p *GroupPin) { p.Node = "" },
		"no operator":          func(p *GroupPin) { p.Operator = "" },
		"no request":           func(p *GroupPin) { p.RequestID = "" },
		"no since":             func(p *GroupPin) { p.Since = time.Time{} },
		"until before since":   func(p *GroupPin) { p.Until = p.Since.Add(-time.Minute) },
		"until beyond a month": func(p *GroupPin) { p.Until = p.Since.Add(MaxPinFor + time.Second) },
		"no causes":            func(p *GroupPin) { p.CausedBy = nil },
		"no why":               func(p *GroupPin) { p.Why = "" },
	}
	for name, mut := range bad {
		q := p
		mut(&q)
		if err := q.Validate(); !errors.Is(err, ErrInvalidField) && !errors.Is(err, ErrMissingField) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

func TestOperatorRequestLifetime(t *testing.T) {
	at := time.Date(2026, 12, 8, 6, 0, 0, 0, time.UTC)
	ok := []OperatorRequest{
		{Verb: OpSwitchover, Node: "n2", Operator: "a", ForMS: (2 * time.Hour).Milliseconds()},
		{Verb: OpSwitchover, Node: "n2", Operator: "a", Until: at},
		{Verb: OpUnpin, Group: "pbx", Operator: "a"},
		{Verb: OpUnpin, Operator: "a"},
		{Verb: OpLeadersHold, Operator: "a", ForMS: (30 * time.Minute).Milliseconds()},
		{Verb: OpLeadersHold, Operator: "a", Until: at, Server: "nats-pbx-b"},
		{Verb: OpLeadersRelease, Operator: "a"},
	}
	for _, r := range ok {
		if err := r.Validate(); err != nil {
			t.Errorf("%+v: %v", r, err)
		}
	}
	bad := map[string]OperatorRequest{
		"pin for and until":        {Verb: OpSwitchover, Node: "n2", Operator: "a", ForMS: 60_000, Until: at},
		"pin for 10s":              {Verb: OpSwitchover, Node: "n2", Operator: "a", ForMS: 10_000},
		"pin for a year":           {Verb: OpSwitchover, Node: "n2", Operator: "a", ForMS: (365 * 24 * time.Hour).Milliseconds()},
		"a cancel with a pin":      {Verb: OpSwitchover, Operator: "a", Cancel: true, ForMS: 60_000},
		"a failback with a pin":    {Verb: OpFailback, Operator: "a", Reason: "x", ForMS: 60_000},
		"unpin a node":             {Verb: OpUnpin, Node: "n2", Operator: "a"},
		"hold without an end":      {Verb: OpLeadersHold, Operator: "a"},
		"hold for 25h":             {Verb: OpLeadersHold, Operator: "a", ForMS: (25 * time.Hour).Milliseconds()},
		"hold of a group":          {Verb: OpLeadersHold, Group: "pbx", Operator: "a", ForMS: 60_000},
		"hold on a server.name":    {Verb: OpLeadersHold, Operator: "a", ForMS: 60_000, Server: "nats.pbx"},
		"a server on a switchover": {Verb: OpSwitchover, Node: "n2", Operator: "a", Server: "nats-pbx-b"},
		"release with an end":      {Verb: OpLeadersRelease, Operator: "a", ForMS: 60_000},
		"negative for":             {Verb: OpSwitchover, Node: "n2", Operator: "a", ForMS: -1},
	}
	for name, r := range bad {
		if err := r.Validate(); !errors.Is(err, ErrInvalidField) && !errors.Is(err, ErrMissingField) {
			t.Errorf("%s: %v", name, err)
		}
	}
}
