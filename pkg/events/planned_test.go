package events

import (
	"errors"
	"testing"
	"time"
)

func init() {
	two := 2
	addSamples(map[Type]Payload{
		TypePlannedMove: PlannedMove{Group: "pbx", Stage: PlannedWaiting, PlannedFacts: PlannedFacts{Verb: OpSwitchover, From: "n1", To: "n2",
			Operator: "alice", RequestID: "0193a1b2-0000-7000-8000-000000000001",
			RequestedAt: time.Date(2026, 11, 30, 14, 0, 0, 0, time.UTC), Deadline: time.Date(2026, 11, 30, 14, 30, 0, 0, time.UTC),
			Drain: DrainWait, MaxChannels: 0, Channels: &two, Calls: &HolderCalls{Node: "n1", Summary: "0193a1b2-0000-7000-8000-000000000003",
				At: time.Date(2026, 11, 30, 14, 0, 0, 0, time.UTC), Channels: 6, CarriedChannels: 4, Calls: 3, Carriable: 2, Anchored: 1}},
			Reason:   "switchover to n2 waits for n1 to drain: n1 has 6 active channels, 4 of them in 2 calls carried across: waits for 2 (limit 0)",
			CausedBy: []string{"0193a1b2-0000-7000-8000-000000000002"}},
	})
}

func TestPlannedMoveSubjectAndValidation(t *testing.T) {
	p := samples()[TypePlannedMove].(PlannedMove)
	e := goldenEnvelope(t, p)
	if got := Subject(e, p); got != "fan.evt.lab.arbiter.pbx.planned" {
		t.Fatalf("subject %q", got)
	}
	bad := []func(*PlannedMove){
		func(p *PlannedMove) { p.Stage = "later" },
		func(p *PlannedMove) { p.Verb = OpFailback },
		func(p *PlannedMove) { p.From = "" },
		func(p *PlannedMove) { p.RequestID = "" },
		func(p *PlannedMove) { p.Drain = "" },
		func(p *PlannedMove) { p.CausedBy = nil },
		func(p *PlannedMove) { p.Reason = "" },
	}
	for i, mut := range bad {
		q := p
		mut(&q)
		if err := q.Validate(); err == nil {
			t.Errorf("case %d: %+v validated", i, q)
		}
	}
}

func TestOperatorRequestDrain(t *testing.T) {
	ok := []OperatorRequest{
		{Verb: OpSwitchover, Node: "n2", Operator: "a"},
		{Verb: OpSwitchover, Node: "n2", Operator: "a", Drain: DrainForceAfter, WithinMS: 60_000},
		{Verb: OpNodeStandby, Node: "n1", Operator: "a", Drain: DrainNow},
		{Verb: OpSwitchover, Operator: "a", Cancel: true},
	}
	for _, r := range ok {
		if err := r.Validate(); err != nil {
			t.Errorf("%+v: %v", r, err)
		}
	}
	bad := []OperatorRequest{
		{Verb: OpSwitchover, Node: "n2", Operator: "a", Drain: "soon"},
		{Verb: OpFailback, Operator: "a", Reason: "x", Drain: DrainWait},
		{Verb: OpSwitchover, Node: "n2", Operator: "a", Drain: DrainNow, WithinMS: 60_000},
		{Verb: OpSwitchover, Node: "n2", Operator: "a", WithinMS: 10},
		{Verb: OpSwitchover, Node: "n2", Operator: "a", WithinMS: int64(25 * time.Hour / time.Millisecond)},
		{Verb: OpNodeStandby, Node: "n1", Operator: "a", Cancel: true},
		{Verb: OpSwitchover, Operator: "a"},
	}
	for _, r := range bad {
		if err := r.Validate(); !errors.Is(err, ErrInvalidField) && !errors.Is(err, ErrMissingField) {
			t.Errorf("%+v: %v", r, err)
		}
	}
}
