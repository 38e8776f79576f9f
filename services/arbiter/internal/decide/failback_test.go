package decide

import (
	"strings"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/events"
)

func permitFor(group string, from, length time.Duration) func(f *fx) Output {
	return func(f *fx) Output { return f.permit(group, f.now.Add(from), f.now.Add(from+length)) }
}

func channels(node string, n int) func(f *fx) Output {
	return func(f *fx) Output { f.chans[node] = n; return f.hb(node) }
}

func replicated(node, peer, tree string, ok bool) func(f *fx) Output {
	return func(f *fx) Output { return f.repl(node, peer, tree, ok) }
}

func operator(verb events.OperatorVerb, group, node, reason string) func(f *fx) Output {
	return func(f *fx) Output { _, out := f.op(verb, group, node, reason); return out }
}

// situation is the hold the group is in, as fanctl status shows it.
func situation(f *fx) string { return f.c.Snapshot().Groups[0].Situation }

// failedOver: booted on n1, n1 went down, n2 confirmed, n1 healthy again,
// and 15 s later (past the default hold-down) the test begins.
func failedOver(f *fx) {
	f.boot()
	f.setSelf("n1", down)
	f.result("pbx", "n2", events.OutcomeApplied)
	f.setSelf("n1", up)
	run(15 * time.Second)(f)
}

func cfgWith(mut func(c *Config)) Config {
	c := testConfig()
	mut(&c)
	return c
}

func TestFailback(t *testing.T) {
	back21 := []string{"failback n2->n1", "release n2", "claim n1 prev=n2 fenced"}
	cases := []struct {
		name  string
		cfg   Config
		steps []step
		check func(t *testing.T, last events.ArbiterDecision)
	}{
		{
			name: "inside a window: waits for stability, then for drain, then moves back",
			steps: []step{
				{name: "permit opens", do: permitFor("pbx", 0, 3*time.Hour), want: []string{"hold n2"}, reason: "healthy for 10m0s"},
				{name: "9 minutes", do: run(9 * time.Minute)},
				{name: "stable, channels unknown", do: run(time.Minute), want: []string{"hold n2"}, reason: "active channels are unknown"},
				{name: "2 calls up: still waiting, said once", do: channels("n2", 2)},
				{name: "calls drained", do: channels("n2", 0), want: back21, reason: "calls drained"},
				{name: "n1 confirms", do: res("pbx", "n1", events.OutcomeApplied)},
				{name: "steady", do: run(time.Minute)},
			},
		},
		{
			name: "a permit that has expired, or not yet begun, permits nothing",
			steps: []step{
				{name: "expired permit", do: permitFor("pbx", -2*time.Hour, time.Hour)},
				{name: "future permit", do: permitFor("pbx", time.Hour, time.Hour)},
				{name: "stable and drained, still outside", do: func(f *fx) Output { f.chans["n2"] = 0; return run(30 * time.Minute)(f) }},
				{name: "the window opens", do: run(30 * time.Minute), want: back21},
			},
		},
		{
			name: "the window closes first: wait gives up until the next window",
			steps: []step{
				{name: "calls up", do: channels("n2", 3)},
				{name: "permit", do: permitFor("pbx", 0, 20*time.Minute), want: []string{"hold n2"}, reason: "healthy for"},
				{name: "stable, calls up", do: run(10 * time.Minute), want: []string{"hold n2"}, reason: "on window close: wait"},
				{name: "window closes", do: run(10 * time.Minute)},
				{name: "drained after the window", do: channels("n2", 0)},
				{name: "next window", do: permitFor("pbx", 0, time.Hour), want: back21},
			},
		},
		{
			name: "the window closes first: force moves ForceBefore the end, marked forced",
			cfg:  cfgWith(func(c *Config) { c.Groups[0].Failback.OnWindowClose = WindowCloseForce }),
			steps: []step{
				{name: "calls up", do: channels("n2", 3)},
				{name: "permit", do: permitFor("pbx", 0, 20*time.Minute), want: []string{"hold n2"}},
				{name: "stable, calls up", do: run(10 * time.Minute), want: []string{"hold n2"}, reason: "on window close: force"},
				{name: "until a minute before the end", do: run(8*time.Minute + 59*time.Second)},
				{name: "a minute before the end", do: run(time.Second), want: back21, reason: "FORCED"},
			},
			check: func(t *testing.T, d events.ArbiterDecision) {
				if !d.Forced {
					t.Fatalf("forced failback not marked: %+v", d)
				}
			},
		},
		{
			name: "drain disabled: moves as soon as the target is stable",
			cfg:  cfgWith(func(c *Config) { c.Groups[0].Failback.DrainMaxChannels = -1 }),
			steps: []step{
				{name: "permit", do: permitFor("pbx", 0, time.Hour), want: []string{"hold n2"}},
				{name: "stable 10 minutes after n1 came back", do: run(9*time.Minute + 45*time.Second), want: back21},
			},
		},
		{
			name: "replication required: every tree reported since the move must be caught up",
			cfg: cfgWith(func(c *Config) {
				c.Groups[0].Failback.RequireReplication = true
				c.Groups[0].Failback.DrainMaxChannels = -1
				c.Groups[0].Failback.StableFor = time.Second
			}),
			steps: []step{
				{name: "permit", do: permitFor("pbx", 0, time.Hour), want: []string{"hold n2"}, reason: "no replication report from n2 to n1"},
				{name: "a report the other way does not count", do: replicated("n1", "n2", "/etc/asterisk", true)},
				{name: "config lagging", do: replicated("n2", "n1", "/etc/asterisk", false)},
				{name: "voicemail caught up", do: replicated("n2", "n1", "/var/spool/asterisk", true)},
				{name: "still lagging", do: run(time.Second)},
				{name: "config caught up", do: replicated("n2", "n1", "/etc/asterisk", true), want: back21},
			},
			check: func(t *testing.T, d events.ArbiterDecision) {
				if !strings.Contains(d.Reason, "replication caught up") || len(d.CausedBy) < 4 {
					t.Fatalf("failback does not cite its replication reports: %+v", d)
				}
			},
		},
		{
			name: "replication reports from before the last move do not count",
			cfg: cfgWith(func(c *Config) {
				c.Groups[0].Failback.RequireReplication = true
				c.Groups[0].Failback.DrainMaxChannels = -1
				c.Groups[0].Failback.StableFor = time.Second
			}),
			steps: []step{
				{name: "old report", do: replicated("n2", "n1", "/etc/asterisk", true)},
				{name: "a switchover to n3 and back to n2 is a move", do: func(f *fx) Output {
					f.now = f.now.Add(time.Second)
					f.op(events.OpSwitchover, "", "n3", "test")
					f.result("pbx", "n3", events.OutcomeApplied)
					f.now = f.now.Add(time.Second)
					f.op(events.OpSwitchover, "", "n2", "test")
					f.result("pbx", "n2", events.OutcomeApplied)
					f.op(events.OpUnpin, "", "", "test") // a switchover pins: cleared, failback is considered again
					return Output{}
				}},
				{name: "permit", do: permitFor("pbx", 0, time.Hour), want: []string{"hold n2"}},
				{name: "stable, no report since the move", do: run(30 * time.Second), want: []string{"hold n2"}, reason: "no replication report"},
			},
		},
		{
			name: "hold-down after a move delays a failback",
			cfg: cfgWith(func(c *Config) {
				c.HoldDown = time.Minute
				c.Groups[0].Failback.StableFor = time.Second
				c.Groups[0].Failback.DrainMaxChannels = -1
			}),
			steps: []step{
				{name: "permit 15 s after the failover", do: permitFor("pbx", 0, time.Hour), want: []string{"hold n2"}, reason: "hold-down"},
				{name: "within the hold-down", do: run(44 * time.Second)},
				{name: "hold-down over", do: run(time.Second), want: back21},
			},
		},
		{
			name: "a flapping preferred node restarts its stability clock",
			steps: []step{
				{name: "permit", do: permitFor("pbx", 0, 3*time.Hour), want: []string{"hold n2"}},
				{name: "8 minutes", do: run(8 * time.Minute)},
				{name: "n1 flaps", do: func(f *fx) Output { f.setSelf("n1", down); return f.setSelf("n1", up) }},
				{name: "drained", do: channels("n2", 0)},
				{name: "8 more minutes is not 10 since the flap", do: run(8 * time.Minute)},
				{name: "10 since the flap", do: run(2 * time.Minute), want: back21},
			},
		},
		{
			name: "a silence restarts the stability clock too",
			steps: []step{
				{name: "permit", do: permitFor("pbx", 0, 3*time.Hour), want: []string{"hold n2"}},
				{name: "drained", do: channels("n2", 0)},
				{name: "8 minutes", do: run(8 * time.Minute)},
				{name: "n1 silent 5 s", do: run(5*time.Second, "n1")},
				{name: "9 more minutes", do: run(9 * time.Minute)},
				{name: "10 since it was heard again", do: run(time.Minute + time.Second), want: back21},
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg
			if cfg.Cluster == "" {
				cfg = testConfig()
			}
			f := newFx(t, cfg)
			failedOver(f)
			var last events.ArbiterDecision
			for _, s := range tc.steps {
				out := s.do(f)
				for _, e := range out.Emits {
					if d, ok := e.Payload.(events.ArbiterDecision); ok {
						last = d
					}
				}
				if got := summary(out); !eq(got, s.want) {
					t.Fatalf("step %q: got %q, want %q (reason %q; situation %q)", s.name, got, s.want, reasonOf(out), situation(f))
				}
				if s.reason != "" && !strings.Contains(reasonOf(out), s.reason) {
					t.Fatalf("step %q: reason %q does not contain %q", s.name, reasonOf(out), s.reason)
				}
			}
			if tc.check != nil {
				tc.check(t, last)
			}
		})
	}
}

func TestMoveCapFreezesAndAsksForAHuman(t *testing.T) {
	f := newFx(t, cfgWith(func(c *Config) { c.MaxMovesPerHour = 2 }))
	f.boot()
	steps := []step{
		{name: "n1 down", do: self("n1", down), want: []string{"failover n1->n2", "release n1", "claim n2 prev=n1 fenced"}},
		{name: "n2 confirms", do: res("pbx", "n2", events.OutcomeApplied)},
		{name: "n1 back", do: self("n1", up), want: []string{"hold n2"}},
		{name: "n2 down", do: self("n2", down), want: []string{"failover n2->n1", "release n2", "claim n1 prev=n2 fenced"}},
		{name: "n1 confirms", do: res("pbx", "n1", events.OutcomeApplied)},
		{name: "n2 back", do: self("n2", up)},
		{name: "third move within the hour: frozen", do: self("n1", down), want: []string{"HUMAN hold n1"}, reason: "frozen against flapping"},
		{name: "stays frozen, said once", do: run(10 * time.Minute)},
		{name: "refused while frozen? no: maintenance off unfreezes", do: operator(events.OpMaintenanceOff, "pbx", "", "checked n1"),
			want: []string{"op maintenance_off accepted=true", "failover n1->n2", "release n1", "claim n2 prev=n1 fenced"}},
	}
	for _, s := range steps {
		out := s.do(f)
		if got := summary(out); !eq(got, s.want) {
			t.Fatalf("step %q: got %q, want %q (reason %q)", s.name, got, s.want, reasonOf(out))
		}
		if s.reason != "" && !strings.Contains(reasonOf(out), s.reason) {
			t.Fatalf("step %q: reason %q does not contain %q", s.name, reasonOf(out), s.reason)
		}
	}
	// The count survives a change of leader.
	g := f.c.Snapshot().Groups[0]
	if len(g.Moves) != 1 || g.FlapFrozen != "" {
		t.Fatalf("after unfreezing: moves %v frozen %q", g.Moves, g.FlapFrozen)
	}
}

func TestMoveCapWindowSlides(t *testing.T) {
	f := newFx(t, cfgWith(func(c *Config) { c.MaxMovesPerHour = 2 }))
	f.boot()
	f.setSelf("n1", down)
	f.result("pbx", "n2", events.OutcomeApplied)
	f.setSelf("n1", up)
	run(61 * time.Minute)(f) // the first move leaves the hour
	f.setSelf("n2", down)
	f.result("pbx", "n1", events.OutcomeApplied)
	f.setSelf("n2", up)
	if got := summary(f.setSelf("n1", down)); !eq(got, []string{"failover n1->n2", "release n1", "claim n2 prev=n1 fenced"}) {
		t.Fatalf("two moves in the last hour, cap 2: got %q", got)
	}
}

func TestOperatorActions(t *testing.T) {
	cases := []struct {
		name   string
		setup  func(f *fx)
		steps  []step
		verify func(t *testing.T, f *fx)
	}{
		{
			name: "switchover to a healthy node whose holder has no calls: at once, caused by the action through its planned stage",
			steps: []step{
				{name: "n1 reports no calls", do: channels("n1", 0)},
				{name: "switchover", do: operator(events.OpSwitchover, "", "n3", "kernel update on n1"),
					want: []string{"op switchover accepted=true", "planned moved", "switchover n1->n3", "release n1", "claim n3 prev=n1 fenced"}, reason: "alice@ops1: kernel update"},
			},
			verify: func(t *testing.T, f *fx) {
				act, pm, d := f.last[0], f.last[1], f.last[2].p.(events.ArbiterDecision)
				if d.CausedBy[0] != pm.env.ID || f.last[2].env.CausationID != pm.env.ID || pm.p.(events.PlannedMove).CausedBy[0] != act.env.ID {
					t.Fatalf("switchover not caused by the operator action through its planned stage: %+v", d)
				}
				if a := act.p.(events.OperatorAction); a.Operator != "alice@ops1" || !a.Accepted || a.Reason != "kernel update on n1" {
					t.Fatalf("action record %+v", a)
				}
			},
		},
		{
			name: "switchover to an unhealthy node, a non-member, or the holder is refused and recorded",
			steps: []step{
				{name: "n3 down", do: self("n3", down)},
				{name: "to n3", do: operator(events.OpSwitchover, "", "n3", ""), want: []string{"op switchover accepted=false"}},
				{name: "to n9", do: operator(events.OpSwitchover, "", "n9", ""), want: []string{"op switchover accepted=false"}},
				{name: "to n1", do: operator(events.OpSwitchover, "", "n1", ""), want: []string{"op switchover accepted=false"}},
				{name: "unknown group", do: operator(events.OpSwitchover, "nope", "n2", ""), want: []string{"op switchover accepted=false"}},
				{name: "nothing moved", do: run(10 * time.Second)},
			},
		},
		{
			name:  "manual failback outside any window, with its reason recorded",
			setup: failedOver,
			steps: []step{
				{name: "failback now", do: operator(events.OpFailback, "", "", "n1 repaired, customer asked"),
					want: []string{"op failback accepted=true", "failback n2->n1", "release n2", "claim n1 prev=n2 fenced"}, reason: "customer asked"},
			},
		},
		{
			name: "manual failback with nothing to fail back to is refused",
			steps: []step{
				{name: "already on n1", do: operator(events.OpFailback, "", "", "why not"), want: []string{"op failback accepted=false"}},
			},
		},
		{
			name: "standby moves the holder's group away and bars the node; active lets it back",
			steps: []step{
				{name: "n1 standby, drained", do: func(f *fx) Output {
					channels("n1", 0)(f)
					return operator(events.OpNodeStandby, "", "n1", "disk replacement")(f)
				},
					want: []string{"op node_standby accepted=true", "planned moved", "switchover n1->n2", "release n1", "claim n2 prev=n1 fenced"}, reason: "standby"},
				{name: "n2 confirms", do: res("pbx", "n2", events.OutcomeApplied)},
				{name: "n2 down: n3 takes it, not n1", do: self("n2", down), want: []string{"failover n2->n3", "release n2", "claim n3 prev=n2 fenced"}},
				{name: "n3 confirms", do: res("pbx", "n3", events.OutcomeApplied)},
				{name: "no failback to a standby node even in a window", do: func(f *fx) Output {
					f.chans["n3"] = 0
					f.permit("pbx", f.now, f.now.Add(time.Hour))
					return run(20 * time.Minute)(f)
				}},
				// Inside an open window, stable and drained: back at once.
				{name: "n1 active", do: operator(events.OpNodeActive, "", "n1", ""),
					want: []string{"op node_active accepted=true", "failback n3->n1", "release n3", "claim n1 prev=n3 fenced"}},
			},
		},
		{
			name: "cluster maintenance freezes every automatic move and asks for a human when the holder dies",
			steps: []step{
				{name: "maintenance on", do: operator(events.OpMaintenanceOn, "", "", "network work"), want: []string{"op maintenance_on accepted=true"}},
				{name: "n1 down", do: self("n1", down), want: []string{"HUMAN hold n1"}, reason: "cluster is in maintenance"},
				{name: "frozen", do: run(time.Minute)},
				{name: "manual switchover still works, without waiting for a dead holder", do: operator(events.OpSwitchover, "", "n3", "by hand"),
					want: []string{"op switchover accepted=true", "switchover n1->n3", "release n1", "claim n3 prev=n1 fenced"}},
				{name: "n3 confirms", do: res("pbx", "n3", events.OutcomeApplied), want: []string{"hold n3"}, reason: "in maintenance"},
				{name: "maintenance off: the switchover pinned n3", do: operator(events.OpMaintenanceOff, "", "", ""),
					want: []string{"op maintenance_off accepted=true", "hold n3"}, reason: "the pin of pbx to n3 by alice@ops1 (by hand)"},
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFx(t, testConfig())
			if tc.setup != nil {
				tc.setup(f)
			} else {
				f.boot()
			}
			f.play(tc.steps)
			if tc.verify != nil {
				tc.verify(t, f)
			}
		})
	}
}

func TestOperatorNeedsLeaderAndGroup(t *testing.T) {
	f := newFx(t, testConfig(
		Group{Name: "a", Addresses: []string{addr}, Nodes: []string{"n1", "n2"}, HealthCheck: "pbx"},
		Group{Name: "b", Addresses: []string{"198.51.100.20/24"}, Nodes: []string{"n2", "n1"}, HealthCheck: "pbx"},
	))
	rep, out := f.c.Operate(f.now, Request{ID: f.newEv(), OperatorRequest: events.OperatorRequest{Verb: events.OpMaintenanceOn, Operator: "a"}})
	if rep.Accepted || len(out.Emits) != 0 {
		t.Fatalf("a follower acted: %+v %q", rep, summary(out))
	}
	f.boot()
	if rep, _ := f.op(events.OpSwitchover, "", "n2", ""); rep.Accepted || !strings.Contains(rep.Message, "several groups") {
		t.Fatalf("switchover without a group in a two-group cluster: %+v", rep)
	}
	f.chans["n2"] = 0
	f.hb("n2")
	if rep, out := f.op(events.OpSwitchover, "b", "n1", ""); !rep.Accepted || len(rep.Decisions) != 1 || rep.Decisions[0] != out.Emits[2].ID {
		t.Fatalf("switchover of b: %+v %q", rep, summary(out))
	}
	// Operator state is part of what a successor restores.
	f.op(events.OpNodeStandby, "", "n2", "")
	f.op(events.OpMaintenanceOn, "a", "", "")
	snap := f.c.Snapshot()
	c2, err := New(f.cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := c2.Restore(snap); err != nil {
		t.Fatal(err)
	}
	s2 := c2.Snapshot()
	if len(s2.Standby) != 1 || s2.Standby[0].Node != "n2" || s2.Groups[0].Maintenance == "" {
		t.Fatalf("restored operator state: %+v", s2)
	}
}
