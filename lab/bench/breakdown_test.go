package bench

import (
	"strings"
	"testing"
	"time"

	"github.com/fanpbx/fan/lab/stack"
	"github.com/fanpbx/fan/pkg/events"
)

var fault = time.Date(2026, 12, 1, 21, 0, 0, 0, time.UTC)

func at(ms int) time.Time { return fault.Add(time.Duration(ms) * time.Millisecond) }

// trail is one failover of n1 to n2 as the audit stream tells it, with
// the marks at the given milliseconds from the fault.
func trail(peerDown, decided, received, announced int) []stack.Event {
	ev := func(ms int, p events.Payload) stack.Event {
		return stack.Event{Env: events.Envelope{Time: at(ms)}, Payload: p}
	}
	return []stack.Event{
		ev(-500, &events.HealthTransition{Check: "peer-n1", TargetNode: "n1", Role: events.RolePeer, To: events.HealthDown}), // an earlier cycle's
		ev(peerDown-5, &events.HealthTransition{Check: "asterisk", TargetNode: "n2", Role: events.RoleSelf, To: events.HealthDown}),
		ev(peerDown, &events.HealthTransition{Check: "peer-n1", TargetNode: "n1", Role: events.RolePeer, To: events.HealthDown}),
		ev(decided-1, &events.ArbiterDecision{Group: "pbx", Action: events.ActionHold, From: "n1"}),
		ev(decided, &events.ArbiterDecision{Group: "pbx", Action: events.ActionFailover, From: "n1", To: "n2",
			Commands: []string{"rel", "claim"}, Trigger: events.TriggerTick}),
		ev(decided+2, &events.CommandResult{CommandID: "claim", CommandType: events.TypeClaimIP, Node: "n2", Steps: []events.Step{
			{Name: "received", At: at(received)}, {Name: "recorded", At: at(received + 2)}, {Name: "first_announcement_sent", At: at(announced)}, {Name: "pbx_verified", At: at(announced + 3)}}}),
	}
}

func TestExplainFindsEachMarkOfTheCycle(t *testing.T) {
	cy := Cycle{From: "n1", To: "n2", At: fault, Took: 170 * time.Millisecond}
	beacon := func(node string, before time.Time) time.Time {
		if node != "n1" || !before.Equal(at(170)) {
			t.Fatalf("asked for %s's beacon before %v", node, before.Sub(fault))
		}
		return at(-20)
	}
	ps := Explain([]Cycle{cy}, trail(120, 150, 155, 160), beacon, 160*time.Millisecond)
	if len(ps) != 1 {
		t.Fatalf("%d phases for one cycle", len(ps))
	}
	p := ps[0]
	got := []float64{p.LastBeacon, p.Silent, p.PeerDown, p.Decided, p.Received, p.Recorded, p.Announced, p.Answered}
	want := []float64{-20, 140, 120, 150, 155, 157, 160, 170}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("marks %v, want %v", got, want)
		}
	}
	if p.Trigger != events.TriggerTick {
		t.Fatalf("trigger %q, want tick", p.Trigger)
	}
	line := BreakdownLine(NodeCrash, ps)
	for _, w := range []string{"scenario=node-crash cycles=1", "last_beacon_ms=-20/-20", "peer_down_ms=120/120", "decided_ms=150/150",
		"recorded_ms=157/157", "answered_ms=170/170", "on_tick=1 on_event=0"} {
		if !strings.Contains(line, w) {
			t.Errorf("%q lacks %q", line, w)
		}
	}
	// Without beacons or a decision in the trail the marks are NaN, not 0.
	ps = Explain([]Cycle{cy}, nil, nil, 0)
	if l := BreakdownLine(LinkCut, ps); !strings.Contains(l, "decided_ms=NaN/NaN") || !strings.Contains(l, "answered_ms=170/170") {
		t.Fatalf("empty trail: %s", l)
	}
}

func TestBeaconsLastBeforeAndGaps(t *testing.T) {
	b := &Beacons{at: map[string][]time.Time{"n1": {at(0), at(50), at(100), at(400), at(450)}}}
	for _, c := range []struct{ before, want int }{{49, 0}, {50, 50}, {399, 100}, {1000, 450}} {
		if got := b.LastBefore("n1", at(c.before)); !got.Equal(at(c.want)) {
			t.Errorf("LastBefore(%d) = %v, want %d", c.before, got.Sub(fault), c.want)
		}
	}
	if got := b.LastBefore("n1", at(-1)); !got.IsZero() {
		t.Errorf("before the first beacon: %v, want zero", got)
	}
	n, longest := b.gaps(at(0), at(1000), 160*time.Millisecond)
	if n != 1 || longest != 300*time.Millisecond {
		t.Fatalf("gaps = %d longest %v, want 1 and 300ms", n, longest)
	}
}

func TestIdleCountsMovesAndNearMissesInTheWindowOnly(t *testing.T) {
	ev := func(ms int, p events.Payload) stack.Event {
		return stack.Event{Env: events.Envelope{Time: at(ms)}, Payload: p}
	}
	evs := []stack.Event{
		ev(-10, &events.ArbiterDecision{Action: events.ActionPlace, To: "n1"}), // the start's placement
		ev(100, &events.HealthTransition{Role: events.RolePeer, To: events.HealthDown}),
		ev(110, &events.ArbiterDecision{Action: events.ActionHold, Reason: "holder n1 is silent on the bus but peers still reach it"}),
		ev(200, &events.ArbiterDecision{Action: events.ActionFailover, From: "n1", To: "n2"}),
		ev(300, &events.HealthTransition{Role: events.RoleSelf, To: events.HealthDown}),
		ev(310, &events.HealthTransition{Role: events.RoleSelf, To: events.HealthUp}),
		ev(2000, &events.ArbiterDecision{Action: events.ActionFailover, From: "n2", To: "n1"}), // after the window
	}
	r := IdleFrom(evs, nil, at(0), at(1000), 160*time.Millisecond)
	if r.Moves != 1 || r.PeerDown != 1 || r.SelfDown != 1 || r.Silent != 1 || len(r.Why) != 1 || !strings.HasPrefix(r.Why[0], "failover n1->n2") {
		t.Fatalf("%+v, want one of each", r)
	}
	if l := IdleLine("keepalived", time.Minute, 2, r); !strings.Contains(l, "false_failovers=1 peer_down=1 self_down=1 silent_holds=1") {
		t.Fatalf("line %s", l)
	}
}
