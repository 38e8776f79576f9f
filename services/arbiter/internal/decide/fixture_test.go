package decide

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/events"
)

var t0 = time.Date(2026, 11, 30, 2, 30, 0, 0, time.UTC)

const addr = "198.51.100.10/24"

// idGen returns UUID-v7-shaped ids in sequence; the variant nibble tells
// core-made ids (8) from fixture-made event ids (9) when a test fails.
func idGen(variant byte) func() string {
	n := 0
	return func() string {
		n++
		return fmt.Sprintf("0193a1b2-0000-7000-%c000-%012x", variant, n)
	}
}

func testConfig(groups ...Group) Config {
	if len(groups) == 0 {
		groups = []Group{{Name: "pbx", Addresses: []string{addr}, Nodes: []string{"n1", "n2", "n3"}, HealthCheck: "pbx"}}
	}
	return Config{Cluster: "lab", Groups: groups, NewID: idGen('8')}
}

// fx drives a core the way the shell would, and keeps what each node's
// prober would currently report so heartbeats are consistent with transitions.
type fx struct {
	t       testing.TB
	c       *Core
	cfg     Config
	now     time.Time
	newEv   func() string
	epoch   uint64
	leading bool
	self    map[string]events.CheckState            // node -> its self check "pbx"
	peer    map[string]map[string]events.CheckState // observer -> target -> state
	chans   map[string]int                          // node -> active channels its heartbeat reports (absent: unknown)
	calls   map[string]int                          // node -> active calls likewise
	claims  map[string]string                       // group -> last claim command id
	cmdIDs  map[string]bool                         // every id the core emitted
	evIDs   map[string]bool                         // every event id fed to the core
	last    []built
	onOut   func(Output) // extra checks after every core call (the randomized test's model)
	// summaries are the ids of the calls summaries fed, in order.
	summaries []string
}

type built struct {
	env events.Envelope
	p   events.Payload
}

func newFx(t testing.TB, cfg Config) *fx {
	t.Helper()
	c, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return &fx{t: t, c: c, cfg: cfg, now: t0, newEv: idGen('9'),
		self: map[string]events.CheckState{}, peer: map[string]map[string]events.CheckState{},
		claims: map[string]string{}, cmdIDs: map[string]bool{}, evIDs: map[string]bool{}, chans: map[string]int{}, calls: map[string]int{}}
}

func (f *fx) lead(epoch uint64) {
	f.t.Helper()
	if err := f.c.SetLeadership(epoch, true); err != nil {
		f.t.Fatalf("SetLeadership(%d): %v", epoch, err)
	}
	f.epoch, f.leading = epoch, true
}

func (f *fx) env(node, service string) events.Envelope {
	id := f.newEv()
	f.evIDs[id] = true
	return events.Envelope{ID: id, Time: f.now, Source: events.Source{Service: service, Node: node}, Cluster: "lab"}
}

func (f *fx) handle(env events.Envelope, p events.Decoded) Output {
	out := f.c.Handle(f.now, env, p)
	f.check(out)
	if f.onOut != nil {
		f.onOut(out)
	}
	return out
}

// hb sends node's heartbeat with everything its prober currently reports.
func (f *fx) hb(node string) Output {
	checks := map[string]events.CheckState{}
	if s, ok := f.self[node]; ok {
		checks["pbx"] = s
	}
	for target, s := range f.peer[node] {
		checks["peer-"+target] = s
	}
	hb := events.NodeHeartbeat{Node: node, IntervalMS: 1000, Version: "test", Checks: checks}
	if n, ok := f.chans[node]; ok {
		hb.ActiveChannels = &n
	}
	if n, ok := f.calls[node]; ok {
		hb.ActiveCalls = &n
	}
	return f.handle(f.env(node, "prober"), &hb)
}

// op sends an operator action through Operate, as the shell would.
func (f *fx) op(verb events.OperatorVerb, group, node, reason string) (Reply, Output) {
	id := f.newEv()
	f.evIDs[id] = true
	rep, out := f.c.Operate(f.now, Request{ID: id, OperatorRequest: events.OperatorRequest{Verb: verb, Group: group, Node: node,
		Reason: reason, Operator: "alice@ops1"}})
	f.check(out)
	if f.onOut != nil {
		f.onOut(out)
	}
	return rep, out
}

// permit delivers a failback permit valid over [from, until).
func (f *fx) permit(group string, from, until time.Time) Output {
	return f.handle(f.env("ctl1", "scheduler"), &events.FailbackPermit{Group: group, Window: "nightly", ValidFrom: from, ValidUntil: until})
}

// repl delivers a replication report from node to peer.
func (f *fx) repl(node, peer, tree string, caughtUp bool) Output {
	return f.handle(f.env(node, "replicator"), &events.ReplicationStatus{Node: node, Peer: peer, Tree: tree, CaughtUp: caughtUp})
}

func (f *fx) transition(observer, target, check string, role events.Role, to events.Health) (events.Envelope, events.HealthTransition) {
	env := f.env(observer, "prober")
	st := events.CheckState{TargetNode: target, Role: role, Health: to, Since: f.now, SinceEvent: env.ID}
	var from events.Health
	if role == events.RoleSelf {
		from = f.self[observer].Health
		f.self[observer] = st
	} else {
		if f.peer[observer] == nil {
			f.peer[observer] = map[string]events.CheckState{}
		}
		from = f.peer[observer][target].Health
		f.peer[observer][target] = st
	}
	if from == "" || from == to { // a transition must change something to be valid
		from = events.HealthUnknown
		if to == events.HealthUnknown {
			from = events.HealthUp
		}
	}
	return env, events.HealthTransition{Check: check, TargetNode: target, Role: role, From: from, To: to, Reason: "test",
		Consecutive: 3, Rise: 2, Fall: 3, Evidence: []events.Evidence{{At: f.now, OK: to == events.HealthUp, Error: "x"}}}
}

func (f *fx) setSelf(node string, h events.Health) Output {
	env, tr := f.transition(node, node, "pbx", events.RoleSelf, h)
	return f.handle(env, &tr) // pointer, as events.Decode returns
}

func (f *fx) setPeer(observer, target string, h events.Health) Output {
	env, tr := f.transition(observer, target, "peer-"+target, events.RolePeer, h)
	return f.handle(env, &tr)
}

func (f *fx) result(group, node string, o events.Outcome) Output {
	env := f.env(node, "ipmover")
	cmd := f.claims[group]
	env.CausationID = cmd
	r := events.CommandResult{CommandID: cmd, CommandType: events.TypeClaimIP, Node: node, Group: group, Outcome: o}
	if o != events.OutcomeApplied && o != events.OutcomeDuplicate {
		r.Error = "test says " + string(o)
	}
	return f.handle(env, &r)
}

func (f *fx) tick(d time.Duration) Output {
	f.now = f.now.Add(d)
	out := f.c.Tick(f.now)
	f.check(out)
	if f.onOut != nil {
		f.onOut(out)
	}
	return out
}

// check enforces what every Output must satisfy, whatever the scenario:
// every emit builds through events.New (so the shell can publish it), a
// decision comes first and lists exactly the commands that follow it, each
// command is caused by that decision and carries the leader's epoch and a
// deadline of now+CommandTTL, every decision cites events that exist, a
// release precedes the claim, and nothing is emitted while not leading.
func (f *fx) check(out Output) {
	// No t.Helper here: it walks the stack on every call and dominates the
	// randomized test's run time; failures name what broke instead.
	f.last = f.last[:0]
	if len(out.Emits) > 0 && !f.leading {
		f.t.Fatalf("emitted %d events while not leading", len(out.Emits))
	}
	var dec *events.ArbiterDecision
	var decID string
	var pos int
	ttl := f.c.cfg.CommandTTL
	for i, e := range out.Emits {
		env, err := events.New(events.Source{Service: "arbiter", Node: "ctl1"}, "lab", e.Payload, e.Options...)
		if err != nil {
			f.t.Fatalf("emit %d (%T) does not build: %v", i, e.Payload, err)
		}
		if env.ID != e.ID {
			f.t.Fatalf("emit %d: envelope id %s, Emit.ID %s", i, env.ID, e.ID)
		}
		if env.Epoch != f.epoch {
			f.t.Fatalf("emit %d: epoch %d, leader's is %d", i, env.Epoch, f.epoch)
		}
		f.last = append(f.last, built{env, e.Payload})
		switch p := e.Payload.(type) {
		case events.OperatorAction:
			if i != 0 {
				f.t.Fatalf("operator action record at position %d, want first", i)
			}
			f.cmdIDs[env.ID] = true
		case events.ArbiterDecision:
			if dec != nil && pos != len(dec.Commands) {
				f.t.Fatalf("decision %s listed %d commands, %d followed", decID, len(dec.Commands), pos)
			}
			dec, decID, pos = &p, env.ID, 0
			if len(p.CausedBy) == 0 || env.CausationID != p.CausedBy[0] {
				f.t.Fatalf("decision causation %q, caused_by %v", env.CausationID, p.CausedBy)
			}
			for _, id := range p.CausedBy {
				if !f.evIDs[id] && !f.cmdIDs[id] {
					f.t.Fatalf("decision cites %s, which the core was never given nor emitted", id)
				}
			}
			f.cmdIDs[env.ID] = true
		case events.PlannedMove:
			if env.CausationID != p.CausedBy[0] {
				f.t.Fatalf("planned move causation %q, caused_by %v", env.CausationID, p.CausedBy)
			}
			for _, id := range p.CausedBy {
				if !f.evIDs[id] && !f.cmdIDs[id] {
					f.t.Fatalf("planned move cites %s, which the core was never given nor emitted", id)
				}
			}
			f.cmdIDs[env.ID] = true
		case events.GroupPin:
			if env.CausationID != p.CausedBy[0] {
				f.t.Fatalf("pin causation %q, caused_by %v", env.CausationID, p.CausedBy)
			}
			for _, id := range p.CausedBy {
				if !f.evIDs[id] && !f.cmdIDs[id] {
					f.t.Fatalf("pin cites %s, which the core was never given nor emitted", id)
				}
			}
			f.cmdIDs[env.ID] = true
		case events.ReleaseIP, events.ClaimIP:
			if dec == nil || pos >= len(dec.Commands) || dec.Commands[pos] != env.ID {
				f.t.Fatalf("command %s (%T) not listed by a preceding decision", env.ID, p)
			}
			pos++
			if env.CausationID != decID {
				f.t.Fatalf("command %s caused by %s, want its decision %s", env.ID, env.CausationID, decID)
			}
			var notAfter time.Time
			want := ttl
			if c, ok := p.(events.ClaimIP); ok {
				// A claim expires when the arbiter gives up on it, less the
				// executor clock skew allowed (Config.ClaimTTL).
				notAfter, want = c.NotAfter, f.c.cfg.ClaimTimeout-f.c.cfg.ClockSkew
				f.claims[c.Group] = env.ID
				if pos != len(dec.Commands) {
					f.t.Fatalf("claim is not the last command of its decision: releases must come first")
				}
			} else {
				notAfter = p.(events.ReleaseIP).NotAfter
			}
			if !notAfter.Equal(f.now.Add(want)) {
				f.t.Fatalf("command %s deadline %v, want now+%v", env.ID, notAfter, want)
			}
			f.cmdIDs[env.ID] = true
		default:
			f.t.Fatalf("unexpected emit %T", p)
		}
	}
	if dec != nil && pos != len(dec.Commands) {
		f.t.Fatalf("decision listed %d commands, %d followed", len(dec.Commands), pos)
	}
}

// summary renders an Output compactly for table comparisons.
func summary(out Output) []string {
	var s []string
	for _, e := range out.Emits {
		switch p := e.Payload.(type) {
		case events.OperatorAction:
			s = append(s, fmt.Sprintf("op %s accepted=%v", p.Verb, p.Accepted))
		case events.ArbiterDecision:
			switch {
			case p.Action == events.ActionHold && p.NeedsHuman:
				s = append(s, "HUMAN hold "+p.From)
			case p.Action == events.ActionHold:
				s = append(s, "hold "+p.From)
			default:
				s = append(s, fmt.Sprintf("%s %s->%s", p.Action, p.From, p.To))
			}
		case events.PlannedMove:
			s = append(s, "planned "+string(p.Stage))
		case events.ReleaseIP:
			s = append(s, "release "+p.Node)
		case events.ClaimIP:
			c := "claim " + p.Node
			if p.PreviousHolder != "" {
				c += " prev=" + p.PreviousHolder
			}
			if p.PreviousHolderFenced {
				c += " fenced"
			}
			s = append(s, c)
		}
	}
	return s
}

func reasonOf(out Output) string {
	for _, e := range out.Emits {
		if d, ok := e.Payload.(events.ArbiterDecision); ok {
			return d.Reason
		}
	}
	return ""
}

// boot: leader at epoch 1, all nodes up and heartbeating with peers seeing
// each other up, n1 placed and confirmed.
func (f *fx) boot() {
	f.t.Helper()
	f.lead(1)
	nodes := f.allNodes()
	for _, n := range nodes {
		f.self[n] = events.CheckState{TargetNode: n, Role: events.RoleSelf, Health: events.HealthUp, Since: f.now}
		f.peer[n] = map[string]events.CheckState{}
		for _, m := range nodes {
			if m != n {
				f.peer[n][m] = events.CheckState{TargetNode: m, Role: events.RolePeer, Health: events.HealthUp, Since: f.now}
			}
		}
	}
	for _, n := range nodes {
		f.hb(n)
	}
	for _, g := range f.cfg.Groups {
		f.result(g.Name, g.Nodes[0], events.OutcomeApplied)
	}
	for _, g := range f.c.Snapshot().Groups {
		if g.Holder == "" {
			f.t.Fatalf("boot: group %s has no holder: %+v", g.Name, g)
		}
	}
}

func (f *fx) allNodes() []string {
	seen := map[string]bool{}
	for _, g := range f.cfg.Groups {
		for _, n := range g.Nodes {
			seen[n] = true
		}
	}
	return slices.Sorted(maps.Keys(seen))
}

// beat heartbeats every node except those listed (silent ones).
func (f *fx) beat(except ...string) Output {
	var all Output
	for _, n := range f.allNodes() {
		if !slices.Contains(except, n) {
			out := f.hb(n)
			all.Emits = append(all.Emits, out.Emits...)
		}
	}
	return all
}

func eq(a, b []string) bool { return strings.Join(a, "|") == strings.Join(b, "|") }
