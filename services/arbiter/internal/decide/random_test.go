package decide

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/events"
)

// world is the randomized test's ground truth and its independent model of
// what the arbiter has been told and what it has commanded. The model is
// deliberately written from fan's invariants (docs/invariants.md), not from the core's
// code, so that a wrong rule in the core shows up as a broken invariant.
type world struct {
	t     *testing.T
	f     *fx
	rng   *rand.Rand
	nodes []string
	pbxUp map[string]bool
	onBus map[string]bool
	cut   map[[2]string]bool // observer, target: the LAN path between them is broken

	// What the arbiter was told (latest delivered), by the test's own bookkeeping.
	toldSelf map[string]events.Health
	toldPeer map[[2]string]events.Health
	lastHB   map[string]time.Time

	claimed   map[string]map[string]bool // group -> nodes commanded to hold and not released since
	confirmed map[string]string          // group -> node whose current claim was confirmed
	answered  map[string]bool            // claim ids already answered
	allClaims map[string][]claimRec      // group -> every claim issued, for late answers
	steps     int
	seed      uint64

	failbackTold map[string]bool // group -> failback hold said during this tenure and term

	// Operator and scheduler inputs, as the model knows them.
	permits     map[string][2]time.Time // group -> [from, until) of the last permit delivered
	standby     map[string]bool
	maintenance map[string]bool // group name, or "" for the cluster
	opID        string          // the operator action being handled, while it is
	autoMoves   map[string][]time.Time
	stats       map[string]int // what the generator exercised, so a tame run fails
}

// randCap is the randomized test's move cap: low enough to be reached.
const randCap = 3

// fail names the seed and step so a failure can be replayed.
func (w *world) fail(format string, args ...any) {
	w.t.Helper()
	w.t.Fatalf("seed %d step %d: %s", w.seed, w.steps, fmt.Sprintf(format, args...))
}

type claimRec struct{ id, node string }

var randGroups = []Group{
	{Name: "g1", Addresses: []string{"198.51.100.10/24"}, Nodes: []string{"n1", "n2", "n3"}, HealthCheck: "pbx"},
	{Name: "g2", Addresses: []string{"198.51.100.20/24"}, Nodes: []string{"n4", "n3", "n2"}, HealthCheck: "pbx"},
}

func newWorld(t *testing.T, seed uint64) *world {
	w := &world{t: t, seed: seed, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		nodes: []string{"n1", "n2", "n3", "n4"},
		pbxUp: map[string]bool{}, onBus: map[string]bool{}, cut: map[[2]string]bool{},
		toldSelf: map[string]events.Health{}, toldPeer: map[[2]string]events.Health{}, lastHB: map[string]time.Time{},
		claimed: map[string]map[string]bool{}, confirmed: map[string]string{}, answered: map[string]bool{}, allClaims: map[string][]claimRec{},
		failbackTold: map[string]bool{},
		permits:      map[string][2]time.Time{}, standby: map[string]bool{}, maintenance: map[string]bool{},
		autoMoves: map[string][]time.Time{}, stats: map[string]int{},
	}
	cfg := testConfig(randGroups...)
	cfg.MaxMovesPerHour = randCap
	cfg.Groups = append([]Group(nil), cfg.Groups...)
	for i := range cfg.Groups {
		// Short enough for failbacks to happen within a sequence.
		cfg.Groups[i].Failback = FailbackPolicy{StableFor: 5 * time.Second, DrainMaxChannels: 1, OnWindowClose: WindowCloseForce, ForceBefore: 3 * time.Second}
	}
	w.f = newFx(t, cfg)
	w.f.onOut = w.verify
	for _, n := range w.nodes {
		w.pbxUp[n], w.onBus[n] = true, true
		w.f.chans[n] = w.rng.IntN(3) // known from the first heartbeat, so planned moves can drain
	}
	for _, g := range randGroups {
		w.claimed[g.Name] = map[string]bool{}
	}
	w.f.lead(1)
	for _, n := range w.nodes {
		w.refresh(n)
	}
	return w
}

func health(ok bool) events.Health {
	if ok {
		return events.HealthUp
	}
	return events.HealthDown
}

// refresh recomputes what n's prober believes (its own PBX, and each peer
// it checks over the LAN) and, when n is on the bus, publishes transitions.
func (w *world) refresh(n string) {
	f := w.f
	if h := health(w.pbxUp[n]); f.self[n].Health != h {
		if w.onBus[n] {
			w.toldSelf[n] = h
			f.setSelf(n, h)
		} else {
			f.self[n] = events.CheckState{TargetNode: n, Role: events.RoleSelf, Health: h, Since: f.now}
		}
	}
	for _, t := range w.nodes {
		if t == n {
			continue
		}
		h := health(w.pbxUp[t] && !w.cut[[2]string{n, t}])
		if f.peer[n][t].Health == h {
			continue
		}
		if w.onBus[n] {
			w.toldPeer[[2]string{n, t}] = h
			f.setPeer(n, t, h)
		} else {
			if f.peer[n] == nil {
				f.peer[n] = map[string]events.CheckState{}
			}
			f.peer[n][t] = events.CheckState{TargetNode: t, Role: events.RolePeer, Health: h, Since: f.now}
		}
	}
}

func (w *world) heartbeat(n string) {
	if !w.onBus[n] {
		return
	}
	w.lastHB[n] = w.f.now
	w.toldSelf[n] = w.f.self[n].Health
	for t, s := range w.f.peer[n] {
		w.toldPeer[[2]string{n, t}] = s.Health
	}
	w.f.hb(n)
}

// fresh: the arbiter heard n's heartbeat within the silence threshold.
func (w *world) fresh(n string) bool {
	last, ok := w.lastHB[n]
	return ok && w.f.now.Sub(last) <= DefaultSilentAfter
}

// holderDown is invariant 6's rule, computed from what the arbiter was told:
// its own prober says down, or it is silent and the peers that are heard
// from and have an opinion all say down.
func (w *world) holderDown(h string) bool {
	if w.toldSelf[h] == events.HealthDown {
		return true
	}
	if w.fresh(h) {
		return false
	}
	downs := 0
	for _, o := range w.nodes {
		if o == h || !w.fresh(o) {
			continue
		}
		switch w.toldPeer[[2]string{o, h}] {
		case events.HealthUp:
			return false
		case events.HealthDown:
			downs++
		}
	}
	return downs > 0
}

// verify checks the invariants on every Output, in emission order.
func (w *world) verify(out Output) {
	// The holder as confirmed before this Output: a move releases it first,
	// and that release must not make the move look like anything but a move.
	before := maps.Clone(w.confirmed)
	var dec events.ArbiterDecision
	// A planned move's decision cites the stage that decided it, which
	// cites the operator's action: it is the operator's word, only later.
	moved := map[string]bool{}
	for _, e := range out.Emits {
		switch p := e.Payload.(type) {
		case events.PlannedMove:
			w.stats["planned_"+string(p.Stage)]++
			if p.Stage == events.PlannedMoved {
				moved[e.ID] = true
			}
		case events.OperatorAction:
			if p.Accepted && p.Verb == events.OpMaintenanceOff && p.Group != "" {
				delete(w.autoMoves, p.Group) // a human looked: the count starts again
			}
		case events.ArbiterDecision:
			dec = p
			byOperator := (w.opID != "" && p.CausedBy[0] == w.opID) || moved[p.CausedBy[0]]
			w.stats[string(p.Action)]++
			if p.NeedsHuman {
				w.stats["needs_human"]++
			}
			if p.Action != events.ActionHold && !byOperator && (w.maintenance[""] || w.maintenance[p.Group]) {
				w.fail("automatic %s of %s while in maintenance: %q", p.Action, p.Group, p.Reason)
			}
			if p.Action == events.ActionFailback && !byOperator {
				pm, ok := w.permits[p.Group]
				if !ok || w.f.now.Before(pm[0]) || !w.f.now.Before(pm[1]) {
					w.fail("failback of %s outside a permitted window (permit %v, now %v)", p.Group, pm, w.f.now)
				}
			}
			if (p.Action == events.ActionFailover || p.Action == events.ActionFailback) && !byOperator {
				// The cap: never more than randCap automatic moves in any hour.
				recent := w.autoMoves[p.Group][:0:0]
				for _, at := range w.autoMoves[p.Group] {
					if w.f.now.Sub(at) < time.Hour {
						recent = append(recent, at)
					}
				}
				if len(recent) >= randCap {
					w.fail("automatic move %d of %s within an hour, cap %d: %q", len(recent)+1, p.Group, randCap, p.Reason)
				}
				w.autoMoves[p.Group] = append(recent, w.f.now)
			}
			// No event storms: "failback needs a permit" is said at most once
			// per holder's tenure (a move or a new term starts a new one),
			// however often the preferred node flaps.
			if p.Action == events.ActionHold && strings.Contains(p.Reason, "failback needs a permit") {
				k := p.Group + "/" + strings.Fields(p.Reason[strings.Index(p.Reason, "preferred "):])[1]
				if w.failbackTold[k] {
					w.fail("failback hold for %s repeated within one tenure: %q", k, p.Reason)
				}
				w.failbackTold[k] = true
			}
			if p.Action != events.ActionHold {
				for k := range w.failbackTold {
					if strings.HasPrefix(k, p.Group+"/") {
						delete(w.failbackTold, k)
					}
				}
			}
		case events.ReleaseIP:
			delete(w.claimed[p.Group], p.Node)
			if w.confirmed[p.Group] == p.Node {
				delete(w.confirmed, p.Group)
			}
		case events.ClaimIP:
			for other := range w.claimed[p.Group] {
				if other != p.Node {
					w.fail("claim %s on %s while %s was commanded to hold it and not released", p.Group, p.Node, other)
				}
			}
			if w.toldSelf[p.Node] != events.HealthUp || !w.fresh(p.Node) {
				w.fail("claim %s on %s, which is not healthy (told %s, last heartbeat %v ago)",
					p.Group, p.Node, w.toldSelf[p.Node], w.f.now.Sub(w.lastHB[p.Node]))
			}
			if w.standby[p.Node] {
				w.fail("claim %s on %s, which an operator put in standby", p.Group, p.Node)
			}
			// Away from a confirmed holder that is fine: only a failback in a
			// window (checked above), an operator's word, or leaving a
			// standby holder.
			if h, ok := before[p.Group]; ok && h != p.Node && !w.holderDown(h) {
				byOperator := (w.opID != "" && dec.CausedBy[0] == w.opID) || moved[dec.CausedBy[0]]
				if dec.Action != events.ActionFailback && !byOperator && !w.standby[h] {
					w.fail("%s: claim %s on %s while the confirmed holder %s is not down", dec.Action, p.Group, p.Node, h)
				}
			}
			w.claimed[p.Group][p.Node] = true
			delete(w.confirmed, p.Group)
			w.allClaims[p.Group] = append(w.allClaims[p.Group], claimRec{e.ID, p.Node})
		}
	}
}

func (w *world) answer(g string) {
	claims := w.allClaims[g]
	if len(claims) == 0 {
		return
	}
	c := claims[len(claims)-1]
	late := w.rng.IntN(6) == 0
	if late {
		c = claims[w.rng.IntN(len(claims))] // possibly an old, abandoned claim
	}
	if w.answered[c.id] {
		return
	}
	w.answered[c.id] = true
	outcomes := []events.Outcome{events.OutcomeApplied, events.OutcomeApplied, events.OutcomeApplied, events.OutcomeDuplicate,
		events.OutcomeFailed, events.OutcomeExpired, events.OutcomeStaleEpoch}
	o := outcomes[w.rng.IntN(len(outcomes))]
	w.f.claims[g] = c.id
	latest := c.id == claims[len(claims)-1].id
	w.f.result(g, c.node, o)
	// A confirmation counts only when the leading core held this claim as
	// outstanding; a late answer to an abandoned claim confirms nothing.
	if latest && w.f.leading && w.claimed[g][c.node] && (o == events.OutcomeApplied || o == events.OutcomeDuplicate) {
		if w.f.c.groups[w.f.c.byName[g]].holder == c.node {
			w.confirmed[g] = c.node
		}
	}
}

// handover moves leadership: step down, then either the same core leads
// again or a fresh core restored from the persisted snapshot takes over,
// each time with a higher epoch.
func (w *world) handover() {
	f := w.f
	if f.leading {
		if err := f.c.SetLeadership(f.epoch, false); err != nil {
			w.t.Fatal(err)
		}
		f.leading = false
		return
	}
	if w.rng.IntN(2) == 0 {
		snap := f.c.Snapshot()
		c, err := New(f.cfg)
		if err != nil {
			w.t.Fatal(err)
		}
		if err := c.Restore(snap); err != nil {
			w.t.Fatal(err)
		}
		f.c = c
	}
	f.lead(f.epoch + 1)
	clear(w.failbackTold) // a new term explains the standing situation again
}

func (w *world) step() {
	w.steps++
	f, r := w.f, w.rng
	n := w.nodes[r.IntN(len(w.nodes))]
	switch k := r.IntN(100); {
	case k < 14: // the PBX flaps
		w.pbxUp[n] = !w.pbxUp[n]
		for _, m := range w.nodes {
			w.refresh(m)
		}
	case k < 20: // cut off from the bus, or back
		w.onBus[n] = !w.onBus[n]
		if w.onBus[n] {
			w.heartbeat(n)
		}
		w.refresh(n)
	case k < 24: // a node crashes outright
		w.pbxUp[n], w.onBus[n] = false, false
		for _, m := range w.nodes {
			w.refresh(m)
		}
	case k < 30: // a LAN path between two nodes breaks or heals
		o := w.nodes[r.IntN(len(w.nodes))]
		if o != n {
			w.cut[[2]string{o, n}] = !w.cut[[2]string{o, n}]
			w.refresh(o)
		}
	case k < 70: // time passes: heartbeats, then the shell's tick
		f.now = f.now.Add(time.Duration(200+r.IntN(2300)) * time.Millisecond)
		for _, m := range w.nodes {
			if r.IntN(10) > 0 { // heartbeats are sometimes late
				w.heartbeat(m)
			}
		}
		f.tick(0)
	case k < 90: // an executor answers
		w.answer(randGroups[r.IntN(len(randGroups))].Name)
	case k < 92:
		w.handover()
	case k < 94: // the scheduler opens a window (possibly already over, or not yet begun)
		g := randGroups[r.IntN(len(randGroups))].Name
		from := f.now.Add(time.Duration(r.IntN(20)-10) * time.Second)
		until := from.Add(time.Duration(5+r.IntN(40)) * time.Second)
		w.permits[g] = [2]time.Time{from, until}
		f.permit(g, from, until)
	case k < 96: // calls come and go on a node, reported by its next heartbeat
		f.chans[n] = r.IntN(3)
	case k < 97: // the replicator reports (not required here: it must not disturb anything)
		f.repl(n, w.nodes[r.IntN(len(w.nodes))], "/etc/asterisk", r.IntN(2) == 0)
	case k < 99: // an operator acts
		w.operate()
	default: // a node of another group or cluster speaks
		out := f.handle(f.env("n9", "prober"), &events.NodeHeartbeat{Node: "n9", IntervalMS: 1000, Version: "x",
			Checks: map[string]events.CheckState{"pbx": {TargetNode: "n9", Role: events.RoleSelf, Health: events.HealthUp}}})
		if len(out.Emits) != 0 {
			w.fail("an unknown node caused %q", summary(out))
		}
	}
}

func (w *world) operate() {
	f, r := w.f, w.rng
	g := randGroups[r.IntN(len(randGroups))].Name
	n := w.nodes[r.IntN(len(w.nodes))]
	var verb events.OperatorVerb
	group, node := g, ""
	switch r.IntN(7) {
	case 0:
		verb, node = events.OpSwitchover, n
	case 1:
		verb = events.OpFailback
	case 2, 3:
		verb = events.OpMaintenanceOn
		if r.IntN(2) == 0 {
			group = ""
		}
	case 4:
		verb = events.OpMaintenanceOff
		if r.IntN(2) == 0 {
			group = ""
		}
	case 5:
		verb, group, node = events.OpNodeStandby, "", n
	default:
		verb, group, node = events.OpNodeActive, "", n
	}
	id := f.newEv()
	f.evIDs[id] = true
	w.opID = id
	// The model learns maintenance and standby before verifying the
	// output, because the core applies them before it decides.
	if f.leading {
		switch verb {
		case events.OpMaintenanceOn:
			w.maintenance[group] = true
		case events.OpMaintenanceOff:
			delete(w.maintenance, group)
		case events.OpNodeStandby:
			w.standby[node] = true
		case events.OpNodeActive:
			delete(w.standby, node)
		}
	}
	req := events.OperatorRequest{Verb: verb, Group: group, Node: node, Reason: "random", Operator: "rand"}
	if verb == events.OpSwitchover || verb == events.OpNodeStandby {
		// Planned moves: at once, waiting to drain (giving up or forcing
		// within seconds, so deadlines pass within a sequence), or a cancel.
		switch r.IntN(5) {
		case 0:
			req.Drain = events.DrainNow
		case 1:
			req.Drain, req.WithinMS = events.DrainForceAfter, int64(1000+r.IntN(20_000))
		case 2:
			req.WithinMS = int64(1000 + r.IntN(20_000))
		case 3:
			if verb == events.OpSwitchover {
				req.Cancel, req.Node = true, ""
			}
		}
	}
	rep, out := f.c.Operate(f.now, Request{ID: id, OperatorRequest: req})
	f.check(out)
	w.verify(out)
	w.opID = ""
	if rep.Accepted {
		w.stats["op_"+string(verb)]++
	}
	if !f.leading && (rep.Accepted || len(out.Emits) > 0) {
		w.fail("a follower accepted %s", verb)
	}
}

// TestRandomized drives thousands of seeded sequences of flaps, silences,
// partitions, crashes, claim failures and timeouts, late answers and
// leadership changes (same core and restored cores), checking after every
// core call: one commanded holder per group (a release to the previous one
// is issued first), claims only to nodes the arbiter knows healthy, no move
// away from a confirmed holder that is not down (no failback, invariant 6),
// and — through fx.check — epochs, deadlines, causation and leadership.
// A failure names its seed: rerun with that seed to reproduce it.
func TestRandomized(t *testing.T) {
	sequences, length := 2000, 100
	if testing.Short() {
		sequences = 300
	}
	moves := 0
	total := map[string]int{}
	for seed := range uint64(sequences) {
		w := newWorld(t, seed)
		func() {
			defer func() {
				if t.Failed() {
					t.Logf("failing seed %d at step %d", seed, w.steps)
				}
			}()
			for range length {
				w.step()
			}
		}()
		for _, g := range randGroups {
			moves += len(w.allClaims[g.Name])
		}
		for k, v := range w.stats {
			total[k] += v
		}
	}
	// The generator must actually exercise moves, or the invariants prove nothing.
	if moves < sequences {
		t.Fatalf("only %d claims over %d sequences: the generator is too tame", moves, sequences)
	}
	for _, k := range []string{"failover", "failback", "switchover", "retry", "needs_human", "op_node_standby", "op_maintenance_on"} {
		if total[k] < sequences/100 {
			t.Fatalf("the generator exercised %s only %d times: %v", k, total[k], total)
		}
	}
	// Planned moves need an operator, a busy holder and then a drain: rare
	// here, which is why their paths have table tests of their own.
	for _, k := range []string{"planned_waiting", "planned_moved"} {
		if !testing.Short() && total[k] < sequences/400 {
			t.Fatalf("the generator exercised %s only %d times: %v", k, total[k], total)
		}
	}
	t.Logf("%d sequences, %d claims, %v", sequences, moves, total)
}
