package decide

import (
	"strings"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/events"
)

// ask sends an operator request with a drain policy, as fanctl would.
func (f *fx) ask(req events.OperatorRequest) (Reply, Output) {
	id := f.newEv()
	f.evIDs[id] = true
	req.Operator = "alice@ops1"
	rep, out := f.c.Operate(f.now, Request{ID: id, OperatorRequest: req})
	f.check(out)
	return rep, out
}

func asking(req events.OperatorRequest, inReply string) func(f *fx) Output {
	return func(f *fx) Output {
		rep, out := f.ask(req)
		if !strings.Contains(rep.Message, inReply) {
			f.t.Fatalf("reply %q does not say %q", rep.Message, inReply)
		}
		return out
	}
}

func switchTo(node string, drain events.DrainMode, within time.Duration) events.OperatorRequest {
	return events.OperatorRequest{Verb: events.OpSwitchover, Node: node, Reason: "kernel update on n1", Drain: drain,
		WithinMS: within.Milliseconds()}
}

// plannedOf returns the planned-move stage records of the last output.
func plannedOf(f *fx) []events.PlannedMove {
	var out []events.PlannedMove
	for _, b := range f.last {
		if p, ok := b.p.(events.PlannedMove); ok {
			out = append(out, p)
		}
	}
	return out
}

func TestPlannedMoves(t *testing.T) {
	moved := []string{"planned moved", "switchover n1->n2", "release n1", "claim n2 prev=n1 fenced"}
	cases := []struct {
		name   string
		steps  []step
		verify func(t *testing.T, f *fx)
	}{
		{
			name: "default: waits while the holder has a call, moves once it has none",
			steps: []step{
				{name: "a call on n1", do: channels("n1", 2)},
				{name: "switchover", do: asking(switchTo("n2", "", 0), "waits for n1 to drain: n1 has 2 active channels (limit 0)"),
					want: []string{"op switchover accepted=true", "planned waiting"}},
				{name: "ten minutes of the same count: nothing new", do: run(10 * time.Minute)},
				{name: "one channel left: recorded (a minute has passed)", do: channels("n1", 1), want: []string{"planned waiting"}},
				{name: "seconds later none: moves", do: func(f *fx) Output { f.now = f.now.Add(3 * time.Second); return channels("n1", 0)(f) },
					want: moved, reason: "n1 has 0 active channels (limit 0) after 10m3s"},
			},
			verify: func(t *testing.T, f *fx) {
				pm, d := f.last[0], f.last[1].p.(events.ArbiterDecision)
				if d.CausedBy[0] != pm.env.ID || d.Forced {
					t.Fatalf("move %+v not caused by its planned stage %s, or forced", d, pm.env.ID)
				}
				if p := pm.p.(events.PlannedMove); p.Channels == nil || *p.Channels != 0 || p.Operator != "alice@ops1" || len(p.CausedBy) < 2 {
					t.Fatalf("moved record %+v", p)
				}
				if f.c.Snapshot().Groups[0].Planned != nil {
					t.Fatal("the planned move is still in the state after it moved")
				}
			},
		},
		{
			name: "a channel count that changes all the time is recorded at most once a minute",
			steps: []step{
				{name: "3 calls", do: channels("n1", 3)},
				{name: "switchover", do: asking(switchTo("n2", "", 0), "waits"), want: []string{"op switchover accepted=true", "planned waiting"}},
				{name: "2 after 10 s: status only", do: func(f *fx) Output { f.now = f.now.Add(10 * time.Second); return channels("n1", 2)(f) }},
				{name: "4 after 20 s: status only", do: func(f *fx) Output { f.now = f.now.Add(10 * time.Second); return channels("n1", 4)(f) }},
				{name: "a minute on: the new count is recorded", do: run(time.Minute), want: []string{"planned waiting"}},
			},
			verify: func(t *testing.T, f *fx) {
				if p := f.c.Snapshot().Groups[0].Planned; p == nil || p.Channels == nil || *p.Channels != 4 {
					t.Fatalf("status does not show the count now: %+v", p)
				}
			},
		},
		{
			name: "unknown channels are not drained: gives up at the deadline and says so",
			steps: []step{
				{name: "switchover within 2m", do: asking(switchTo("n2", events.DrainWait, 2*time.Minute), "n1's active channels are unknown"),
					want: []string{"op switchover accepted=true", "planned waiting"}},
				{name: "just before the deadline", do: run(time.Minute + 59*time.Second)},
				{name: "deadline", do: run(time.Second), want: []string{"planned gave_up"}},
				{name: "nothing moves afterwards", do: run(time.Minute)},
			},
			verify: func(t *testing.T, f *fx) {
				s := f.c.Snapshot().Groups[0]
				if s.Holder != "n1" || s.Planned != nil {
					t.Fatalf("after giving up: holder %s, planned %+v", s.Holder, s.Planned)
				}
			},
		},
		{
			name: "force_after: moves anyway at the deadline, marked forced",
			steps: []step{
				{name: "2 calls", do: channels("n1", 2)},
				{name: "switchover", do: asking(switchTo("n2", events.DrainForceAfter, time.Minute), "then it moves anyway"),
					want: []string{"op switchover accepted=true", "planned waiting"}},
				{name: "deadline", do: func(f *fx) Output {
					out := run(time.Minute)(f)
					for _, e := range out.Emits {
						if d, ok := e.Payload.(events.ArbiterDecision); ok && !d.Forced {
							f.t.Fatalf("forced move not marked: %+v", d)
						}
					}
					return out
				}, want: moved, reason: "FORCED at the deadline (force_after): n1 has 2 active channels"},
			},
		},
		{
			name: "now: today's behaviour, and the reply says how many calls it cut",
			steps: []step{
				{name: "one call (3 channels: a transfer)", do: func(f *fx) Output { f.calls["n1"] = 1; return channels("n1", 3)(f) }},
				{name: "switchover now", do: asking(switchTo("n2", events.DrainNow, 0), "3 active channels (1 call) on n1 cut"),
					want: []string{"op switchover accepted=true", "switchover n1->n2", "release n1", "claim n2 prev=n1 fenced"}, reason: "FORCED with 3 active channels (1 call) on n1"},
			},
		},
		{
			name: "cancel: recorded as the operator who cancelled, citing the request; nothing moves later",
			steps: []step{
				{name: "a call", do: channels("n1", 1)},
				{name: "switchover", do: asking(switchTo("n2", "", 0), "waits"), want: []string{"op switchover accepted=true", "planned waiting"}},
				{name: "a second one is refused", do: asking(switchTo("n3", "", 0), "cancel it first"), want: []string{"op switchover accepted=false"}},
				{name: "cancel", do: asking(events.OperatorRequest{Verb: events.OpSwitchover, Cancel: true}, "cancelled by alice@ops1 with 1 active channel on n1"),
					want: []string{"op switchover accepted=true", "planned cancelled"}},
				{name: "n1 drains: nothing moves", do: channels("n1", 0)},
				{name: "nothing to cancel now", do: asking(events.OperatorRequest{Verb: events.OpSwitchover, Cancel: true}, "no planned move waits"),
					want: []string{"op switchover accepted=false"}},
			},
		},
		{
			name: "a failover overrides a waiting planned move",
			steps: []step{
				{name: "calls", do: channels("n1", 5)},
				{name: "switchover to n3", do: asking(switchTo("n3", "", 0), "waits"), want: []string{"op switchover accepted=true", "planned waiting"}},
				{name: "n1 down", do: self("n1", down),
					want: []string{"planned overridden", "failover n1->n2", "release n1", "claim n2 prev=n1 fenced"}},
			},
			verify: func(t *testing.T, f *fx) {
				if p := plannedOf(f); len(p) != 1 || !strings.Contains(p[0].Reason, "holder n1 reports pbx down") {
					t.Fatalf("override record %+v", p)
				}
			},
		},
		{
			name: "--now replaces a waiting move, recording its end",
			steps: []step{
				{name: "calls", do: channels("n1", 2)},
				{name: "switchover", do: asking(switchTo("n2", "", 0), "waits"), want: []string{"op switchover accepted=true", "planned waiting"}},
				{name: "switchover now", do: asking(switchTo("n2", events.DrainNow, 0), "2 active channels on n1 cut"),
					want: []string{"op switchover accepted=true", "planned cancelled", "switchover n1->n2", "release n1", "claim n2 prev=n1 fenced"}},
			},
		},
		{
			name: "a drained holder waits while the target cannot take the group, then moves when it can",
			steps: []step{
				{name: "calls", do: channels("n1", 1)},
				{name: "switchover", do: asking(switchTo("n2", "", 0), "waits"), want: []string{"op switchover accepted=true", "planned waiting"}},
				{name: "n2 down", do: self("n2", down)},
				{name: "a minute on: the new reason to wait is recorded", do: run(time.Minute), want: []string{"planned waiting"}},
				{name: "n1 drained: still waits for n2", do: channels("n1", 0)},
				{name: "n2 back", do: self("n2", up), want: moved},
			},
		},
		{
			name: "standby: the node is barred at once, its group leaves once drained",
			steps: []step{
				{name: "calls", do: channels("n1", 1)},
				{name: "standby", do: asking(events.OperatorRequest{Verb: events.OpNodeStandby, Node: "n1", Reason: "disk"}, "waits for n1 to drain"),
					want: []string{"op node_standby accepted=true", "planned waiting"}},
				{name: "drained", do: channels("n1", 0), want: []string{"planned moved", "switchover n1->n2", "release n1", "claim n2 prev=n1 fenced"},
					reason: "planned move of pbx off n1 (standby)"},
			},
		},
		{
			name: "standby that gives up keeps the node in standby and the group where it is, until node active cancels it",
			steps: []step{
				{name: "calls", do: channels("n1", 1)},
				{name: "standby within 1m", do: asking(events.OperatorRequest{Verb: events.OpNodeStandby, Node: "n1", WithinMS: 60_000}, "waits"),
					want: []string{"op node_standby accepted=true", "planned waiting"}},
				{name: "deadline", do: run(time.Minute), want: []string{"planned gave_up", "hold n1"}},
				{name: "drained later: it stays (the operator gave up)", do: channels("n1", 0)},
				{name: "an hour on: nothing, said once", do: run(time.Hour)},
				{name: "node active", do: asking(events.OperatorRequest{Verb: events.OpNodeActive, Node: "n1"}, "cancelled by alice@ops1"),
					want: []string{"op node_active accepted=true", "planned cancelled"}},
			},
			verify: func(t *testing.T, f *fx) {
				s := f.c.Snapshot()
				if s.Groups[0].Holder != "n1" || s.Groups[0].Planned != nil || len(s.Standby) != 0 {
					t.Fatalf("after node active: %+v", s)
				}
			},
		},
		{
			name: "standby now cuts the calls and says how many",
			steps: []step{
				{name: "calls", do: channels("n1", 4)},
				{name: "standby now", do: asking(events.OperatorRequest{Verb: events.OpNodeStandby, Node: "n1", Drain: events.DrainNow}, "4 active channels on n1 cut"),
					want: []string{"op node_standby accepted=true", "switchover n1->n2", "release n1", "claim n2 prev=n1 fenced"}},
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFx(t, testConfig())
			f.boot()
			f.play(tc.steps)
			if tc.verify != nil {
				tc.verify(t, f)
			}
		})
	}
}

// TestPlannedMoveSurvivesALeaderChange: the wait lives in the persisted
// state; a successor restores it and moves when the holder drains, citing
// the original request.
func TestPlannedMoveSurvivesALeaderChange(t *testing.T) {
	f := newFx(t, testConfig())
	f.boot()
	f.chans["n1"] = 2
	f.hb("n1")
	rep, out := f.ask(switchTo("n2", events.DrainWait, 10*time.Minute))
	if !rep.Accepted || len(plannedOf(f)) != 1 {
		t.Fatalf("switchover %+v %q", rep, summary(out))
	}
	action := out.Emits[0].ID
	snap := f.c.Snapshot()
	p := snap.Groups[0].Planned
	if p == nil || p.Operator != "alice@ops1" || p.Channels == nil || *p.Channels != 2 || !p.Deadline.Equal(f.now.Add(10*time.Minute)) {
		t.Fatalf("state %+v", p)
	}

	c2, err := New(f.cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := c2.Restore(snap); err != nil {
		t.Fatal(err)
	}
	f.c = c2
	f.lead(2)
	f.now = f.now.Add(2 * time.Minute)
	f.beat() // the successor hears everyone (n1 still busy): no move
	if got := summary(f.tick(0)); len(got) != 0 {
		t.Fatalf("successor moved a busy holder: %q", got)
	}
	f.chans["n1"] = 0
	if got := summary(f.hb("n1")); !eq(got, []string{"planned moved", "switchover n1->n2", "release n1", "claim n2 prev=n1 fenced"}) {
		t.Fatalf("successor after the drain: %q", got)
	}
	if pm := plannedOf(f)[0]; pm.CausedBy[0] != action || f.last[0].env.Epoch != 2 {
		t.Fatalf("moved record %+v does not cite the request's action %s under the new term", pm, action)
	}

	// A state naming a planned move from a stranger is refused.
	bad := snap
	bad.Groups = append([]GroupState(nil), snap.Groups...)
	pl := *snap.Groups[0].Planned
	pl.From = "n9"
	bad.Groups[0].Planned = &pl
	c3, _ := New(f.cfg)
	if err := c3.Restore(bad); err == nil {
		t.Fatal("restored a planned move from a non-member")
	}
}
