package decide

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/events"
)

// pinsOf renders the pin records of the last output: "pin started n2",
// "pin ended n2 expired".
func pinsOf(f *fx) []string {
	var out []string
	for _, b := range f.last {
		if p, ok := b.p.(events.GroupPin); ok {
			s := fmt.Sprintf("pin %s %s", p.Stage, p.Node)
			if p.End != "" {
				s += " " + string(p.End)
			}
			out = append(out, s)
		}
	}
	return out
}

// pinRecords are the pin records of an output.
func pinRecords(out Output) []Emit {
	var pins []Emit
	for _, e := range out.Emits {
		if _, ok := e.Payload.(events.GroupPin); ok {
			pins = append(pins, e)
		}
	}
	return pins
}

func pinnedTo(node string, forD time.Duration) events.OperatorRequest {
	return events.OperatorRequest{Verb: events.OpSwitchover, Node: node, Reason: "rolling upgrade", Drain: events.DrainNow, ForMS: forD.Milliseconds()}
}

func asked(req events.OperatorRequest, inReply string, pins ...string) func(f *fx) Output {
	return func(f *fx) Output {
		rep, out := f.ask(req)
		if !strings.Contains(rep.Message, inReply) {
			f.t.Fatalf("reply %q does not say %q", rep.Message, inReply)
		}
		if got := pinsOf(f); !eq(got, pins) {
			f.t.Fatalf("pins %q, want %q", got, pins)
		}
		return out
	}
}

// withPins runs do and checks the pin records it made.
func withPins(do func(f *fx) Output, pins ...string) func(f *fx) Output {
	return func(f *fx) Output {
		out := do(f)
		var got []string
		for _, e := range pinRecords(out) {
			p := e.Payload.(events.GroupPin)
			s := fmt.Sprintf("pin %s %s", p.Stage, p.Node)
			if p.End != "" {
				s += " " + string(p.End)
			}
			got = append(got, s)
		}
		if !eq(got, pins) {
			f.t.Fatalf("pins %q, want %q", got, pins)
		}
		return out
	}
}

func TestPins(t *testing.T) {
	window := cfgWith(func(c *Config) {
		c.Groups[0].Failback.StableFor = time.Second
		c.Groups[0].Failback.DrainMaxChannels = -1
	})
	moveNow := []string{"op switchover accepted=true", "switchover n1->n2", "release n1", "claim n2 prev=n1 fenced"}
	cases := []struct {
		name   string
		cfg    Config
		steps  []step
		verify func(t *testing.T, f *fx)
	}{
		{
			name: "a switchover pins: inside an open window nothing fails back until the pin's end, then it does",
			cfg:  window,
			steps: []step{
				{name: "the nightly window is open", do: permitFor("pbx", 0, 8*time.Hour)},
				{name: "switchover for 2h", do: asked(pinnedTo("n2", 2*time.Hour), "pbx stays on n2 once moved: pinned for 2h0m0s from the move", "pin started n2"),
					want: moveNow},
				{name: "n2 confirms: the failback is held off, said once", do: res("pbx", "n2", events.OutcomeApplied), want: []string{"hold n2"},
					reason: "preferred n1 is eligible again while n2 holds, but the pin of pbx to n2 by alice@ops1 (rolling upgrade)"},
				{name: "nearly two hours: nothing moves", do: run(2*time.Hour - 2*time.Second)},
				{name: "the pin's end: it ends, and the window fails the group back", do: withPins(run(2*time.Second), "pin ended n2 expired"),
					want: []string{"failback n2->n1", "release n2", "claim n1 prev=n2 fenced"}, reason: "failback to preferred n1 inside window nightly"},
			},
		},
		{
			name: "clearing the pin lets the open window fail the group back at once",
			cfg:  window,
			steps: []step{
				{name: "window", do: permitFor("pbx", 0, 8*time.Hour)},
				{name: "switchover, no end", do: asked(pinnedTo("n2", 0), "pinned until cleared", "pin started n2"), want: moveNow},
				{name: "n2 confirms", do: res("pbx", "n2", events.OutcomeApplied), want: []string{"hold n2"}, reason: "pin of pbx to n2"},
				{name: "past the hold-down", do: run(30 * time.Second)},
				{name: "cleared", do: asked(events.OperatorRequest{Verb: events.OpUnpin, Reason: "n1 upgraded"},
					"cleared by alice@ops1 (n1 upgraded): automatic failback may move the group again", "pin ended n2 cleared"),
					want: []string{"op unpin accepted=true", "failback n2->n1", "release n2", "claim n1 prev=n2 fenced"}},
				{name: "nothing left to clear", do: asked(events.OperatorRequest{Verb: events.OpUnpin}, "group pbx has no pin"),
					want: []string{"op unpin accepted=true"}},
			},
		},
		{
			name: "a failover overrides the pin, and the trail says so",
			steps: []step{
				{name: "switchover", do: asked(pinnedTo("n2", time.Hour), "pinned for 1h0m0s", "pin started n2"), want: moveNow},
				{name: "n2 confirms: pinned, no permit either", do: res("pbx", "n2", events.OutcomeApplied), want: []string{"hold n2"},
					reason: "keeps the group on n2: no failback until the pin ends"},
				{name: "n2 dies", do: withPins(self("n2", down), "pin ended n2 failed"),
					want: []string{"failover n2->n1", "release n2", "claim n1 prev=n2 fenced"}, reason: "; this ends the pin of pbx to n2 by alice@ops1"},
			},
			verify: func(t *testing.T, f *fx) {
				if s := f.c.Snapshot().Groups[0]; s.Pin != nil || s.PinAsked != nil {
					t.Fatalf("the pin outlived the failover: %+v %+v", s.Pin, s.PinAsked)
				}
			},
		},
		{
			name: "another switchover replaces the pin; a manual failback ends it",
			steps: []step{
				{name: "switchover", do: asked(pinnedTo("n2", 0), "pinned", "pin started n2"), want: moveNow},
				{name: "n2 confirms", do: res("pbx", "n2", events.OutcomeApplied), want: []string{"hold n2"}},
				{name: "switchover to n3", do: asked(pinnedTo("n3", time.Hour), "pinned for 1h0m0s", "pin ended n2 replaced", "pin started n3"),
					want: []string{"op switchover accepted=true", "switchover n2->n3", "release n2", "claim n3 prev=n2 fenced"}},
				{name: "n3 confirms", do: res("pbx", "n3", events.OutcomeApplied), want: []string{"hold n3"}},
				{name: "manual failback", do: asked(events.OperatorRequest{Verb: events.OpFailback, Reason: "done"}, "failback of pbx", "pin ended n3 replaced"),
					want: []string{"op failback accepted=true", "failback n3->n1", "release n3", "claim n1 prev=n3 fenced"}},
			},
		},
		{
			name: "a switchover that waits for calls pins once it moves; a cancelled one pins nothing",
			steps: []step{
				{name: "a call on n1", do: channels("n1", 2)},
				{name: "switchover waits", do: asked(events.OperatorRequest{Verb: events.OpSwitchover, Node: "n2", ForMS: time.Hour.Milliseconds()},
					"waits for n1 to drain"), want: []string{"op switchover accepted=true", "planned waiting"}},
				{name: "a minute of calls", do: run(time.Minute)},
				{name: "the call ends: moved, pinned", do: withPins(channels("n1", 0), "pin started n2"),
					want: []string{"planned moved", "switchover n1->n2", "release n1", "claim n2 prev=n1 fenced"}},
				{name: "n2 confirms", do: res("pbx", "n2", events.OutcomeApplied), want: []string{"hold n2"}},
				{name: "a call on n2", do: channels("n2", 1)},
				{name: "switchover to n3 waits", do: asked(events.OperatorRequest{Verb: events.OpSwitchover, Node: "n3"}, "waits for n2 to drain"),
					want: []string{"op switchover accepted=true", "planned waiting"}},
				{name: "cancelled: n2 stays pinned", do: asked(events.OperatorRequest{Verb: events.OpSwitchover, Cancel: true}, "cancelled"),
					want: []string{"op switchover accepted=true", "planned cancelled"}},
			},
			verify: func(t *testing.T, f *fx) {
				s := f.c.Snapshot().Groups[0]
				if s.PinAsked != nil || s.Pin == nil || s.Pin.Node != "n2" {
					t.Fatalf("after the cancel: pin %+v, asked %+v", s.Pin, s.PinAsked)
				}
			},
		},
		{
			name: "the pinned node down with nowhere to go keeps its pin: nothing moved",
			steps: []step{
				{name: "switchover", do: asked(pinnedTo("n2", 0), "pinned", "pin started n2"), want: moveNow},
				{name: "n2 confirms", do: res("pbx", "n2", events.OutcomeApplied), want: []string{"hold n2"}},
				{name: "n1 down", do: self("n1", down)},
				{name: "n3 down", do: self("n3", down)},
				{name: "n2 down too: held, the pin stays", do: withPins(self("n2", down)), want: []string{"hold n2"}, reason: "no other eligible node"},
				{name: "n2 back", do: self("n2", events.HealthUp)},
				{name: "n1 back: still pinned (said once already), no failback", do: self("n1", events.HealthUp)},
				{name: "and later", do: run(time.Minute)},
			},
			verify: func(t *testing.T, f *fx) {
				s := f.c.Snapshot().Groups[0]
				if s.Holder != "n2" || s.Pin == nil || s.Pin.Node != "n2" || !strings.Contains(s.Situation, "pin of pbx to n2") {
					t.Fatalf("holder %s, pin %+v, situation %q", s.Holder, s.Pin, s.Situation)
				}
			},
		},
		{
			name: "a switchover to the holder with an end pins it where it is, replacing the pin; without one it is refused",
			cfg:  window,
			steps: []step{
				{name: "the nightly window is open", do: permitFor("pbx", 0, 8*time.Hour)},
				{name: "switchover for 1h", do: asked(pinnedTo("n2", time.Hour), "pinned for 1h0m0s", "pin started n2"), want: moveNow},
				{name: "n2 confirms", do: res("pbx", "n2", events.OutcomeApplied), want: []string{"hold n2"}},
				{name: "50 minutes of work", do: run(50 * time.Minute)},
				{name: "to the holder without an end: refused, nothing changes",
					do:   asked(events.OperatorRequest{Verb: events.OpSwitchover, Node: "n2", Drain: events.DrainNow}, "n2 already holds group pbx (with --for"),
					want: []string{"op switchover accepted=false"}},
				{name: "to the holder for 2h more: pinned anew where it is, nothing moves",
					do:   asked(pinnedTo("n2", 2*time.Hour), "n2 already holds group pbx: pinned there until", "pin ended n2 replaced", "pin started n2"),
					want: []string{"op switchover accepted=true"}},
				{name: "past the first pin's end: still pinned", do: withPins(run(time.Hour))},
				{name: "the status names the new pin", do: func(f *fx) Output {
					s := f.c.Snapshot().Groups[0]
					if s.Pin == nil || s.Pin.Node != "n2" || !s.Pin.Until.Equal(s.Pin.Since.Add(2*time.Hour)) ||
						!strings.Contains(s.Situation, "until "+s.Pin.Until.UTC().Format(time.RFC3339)) {
						f.t.Fatalf("pin %+v, situation %q", s.Pin, s.Situation)
					}
					return Output{}
				}},
				{name: "the new pin's end: the window fails the group back", do: withPins(run(time.Hour), "pin ended n2 expired"),
					want: []string{"failback n2->n1", "release n2", "claim n1 prev=n2 fenced"}},
			},
		},
		{
			name: "a standby of the pinned node ends the pin",
			steps: []step{
				{name: "switchover", do: asked(pinnedTo("n2", 0), "pinned", "pin started n2"), want: moveNow},
				{name: "n2 confirms", do: res("pbx", "n2", events.OutcomeApplied), want: []string{"hold n2"}},
				{name: "n2 to standby now", do: withPins(func(f *fx) Output {
					_, out := f.ask(events.OperatorRequest{Verb: events.OpNodeStandby, Node: "n2", Drain: events.DrainNow})
					return out
				}, "pin ended n2 replaced"), want: []string{"op node_standby accepted=true", "switchover n2->n1", "release n2", "claim n1 prev=n2 fenced"}},
			},
		},
		{
			name: "an end that passed while the move waited pins nothing, and the move says so",
			steps: []step{
				{name: "a call on n1", do: channels("n1", 1)},
				{name: "switchover until a minute from now", do: func(f *fx) Output {
					return asked(events.OperatorRequest{Verb: events.OpSwitchover, Node: "n2", Until: f.now.Add(time.Minute)}, "pinned until")(f)
				}, want: []string{"op switchover accepted=true", "planned waiting"}},
				{name: "two minutes of calls", do: run(2 * time.Minute)},
				{name: "the call ends: moved, not pinned", do: withPins(channels("n1", 0)),
					want: []string{"planned moved", "switchover n1->n2", "release n1", "claim n2 prev=n1 fenced"}},
			},
			verify: func(t *testing.T, f *fx) {
				var reason string
				for _, b := range f.last {
					if d, ok := b.p.(events.ArbiterDecision); ok {
						reason = d.Reason
					}
				}
				if !strings.Contains(reason, "; no pin: the end it was asked with") || f.c.Snapshot().Groups[0].Pin != nil {
					t.Fatalf("reason %q, pin %+v", reason, f.c.Snapshot().Groups[0].Pin)
				}
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg
			if cfg.Groups == nil {
				cfg = testConfig()
			}
			f := newFx(t, cfg)
			f.boot()
			f.play(tc.steps)
			if tc.verify != nil {
				tc.verify(t, f)
			}
		})
	}
}

// TestPinRecords: a pin's start cites the switchover's decision and the
// operator's action, its end what ended it; its facts say who, why, since
// and until when, and the status shows it.
func TestPinRecords(t *testing.T) {
	f := newFx(t, testConfig())
	f.boot()
	_, out := f.ask(pinnedTo("n2", 2*time.Hour))
	var decision, action string
	for _, e := range out.Emits {
		switch e.Payload.(type) {
		case events.ArbiterDecision:
			decision = e.ID
		case events.OperatorAction:
			action = e.ID
		}
	}
	pins := pinRecords(out)
	if len(pins) != 1 {
		t.Fatalf("pins %+v", pins)
	}
	p := pins[0].Payload.(events.GroupPin)
	if p.CausedBy[0] != decision || p.CausedBy[1] != action || p.ActionID != action || p.Operator != "alice@ops1" ||
		p.Reason != "rolling upgrade" || !p.Since.Equal(f.now) || !p.Until.Equal(f.now.Add(2*time.Hour)) || p.Trigger != events.TriggerOperator {
		t.Fatalf("pin start %+v (decision %s, action %s)", p, decision, action)
	}
	if a := out.Emits[0].Payload.(events.OperatorAction); a.ForMS != (2 * time.Hour).Milliseconds() {
		t.Fatalf("the action does not record the pin asked: %+v", a)
	}
	st := PinStatus(f.c.Snapshot().Groups[0])
	if st == nil || st.EventID != pins[0].ID || st.Node != "n2" || !st.Until.Equal(p.Until) {
		t.Fatalf("status %+v", st)
	}
	f.result("pbx", "n2", events.OutcomeApplied)
	_, out = f.ask(events.OperatorRequest{Verb: events.OpUnpin, Reason: "done"})
	ends := pinRecords(out)
	if len(ends) != 1 {
		t.Fatalf("unpin: %+v", out.Emits)
	}
	e := ends[0].Payload.(events.GroupPin)
	if e.End != events.PinCleared || e.CausedBy[0] != out.Emits[0].ID || e.CausedBy[1] != pins[0].ID || e.Node != "n2" || !e.Since.Equal(p.Since) {
		t.Fatalf("pin end %+v", e)
	}
}

// TestPinSurvivesANewLeader: the pin and a switchover's pin still waiting
// are in the persisted state; a successor restored from it keeps the
// group where it was pinned inside an open window, and pins the waiting
// switchover when it moves.
func TestPinSurvivesANewLeader(t *testing.T) {
	cfg := cfgWith(func(c *Config) { c.Groups[0].Failback.StableFor = time.Second })
	f := newFx(t, cfg)
	f.boot()
	f.ask(pinnedTo("n2", 3*time.Hour))
	f.result("pbx", "n2", events.OutcomeApplied)
	f.chans["n2"] = 1
	f.hb("n2")
	f.ask(events.OperatorRequest{Verb: events.OpSwitchover, Node: "n3", ForMS: time.Hour.Milliseconds()})
	b, err := json.Marshal(f.c.Snapshot())
	if err != nil {
		t.Fatal(err)
	}
	var st State
	if err := json.Unmarshal(b, &st); err != nil {
		t.Fatal(err)
	}
	if g := st.Groups[0]; g.Pin == nil || g.Pin.Node != "n2" || g.PinAsked == nil || g.PinAsked.To != "n3" {
		t.Fatalf("persisted pin %+v, asked %+v", g.Pin, g.PinAsked)
	}

	g := newFx(t, cfg)
	g.now, g.self, g.peer, g.chans = f.now.Add(time.Second), f.self, f.peer, f.chans
	g.evIDs, g.cmdIDs = f.evIDs, f.cmdIDs // what the first leader recorded, cited by the second
	if err := g.c.Restore(st); err != nil {
		t.Fatal(err)
	}
	g.lead(2)
	g.beat()
	g.play([]step{
		{name: "the window opens: the successor keeps n2 pinned (a switchover to n3 waits)", do: permitFor("pbx", 0, 8*time.Hour)},
		{name: "n2's call ends: the waiting switchover moves and pins n3, replacing n2's pin",
			do:   withPins(channels("n2", 0), "pin ended n2 replaced", "pin started n3"),
			want: []string{"planned moved", "switchover n2->n3", "release n2", "claim n3 prev=n2 fenced"}},
	})
	if s := g.c.Snapshot().Groups[0]; s.Pin == nil || s.Pin.Node != "n3" || !s.Pin.Until.Equal(g.now.Add(time.Hour)) {
		t.Fatalf("successor's pin %+v", s.Pin)
	}
	bad := st
	bad.Groups = append([]GroupState(nil), st.Groups...)
	bad.Groups[0].Pin = &PinState{PinFacts: events.PinFacts{Node: "n9", ActionID: "a"}, StartedID: "s"}
	if err := newFx(t, cfg).c.Restore(bad); err == nil || !strings.Contains(err.Error(), "pin to n9, not a member") {
		t.Fatalf("a pin to a node not in the group restored: %v", err)
	}
}
