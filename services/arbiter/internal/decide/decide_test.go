package decide

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/events"
)

const (
	up   = events.HealthUp
	down = events.HealthDown
)

type step struct {
	name   string
	do     func(f *fx) Output
	want   []string
	reason string // substring of the (first) decision's reason, when set
}

// play runs the steps in order, failing at the first whose output (or
// its first decision's reason) is not the one wanted.
func (f *fx) play(steps []step) {
	f.t.Helper()
	for _, s := range steps {
		out := s.do(f)
		if got := summary(out); !eq(got, s.want) {
			f.t.Fatalf("step %q: got %q, want %q (reason %q)", s.name, got, s.want, reasonOf(out))
		}
		if s.reason != "" && !strings.Contains(reasonOf(out), s.reason) {
			f.t.Fatalf("step %q: reason %q does not contain %q", s.name, reasonOf(out), s.reason)
		}
	}
}

func hbAll(except ...string) func(f *fx) Output {
	return func(f *fx) Output { return f.beat(except...) }
}
func self(n string, h events.Health) func(f *fx) Output {
	return func(f *fx) Output { return f.setSelf(n, h) }
}
func peerSees(obs, target string, h events.Health) func(f *fx) Output {
	return func(f *fx) Output { return f.setPeer(obs, target, h) }
}
func res(group, node string, o events.Outcome) func(f *fx) Output {
	return func(f *fx) Output { return f.result(group, node, o) }
}

// run lets d pass in one-second steps; every node not listed heartbeats
// each second, then the shell ticks.
func run(d time.Duration, silent ...string) func(f *fx) Output {
	return func(f *fx) Output {
		var all Output
		for range int(d / time.Second) {
			f.now = f.now.Add(time.Second)
			all.Emits = append(all.Emits, f.beat(silent...).Emits...)
			all.Emits = append(all.Emits, f.tick(0).Emits...)
		}
		return all
	}
}

// n1UnknownN2Up leads with n1, the preferred node, heard but without a
// verdict from its checks yet, and n2 up.
func n1UnknownN2Up(f *fx) {
	f.lead(1)
	f.self["n1"] = events.CheckState{TargetNode: "n1", Role: events.RoleSelf, Health: events.HealthUnknown, Since: f.now}
	f.self["n2"] = events.CheckState{TargetNode: "n2", Role: events.RoleSelf, Health: up, Since: f.now}
}

func TestRules(t *testing.T) {
	failover12 := []string{"failover n1->n2", "release n1", "claim n2 prev=n1 fenced"}
	cases := []struct {
		name  string
		cfg   Config
		setup func(f *fx)
		steps []step
	}{
		{
			name: "placement waits for the preferred node at start, then claims it",
			setup: func(f *fx) {
				f.lead(1)
				for _, n := range []string{"n1", "n2", "n3"} {
					f.self[n] = events.CheckState{TargetNode: n, Role: events.RoleSelf, Health: up, Since: f.now}
				}
			},
			steps: []step{
				{name: "n3 first", do: func(f *fx) Output { return f.hb("n3") }},
				{name: "n2", do: func(f *fx) Output { return f.hb("n2") }},
				{name: "n1", do: func(f *fx) Output { return f.hb("n1") }, want: []string{"place ->n1", "claim n1"}, reason: "highest-priority"},
				{name: "confirmed", do: res("pbx", "n1", events.OutcomeApplied)},
				{name: "steady", do: run(20 * time.Second)},
			},
		},
		{
			name: "placement settles on the best node heard once the settle period ends",
			setup: func(f *fx) {
				f.lead(1)
				f.self["n2"] = events.CheckState{TargetNode: "n2", Role: events.RoleSelf, Health: up, Since: f.now}
			},
			steps: []step{
				{name: "n2 only", do: func(f *fx) Output { return f.hb("n2") }},
				{name: "settle", do: run(3*time.Second, "n1", "n3"), want: []string{"place ->n2", "claim n2"}},
			},
		},
		{
			name:  "placement waits for a heard preferred node whose checks have no verdict yet",
			setup: n1UnknownN2Up,
			steps: []step{
				{name: "n1 unknown, n2 up", do: func(f *fx) Output { f.hb("n1"); return f.hb("n2") }},
				{name: "n1 up", do: self("n1", up), want: []string{"place ->n1", "claim n1"}},
			},
		},
		{
			name:  "a preferred node that never reaches a verdict delays placement only until the settle period ends",
			setup: n1UnknownN2Up,
			steps: []step{
				{name: "n1 unknown, n2 up", do: func(f *fx) Output { f.hb("n1"); return f.hb("n2") }},
				{name: "settle", do: run(3*time.Second, "n3"), want: []string{"place ->n2", "claim n2"}},
			},
		},
		{
			name: "no eligible node at all: one hold, then placement when one appears",
			setup: func(f *fx) {
				f.lead(1)
				for _, n := range []string{"n1", "n2", "n3"} {
					f.self[n] = events.CheckState{TargetNode: n, Role: events.RoleSelf, Health: down, Since: f.now}
				}
			},
			steps: []step{
				{name: "all down", do: hbAll(), want: []string{"hold "}, reason: "no eligible node"},
				{name: "still down", do: run(5 * time.Second)},
				{name: "n3 up", do: self("n3", up), want: []string{"place ->n3", "claim n3"}},
			},
		},
		{
			name: "holder's own prober reports down: release old, claim next (fenced)",
			steps: []step{
				{name: "n1 down", do: self("n1", down), want: failover12, reason: "holder n1 reports pbx down"},
				{name: "confirmed", do: res("pbx", "n2", events.OutcomeApplied)},
				{name: "steady", do: run(10 * time.Second)},
			},
		},
		{
			name: "missed transition: the heartbeat's level state converges",
			steps: []step{
				{name: "n1 down, transition lost", do: func(f *fx) Output {
					f.self["n1"] = events.CheckState{TargetNode: "n1", Role: events.RoleSelf, Health: down, Since: f.now}
					return f.hb("n1")
				}, want: failover12},
			},
		},
		{
			name: "a heartbeat older than a transition does not undo it",
			steps: []step{
				{name: "n2 down", do: self("n2", down)},
				{name: "stale heartbeat says n2 up", do: func(f *fx) Output {
					f.self["n2"] = events.CheckState{TargetNode: "n2", Role: events.RoleSelf, Health: up, Since: f.now.Add(-time.Second)}
					return f.hb("n2")
				}},
				{name: "n1 down goes to n3", do: self("n1", down), want: []string{"failover n1->n3", "release n1", "claim n3 prev=n1 fenced"}},
			},
		},
		{
			name: "holder silent but peers reach it: held once, not replaced (invariant 6)",
			steps: []step{
				{name: "n1 cut off from the bus", do: run(8*time.Second, "n1"), want: []string{"hold n1"}, reason: "peers still reach it"},
				{name: "one peer loses it", do: peerSees("n2", "n1", down)},
				{name: "more time", do: run(5*time.Second, "n1")},
				{name: "the last peer loses it", do: peerSees("n3", "n1", down), want: failover12, reason: "peers cannot reach it"},
			},
		},
		{
			name: "holder silent and no peer has an opinion: held",
			steps: []step{
				{name: "peers stop checking n1", do: func(f *fx) Output {
					delete(f.peer["n2"], "n1")
					delete(f.peer["n3"], "n1")
					return f.beat()
				}},
				{name: "n1 silent", do: run(5*time.Second, "n1"), want: []string{"hold n1"}, reason: "no peer reports"},
			},
		},
		{
			name: "silent peers' opinions do not count",
			steps: []step{
				{name: "n3 loses n1 then goes silent", do: peerSees("n3", "n1", down)},
				{name: "n1 and n3 silent", do: run(5*time.Second, "n1", "n3"), want: []string{"hold n1"}, reason: "peers still reach it (n2/peer-n1)"},
			},
		},
		{
			name: "holder down with no eligible target: one hold, moves when one appears",
			steps: []step{
				{name: "n2 down", do: self("n2", down)},
				{name: "n3 down", do: self("n3", down)},
				{name: "n1 down", do: self("n1", down), want: []string{"hold n1"}, reason: "no other eligible node (n2 pbx down, n3 pbx down)"},
				{name: "no storm", do: run(10 * time.Second)},
				{name: "n3 back", do: self("n3", up), want: []string{"failover n1->n3", "release n1", "claim n3 prev=n1 fenced"}},
			},
		},
		{
			name: "claim fails: retry on the next node, then hold, then retry the failed one after backoff",
			steps: []step{
				{name: "n1 down", do: self("n1", down), want: failover12},
				{name: "n2 fails", do: res("pbx", "n2", events.OutcomeFailed),
					want: []string{"retry n2->n3", "release n2", "claim n3 prev=n1 fenced"}, reason: "claim on n2 failed"},
				{name: "n3 refuses (expired)", do: res("pbx", "n3", events.OutcomeExpired),
					want: []string{"hold ", "release n3"}, reason: "no other eligible node"},
				{name: "within backoff", do: run(9 * time.Second)},
				{name: "backoff over", do: run(1 * time.Second), want: []string{"place ->n2", "claim n2 prev=n1 fenced"}},
				{name: "confirmed", do: res("pbx", "n2", events.OutcomeApplied)},
			},
		},
		{
			name: "stale-epoch answer moves on too",
			steps: []step{
				{name: "n1 down", do: self("n1", down), want: failover12},
				{name: "n2 stale", do: res("pbx", "n2", events.OutcomeStaleEpoch), want: []string{"retry n2->n3", "release n2", "claim n3 prev=n1 fenced"}},
			},
		},
		{
			name: "claim not confirmed in time: release it, retry elsewhere",
			steps: []step{
				{name: "n1 down", do: self("n1", down), want: failover12},
				{name: "waiting", do: run(4 * time.Second)},
				{name: "timeout", do: run(1 * time.Second), want: []string{"retry n2->n3", "release n2", "claim n3 prev=n1 fenced"}, reason: "not confirmed within 5s"},
			},
		},
		{
			name: "claim not confirmed and no other node: claim the same node again at once, fenced",
			steps: []step{
				{name: "n3 down", do: self("n3", down)},
				{name: "n1 down", do: self("n1", down), want: failover12},
				{name: "waiting", do: run(4 * time.Second)},
				{name: "timeout", do: run(1 * time.Second), want: []string{"retry n2->n2", "claim n2 prev=n1 fenced"},
					reason: "n2 is the only eligible node: claiming it again"},
				{name: "confirmed", do: res("pbx", "n2", events.OutcomeApplied)},
			},
		},
		{
			name: "claim answered with a failure and no other node: hold, retry after the backoff",
			steps: []step{
				{name: "n3 down", do: self("n3", down)},
				{name: "n1 down", do: self("n1", down), want: failover12},
				{name: "n2 fails", do: res("pbx", "n2", events.OutcomeFailed), want: []string{"hold ", "release n2"}, reason: "no other eligible node"},
				{name: "within backoff", do: run(9 * time.Second)},
				{name: "backoff over", do: run(1 * time.Second), want: []string{"place ->n2", "claim n2 prev=n1 fenced"}},
			},
		},
		{
			name: "claimant turns unhealthy while claiming: move on at once",
			steps: []step{
				{name: "n1 down", do: self("n1", down), want: failover12},
				{name: "n2 down", do: self("n2", down), want: []string{"retry n2->n3", "release n2", "claim n3 prev=n1 fenced"}, reason: "no longer eligible"},
			},
		},
		{
			name: "no failback without a permit: explained once per tenure, nothing moves however often the preferred node flaps",
			steps: []step{
				{name: "n1 down", do: self("n1", down), want: failover12},
				{name: "confirmed", do: res("pbx", "n2", events.OutcomeApplied)},
				{name: "n1 back", do: self("n1", up), want: []string{"hold n2"}, reason: "failback needs a permit"},
				{name: "n1 flaps", do: self("n1", down)},
				{name: "n1 back again", do: self("n1", up)},
				{name: "time passes", do: run(30 * time.Minute)},
			},
		},
		{
			name: "hold-down does not delay replacing a holder that is down",
			steps: []step{
				{name: "n1 down", do: self("n1", down), want: failover12},
				{name: "confirmed", do: res("pbx", "n2", events.OutcomeApplied)},
				{name: "n1 back", do: self("n1", up), want: []string{"hold n2"}},
				{name: "1 s later n2 down", do: func(f *fx) Output { f.now = f.now.Add(time.Second); return f.setSelf("n2", down) },
					want: []string{"failover n2->n1", "release n2", "claim n1 prev=n2 fenced"}},
			},
		},
		{
			name: "not leading: observes, emits nothing; leading again: acts with the new epoch",
			steps: []step{
				{name: "step down", do: func(f *fx) Output {
					if err := f.c.SetLeadership(1, false); err != nil {
						f.t.Fatal(err)
					}
					f.leading = false
					return Output{}
				}},
				{name: "n1 down while not leading", do: self("n1", down)},
				{name: "time while not leading", do: run(10 * time.Second)},
				{name: "lead at epoch 2", do: func(f *fx) Output { f.lead(2); return f.tick(0) }, want: failover12},
			},
		},
		{
			name: "unknown nodes, groups and clusters are ignored",
			steps: []step{
				{name: "heartbeat of n9", do: func(f *fx) Output {
					return f.handle(f.env("n9", "prober"), &events.NodeHeartbeat{Node: "n9", IntervalMS: 1000, Version: "x",
						Checks: map[string]events.CheckState{"pbx": {TargetNode: "n9", Role: events.RoleSelf, Health: up}}})
				}},
				{name: "n9 says n1 is down", do: func(f *fx) Output {
					env, tr := f.transition("n9", "n1", "pbx", events.RoleSelf, down)
					return f.handle(env, &tr)
				}},
				{name: "other cluster says n1 down", do: func(f *fx) Output {
					keep := f.self["n1"]
					env, tr := f.transition("n1", "n1", "pbx", events.RoleSelf, down)
					f.self["n1"] = keep // that cluster's n1 is not ours
					env.Cluster = "elsewhere"
					return f.handle(env, &tr)
				}},
				{name: "result for unknown group", do: func(f *fx) Output {
					return f.handle(f.env("n2", "ipmover"), &events.CommandResult{CommandID: "x", CommandType: events.TypeClaimIP, Node: "n2", Group: "nope", Outcome: events.OutcomeFailed, Error: "x"})
				}},
				{name: "steady", do: run(5 * time.Second)},
			},
		},
		{
			name: "groups are independent; a node in two groups",
			cfg: testConfig(
				Group{Name: "a", Addresses: []string{"198.51.100.10/24"}, Nodes: []string{"n1", "n2"}, HealthCheck: "pbx"},
				Group{Name: "b", Addresses: []string{"198.51.100.20/24", "2001:db8::20/64"}, Nodes: []string{"n3", "n4", "n1"}, HealthCheck: "pbx"},
			),
			steps: []step{
				{name: "n1 down moves only a", do: self("n1", down), want: failover12},
				{name: "n3 down moves only b, past n1", do: self("n3", down), want: []string{"failover n3->n4", "release n3", "claim n4 prev=n3 fenced"}},
				{name: "a confirmed", do: res("a", "n2", events.OutcomeApplied)},
				// n4 is b's only eligible node: claimed again at once rather
				// than released, b holding nothing meanwhile.
				{name: "b times out with nobody left", do: run(5 * time.Second), want: []string{"retry n4->n4", "claim n4 prev=n3 fenced"}},
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
			if tc.setup != nil {
				tc.setup(f)
			} else {
				f.boot()
			}
			f.play(tc.steps)
		})
	}
}

// TestCausation checks the links an auditor follows: decision -> the event
// that triggered it and the evidence about the target; commands -> the
// decision; one correlation id along the chain; epoch and deadline stamped.
func TestCausation(t *testing.T) {
	f := newFx(t, testConfig())
	f.boot()
	if err := f.c.SetLeadership(7, true); err != nil {
		t.Fatal(err)
	}
	f.epoch = 7
	env, tr := f.transition("n1", "n1", "pbx", events.RoleSelf, down)
	env.CorrelationID = "0193a1b2-0000-7000-a000-000000000001"
	out := f.handle(env, &tr)
	if got := summary(out); !eq(got, []string{"failover n1->n2", "release n1", "claim n2 prev=n1 fenced"}) {
		t.Fatalf("got %q", got)
	}
	d := f.last[0].p.(events.ArbiterDecision)
	if d.CausedBy[0] != env.ID {
		t.Fatalf("first cause %s, want the transition %s", d.CausedBy[0], env.ID)
	}
	// The evidence that n2 was eligible (its heartbeat) is cited too.
	if len(d.CausedBy) < 2 {
		t.Fatalf("caused_by %v names no evidence about the target", d.CausedBy)
	}
	if f.last[0].env.CausationID != env.ID || f.last[0].env.CorrelationID != env.CorrelationID {
		t.Fatalf("decision envelope causation %s / correlation %s", f.last[0].env.CausationID, f.last[0].env.CorrelationID)
	}
	if !eq(d.Commands, []string{f.last[1].env.ID, f.last[2].env.ID}) {
		t.Fatalf("commands %v, emitted %s %s", d.Commands, f.last[1].env.ID, f.last[2].env.ID)
	}
	for _, b := range f.last[1:] {
		if b.env.CausationID != f.last[0].env.ID || b.env.CorrelationID != env.CorrelationID || b.env.Epoch != 7 {
			t.Fatalf("command %s: causation %s correlation %s epoch %d", b.env.ID, b.env.CausationID, b.env.CorrelationID, b.env.Epoch)
		}
	}
	if c := f.last[2].p.(events.ClaimIP); !c.NotAfter.Equal(f.now.Add(DefaultClaimTimeout-DefaultClockSkew)) || c.Addresses[0] != addr {
		t.Fatalf("claim %+v", c)
	}

	// A timeout has no triggering event: the retry names the claim it gave up.
	claimID := f.last[2].env.ID
	out = run(5 * time.Second)(f)
	if got := summary(out); !eq(got, []string{"retry n2->n3", "release n2", "claim n3 prev=n1 fenced"}) {
		t.Fatalf("got %q", got)
	}
	d = out.Emits[0].Payload.(events.ArbiterDecision)
	if d.CausedBy[0] != claimID {
		t.Fatalf("retry caused by %v, want the timed-out claim %s first", d.CausedBy, claimID)
	}
	// A late "applied" for the abandoned claim changes nothing: it was released.
	late := f.env("n2", "ipmover")
	out = f.handle(late, &events.CommandResult{CommandID: claimID, CommandType: events.TypeClaimIP, Node: "n2", Group: "pbx", Outcome: events.OutcomeApplied})
	if len(out.Emits) != 0 || f.c.Snapshot().Groups[0].Claim.Node != "n3" {
		t.Fatalf("late result acted on: %q", summary(out))
	}
}

func TestLeadershipEpochs(t *testing.T) {
	f := newFx(t, testConfig())
	if err := f.c.SetLeadership(0, true); !errors.Is(err, ErrEpoch) {
		t.Fatalf("epoch 0 accepted: %v", err)
	}
	f.boot() // epoch 1
	if err := f.c.SetLeadership(5, true); err != nil {
		t.Fatal(err)
	}
	if err := f.c.SetLeadership(4, true); !errors.Is(err, ErrEpoch) {
		t.Fatalf("older epoch accepted: %v", err)
	}
	if err := f.c.SetLeadership(4, false); !errors.Is(err, ErrEpoch) {
		t.Fatalf("older epoch accepted when stepping down: %v", err)
	}
	f.epoch = 5
	if got := summary(f.setSelf("n1", down)); len(got) != 3 {
		t.Fatalf("got %q", got)
	}
	for _, b := range f.last {
		if b.env.Epoch != 5 {
			t.Fatalf("epoch %d", b.env.Epoch)
		}
	}
}

// TestRestoreContinues: a new leader restored from the old one's snapshot
// keeps the outstanding claim, and gives it up (releasing the claimant)
// under its own epoch.
func TestRestoreContinues(t *testing.T) {
	old := newFx(t, testConfig())
	old.boot()
	old.setSelf("n1", down)
	snap := old.c.Snapshot()
	if snap.Groups[0].Claim == nil || snap.Groups[0].Claim.Node != "n2" || snap.Groups[0].PreviousHolder != "n1" {
		t.Fatalf("snapshot %+v", snap.Groups[0])
	}

	f := newFx(t, testConfig())
	f.now = old.now
	f.self, f.peer, f.claims, f.cmdIDs, f.evIDs = old.self, old.peer, old.claims, old.cmdIDs, old.evIDs
	if err := f.c.Restore(snap); err != nil {
		t.Fatal(err)
	}
	if err := f.c.SetLeadership(1, true); err == nil {
		// Restore remembers the epoch it came from; equal is allowed (same term).
		f.epoch, f.leading = 1, true
	}
	if err := f.c.SetLeadership(0, false); !errors.Is(err, ErrEpoch) {
		t.Fatalf("going below the restored epoch accepted: %v", err)
	}
	f.lead(2)
	out := run(5 * time.Second)(f)
	if got := summary(out); !eq(got, []string{"retry n2->n3", "release n2", "claim n3 prev=n1 fenced"}) {
		t.Fatalf("got %q", got)
	}

	bad := snap
	bad.Groups = []GroupState{{Name: "pbx", Holder: "n7"}}
	if err := f.c.Restore(bad); err == nil {
		t.Fatal("holder outside the group restored")
	}
	if f.c.Snapshot().Groups[0].Claim.Node != "n3" {
		t.Fatal("a refused restore changed the state")
	}
}

func TestConfigValidation(t *testing.T) {
	good := func() Config { return testConfig() }
	cases := map[string]func(c *Config){
		"no cluster":       func(c *Config) { c.Cluster = "" },
		"no id generator":  func(c *Config) { c.NewID = nil },
		"no groups":        func(c *Config) { c.Groups = nil },
		"bad address":      func(c *Config) { c.Groups[0].Addresses = []string{"198.51.100.10"} },
		"no nodes":         func(c *Config) { c.Groups[0].Nodes = nil },
		"duplicate node":   func(c *Config) { c.Groups[0].Nodes = []string{"n1", "n1"} },
		"bad node name":    func(c *Config) { c.Groups[0].Nodes = []string{"n.1"} },
		"no health check":  func(c *Config) { c.Groups[0].HealthCheck = "" },
		"negative timeout": func(c *Config) { c.ClaimTimeout = -time.Second },
		"duplicate group":  func(c *Config) { c.Groups = append(c.Groups, c.Groups[0]) },
	}
	for name, mut := range cases {
		cfg := good()
		mut(&cfg)
		if _, err := New(cfg); !errors.Is(err, ErrConfig) {
			t.Errorf("%s: got %v, want ErrConfig", name, err)
		}
	}
	c, err := New(good())
	if err != nil {
		t.Fatal(err)
	}
	if c.cfg.ClaimTimeout != 5*time.Second || c.cfg.CommandTTL != 10*time.Second || c.cfg.HoldDown != 10*time.Second || c.cfg.SettleAfter != 3*time.Second {
		t.Fatalf("defaults %+v", c.cfg)
	}
}

// TestClaimWaitsOnlyForReleasesOfNodesStillHeard: a holder that reports its
// own PBX down is alive on the bus and lets go in milliseconds, so the
// claim names its release for the claimant to wait on, also while only its
// beacons show it on the bus; a holder replaced because it is silent
// cannot answer, so the claim names nothing to wait on.
func TestClaimWaitsOnlyForReleasesOfNodesStillHeard(t *testing.T) {
	claimOf := func(t *testing.T, out Output) (events.ClaimIP, string) {
		t.Helper()
		var claim *events.ClaimIP
		var release string
		for _, e := range out.Emits {
			switch p := e.Payload.(type) {
			case events.ClaimIP:
				claim = &p
			case events.ReleaseIP:
				if p.Node == "n1" {
					release = e.ID
				}
			}
		}
		if claim == nil || release == "" {
			t.Fatalf("no release of n1 and claim in %q", summary(out))
		}
		return *claim, release
	}

	heard := newFx(t, testConfig())
	heard.boot()
	claim, release := claimOf(t, heard.setSelf("n1", down))
	if !slices.Equal(claim.AfterReleases, []string{release}) {
		t.Fatalf("holder heard: claim waits on %v, want its release %s", claim.AfterReleases, release)
	}

	silent := newFx(t, testConfig())
	silent.boot()
	run(8*time.Second, "n1")(silent)
	silent.setPeer("n2", "n1", down)
	claim, _ = claimOf(t, silent.setPeer("n3", "n1", down))
	if len(claim.AfterReleases) != 0 {
		t.Fatalf("holder silent: claim waits on %v, want nothing", claim.AfterReleases)
	}

	// Heartbeats late (they come through the live stream) but beacons
	// arriving: the holder is on the bus and its executor answers.
	late := newFx(t, testConfig())
	late.boot()
	const every = 100 * time.Millisecond
	for range 8 {
		late.runBeacons(time.Second, every)
		late.beat("n1")
	}
	claim, release = claimOf(t, late.setSelf("n1", down))
	if !slices.Equal(claim.AfterReleases, []string{release}) {
		t.Fatalf("holder's heartbeats late, beacons arriving: claim waits on %v, want its release %s", claim.AfterReleases, release)
	}
}
