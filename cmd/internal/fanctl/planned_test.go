package fanctl_test

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/fanpbx/fan/cmd/internal/fanctl"
	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/bus/bustest"
)

// TestStatusShowsAWaitingPlannedMove: who asked, since when, the holder's
// channels now and the deadline.
func TestStatusShowsAWaitingPlannedMove(t *testing.T) {
	now := time.Date(2026, 12, 1, 14, 10, 0, 0, time.Local)
	three := 3
	g := events.GroupStatus{Group: "pbx", Addresses: []string{"198.51.100.10/24"}, Holder: "n1", Epoch: 2, UpdatedAt: now,
		Nodes: map[string]events.NodeStatus{"n1": {Health: events.HealthUp}, "n2": {Health: events.HealthUp, Priority: 1}},
		Planned: &events.PlannedStatus{PlannedFacts: events.PlannedFacts{Verb: events.OpSwitchover, From: "n1", To: "n2", Operator: "alice",
			RequestedAt: now.Add(-10 * time.Minute), Deadline: now.Add(20 * time.Minute), Drain: events.DrainWait, Channels: &three}}}
	var out bytes.Buffer
	if err := fanctl.PrintStatus(&out, []events.GroupStatus{g}, nil, now); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"PLANNED switchover from n1 to n2 asked by alice at " + now.Add(-10*time.Minute).Format(time.RFC3339) + " (10m0s ago)",
		"3 active channels now (limit 0)", "deadline " + now.Add(20*time.Minute).Format(time.RFC3339) + " (in 20m0s), then gives up"} {
		if !strings.Contains(out.String(), want) {
			t.Fatalf("status lacks %q:\n%s", want, out.String())
		}
	}
	g.Planned.Channels, g.Planned.Drain = nil, events.DrainForceAfter
	out.Reset()
	_ = fanctl.PrintStatus(&out, []events.GroupStatus{g}, nil, now)
	if !strings.Contains(out.String(), "unknown active channels now") || !strings.Contains(out.String(), "then moves anyway") {
		t.Fatalf("status with an unknown count, force_after:\n%s", out.String())
	}
}

// TestExplainAPlannedMove: explain of the move shows the stage that
// decided it (with the channel count), the operator's action and the
// request as it was recorded.
func TestExplainAPlannedMove(t *testing.T) {
	s := bustest.Server(t)
	arb := bustest.Connect(t, s, bus.Identity{Cluster: "lab", Service: "arbiter", Node: "ctl"})
	ctx := context.Background()
	now := time.Now()
	req, err := arb.Emit(ctx, events.OperatorAction{Verb: events.OpSwitchover, Group: "pbx", Node: "n2", Operator: "alice", Reason: "kernel",
		Outcome: "requested; not yet decided", Stage: events.StageRequested})
	if err != nil {
		t.Fatal(err)
	}
	act, err := arb.Emit(ctx, events.OperatorAction{Verb: events.OpSwitchover, Group: "pbx", Node: "n2", Operator: "alice", Reason: "kernel",
		Accepted: true, Outcome: "switchover (drain wait): waits", Drain: events.DrainWait, WithinMS: 1_800_000}, events.CausedBy(req))
	if err != nil {
		t.Fatal(err)
	}
	zero := 0
	moved, err := arb.Emit(ctx, events.PlannedMove{Group: "pbx", Stage: events.PlannedMoved, PlannedFacts: events.PlannedFacts{Verb: events.OpSwitchover,
		From: "n1", To: "n2", Operator: "alice", RequestID: req.ID, RequestedAt: now, Deadline: now.Add(30 * time.Minute), Drain: events.DrainWait,
		Channels: &zero},
		Reason: "planned switchover of pbx from n1 to n2: n1 has 0 active channels (limit 0) after 4m12s", CausedBy: []string{act.ID}}, events.CausedBy(act))
	if err != nil {
		t.Fatal(err)
	}
	dec, err := arb.Emit(ctx, events.ArbiterDecision{Group: "pbx", Action: events.ActionSwitchover, From: "n1", To: "n2",
		Reason: "planned switchover", CausedBy: []string{moved.ID}}, events.CausedBy(moved))
	if err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	if code := fanctl.Main([]string{"--url", s.ClientURL(), "--cluster", "lab", "explain", dec.ID}, &out, &errb, "t"); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	want := []string{"SWITCHOVER n1->n2", "pbx MOVED: planned switchover of pbx from n1 to n2: n1 has 0 active channels",
		"switchover (drain wait within 30m0s) pbx n2 by alice", `switchover pbx n2 by alice ("kernel"): requested`}
	if len(lines) != len(want) {
		t.Fatalf("explain printed %d lines:\n%s", len(lines), out.String())
	}
	for i, w := range want {
		if ind := len(lines[i]) - len(strings.TrimLeft(lines[i], " ")); ind != 2*i || !strings.Contains(lines[i], w) {
			t.Fatalf("line %d %q: want indent %d and %q\n%s", i, lines[i], 2*i, w, out.String())
		}
	}
}
