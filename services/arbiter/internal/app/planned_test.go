package app

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fanpbx/fan/lab/amipeer"
	"github.com/fanpbx/fan/pkg/ami"
	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/bus/bustest"
	"github.com/fanpbx/fan/pkg/platform/waittest"
	"github.com/fanpbx/fan/services/arbiter/internal/decide"
)

// amiChannels reports a node's active channels the way its prober does:
// Asterisk's (here the AMI peer's) answer to `core show channels count`,
// asked over fan's AMI client on every heartbeat; nil (unknown) when it
// cannot be asked.
func amiChannels(t *testing.T, peer *amipeer.Peer) func(context.Context) *int {
	var mu sync.Mutex
	var c *ami.Client
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		if c != nil {
			_ = c.Close()
		}
	})
	return func(ctx context.Context) *int {
		mu.Lock()
		defer mu.Unlock()
		if c == nil {
			dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			cl, err := ami.Dial(dctx, ami.Config{Addr: peer.Addr(), Username: "fan", Secret: "right"}, slog.New(slog.DiscardHandler))
			cancel()
			if err != nil {
				return nil
			}
			c = cl
		}
		qctx, cancel := context.WithTimeout(ctx, time.Second)
		counts, err := c.CoreShowChannelsCount(qctx)
		cancel()
		if err != nil {
			_ = c.Close()
			c = nil
			return nil
		}
		n := counts.Channels
		return &n
	}
}

// oneCall is what `core show channels count` says with one bridged call up.
var oneCall = amipeer.Figures{Channels: 2, Calls: 1, Processed: 7}

// plannedLab: n1 (whose channels come from an AMI peer with one call up)
// holds, n2 stands by, arbiters ctlA and ctlB; ask(operator, request).
type plannedLab struct {
	*lab
	ctx   context.Context
	peer  *amipeer.Peer
	stops map[string]context.CancelFunc
	b     *bus.Bus
}

func newPlannedLab(t *testing.T, arbiters ...string) *plannedLab {
	peer, err := amipeer.Start(amipeer.Config{Username: "fan", Secret: "right", Figures: oneCall})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = peer.Close() })
	l := newLab(t, "n1", "n2")
	l.channels = map[string]func(context.Context) *int{"n1": amiChannels(t, peer)}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	l.nodesUp(ctx)
	p := &plannedLab{lab: l, ctx: ctx, peer: peer, stops: map[string]context.CancelFunc{},
		b: bustest.Connect(t, l.s, bus.Identity{Cluster: "lab", Service: "fanctl", Node: "ops1"})}
	for _, a := range arbiters {
		p.stops[a] = l.arbiter(a)
	}
	l.waitHolder("n1", 10*time.Second)
	// n1's prober has asked the AMI peer: its count is in the trail.
	waittest.Until(t, 10*time.Second, "n1's heartbeats reporting the AMI peer's channels", func() bool {
		return p.find(events.TypeNodeHeartbeat, func(env events.Envelope) bool {
			var hb events.NodeHeartbeat
			return json.Unmarshal(env.Data, &hb) == nil && hb.Node == "n1" && hb.ActiveChannels != nil && *hb.ActiveChannels == oneCall.Channels
		}) != nil
	})
	return p
}

func (p *plannedLab) ask(op string, req events.OperatorRequest) events.OperatorReply {
	p.t.Helper()
	data, _ := json.Marshal(req)
	m, err := p.b.NC.Request(events.OperatorRequestSubject("lab", op), data, 5*time.Second)
	if err != nil {
		p.t.Fatal(err)
	}
	var rep events.OperatorReply
	if err := json.Unmarshal(m.Data, &rep); err != nil {
		p.t.Fatal(err)
	}
	return rep
}

// askSwitchover asks until the leader has heard n2 (on a loaded machine
// its first verdict may still be on its way), and wants it accepted.
func (p *plannedLab) askSwitchover(op string, req events.OperatorRequest, inReply string) events.OperatorReply {
	p.t.Helper()
	rep := heardSwitchover(p.t, func() events.OperatorReply { return p.ask(op, req) })
	if !rep.Accepted || !strings.Contains(rep.Message, inReply) {
		p.t.Fatalf("switchover %+v: reply %+v, want accepted saying %q", req, rep, inReply)
	}
	return rep
}

// heardSwitchover asks for a switchover until the reply is other than
// that the leader has never heard the node (its first verdict may still be
// on its way on a loaded machine), and returns that reply.
func heardSwitchover(t testing.TB, ask func() events.OperatorReply) events.OperatorReply {
	t.Helper()
	var rep events.OperatorReply
	waittest.Succeeds(t, 10*time.Second, "a leader that has heard the node", func() error {
		rep = ask()
		if !rep.Accepted && strings.Contains(rep.Message, "never heard") {
			return fmt.Errorf("reply %+v", rep)
		}
		return nil
	})
	return rep
}

// status reads the group's status as fanctl status does.
func (p *plannedLab) status() events.GroupStatus {
	kv, err := p.b.StateKV(p.ctx)
	if err != nil {
		p.t.Fatal(err)
	}
	var st events.GroupStatus
	e, err := kv.Get(p.ctx, events.GroupStatusKey("lab", "pbx"))
	if err == nil {
		_ = json.Unmarshal(e.Value(), &st)
	}
	return st
}

func (p *plannedLab) waitStatus(what string, ok func(events.GroupStatus) bool) events.GroupStatus {
	p.t.Helper()
	var st events.GroupStatus
	waittest.Succeeds(p.t, 10*time.Second, "status showing "+what, func() error {
		if st = p.status(); !ok(st) {
			return fmt.Errorf("status %+v (planned %+v)", st, st.Planned)
		}
		return nil
	})
	return st
}

type stage struct {
	env events.Envelope
	pm  events.PlannedMove
}

// stages are the planned-move records in the trail, in order.
func (p *plannedLab) stages() []stage {
	var out []stage
	for _, env := range p.trail(p.ctx) {
		if env.Type == events.TypePlannedMove {
			var pm events.PlannedMove
			_ = json.Unmarshal(env.Data, &pm)
			out = append(out, stage{env, pm})
		}
	}
	return out
}

func (p *plannedLab) waitStage(s events.PlannedStage) stage {
	p.t.Helper()
	var found stage
	waittest.Succeeds(p.t, 10*time.Second, fmt.Sprintf("a %s stage in the trail", s), func() error {
		stages := p.stages()
		for _, st := range stages {
			if st.pm.Stage == s {
				found = st
				return nil
			}
		}
		return fmt.Errorf("stages %+v", stages)
	})
	return found
}

func (p *plannedLab) find(typ events.Type, match func(events.Envelope) bool) *events.Envelope {
	for _, env := range p.trail(p.ctx) {
		if env.Type == typ && match(env) {
			return &env
		}
	}
	return nil
}

func (p *plannedLab) claimsOn(node string) []events.Envelope {
	var out []events.Envelope
	for _, env := range p.trail(p.ctx) {
		var c events.ClaimIP
		if env.Type == events.TypeClaimIP && json.Unmarshal(env.Data, &c) == nil && c.Node == node {
			out = append(out, env)
		}
	}
	return out
}

// TestPlannedSwitchoverWaitsForTheCallToEnd: n1 has one call up (the AMI
// peer reports two channels); a switchover waits, shown in the status,
// across a change of arbiter leader, and the address moves only once the
// call has ended, every stage citing the operator's request.
func TestPlannedSwitchoverWaitsForTheCallToEnd(t *testing.T) {
	p := newPlannedLab(t, "ctlA", "ctlB")
	rep := p.askSwitchover("alice", events.OperatorRequest{Verb: events.OpSwitchover, Node: "n2", Reason: "kernel update on n1"},
		"waits for n1 to drain: n1 has 2 active channels (limit 0)")
	asked := time.Now()
	st := p.waitStatus("the waiting move", func(st events.GroupStatus) bool {
		return st.Planned != nil && st.Planned.Channels != nil && *st.Planned.Channels == 2
	})
	if pl := st.Planned; pl.Operator != "alice" || pl.From != "n1" || pl.To != "n2" ||
		pl.Deadline.Sub(pl.RequestedAt) != decide.DefaultDrainWithin || st.Holder != "n1" {
		t.Fatalf("status of the waiting move: holder %s, %+v", st.Holder, pl)
	}

	// The leader dies while the move waits; its successor carries the wait on.
	leader := strings.SplitN(rep.Leader, "/", 2)[0]
	p.stops[leader]()
	p.waitStatus("the wait under the successor", func(st events.GroupStatus) bool { return st.Epoch > rep.Epoch && st.Planned != nil })
	if h := p.holding(); len(h) != 1 || h[0] != "n1" {
		t.Fatalf("holders %v while n1 still has a call", h)
	}

	hangup := time.Now()
	p.peer.SetFigures(amipeer.Figures{Processed: 8}) // the call ends
	p.waitHolder("n2", 10*time.Second)

	for _, c := range p.claimsOn("n2") {
		if c.Time.Before(hangup) {
			t.Fatalf("n2 was claimed at %s, before the call ended at %s", c.Time, hangup)
		}
	}
	var waiting, moved *stage
	for _, s := range p.stages() {
		switch s.pm.Stage {
		case events.PlannedWaiting:
			if waiting == nil {
				waiting = &s
			}
		case events.PlannedMoved:
			moved = &s
		}
	}
	if waiting == nil || moved == nil {
		t.Fatalf("stages %+v", p.stages())
	}
	if waiting.pm.Channels == nil || *waiting.pm.Channels != 2 || waiting.pm.CausedBy[0] != rep.EventID || waiting.env.CausationID != rep.EventID {
		t.Fatalf("waiting stage %+v does not cite the request's action %s with the count", waiting.pm, rep.EventID)
	}
	if moved.pm.Channels == nil || *moved.pm.Channels != 0 || moved.pm.CausedBy[0] != rep.EventID || moved.env.Epoch <= rep.Epoch {
		t.Fatalf("moved stage %+v (epoch %d) is not the successor's, after the drain, citing %s", moved.pm, moved.env.Epoch, rep.EventID)
	}
	dec := p.find(events.TypeArbiterDecision, func(env events.Envelope) bool { return env.CausationID == moved.env.ID })
	if dec == nil {
		t.Fatal("no decision cites the moved stage")
	}
	var d events.ArbiterDecision
	_ = json.Unmarshal(dec.Data, &d)
	if d.Action != events.ActionSwitchover || d.To != "n2" || d.Forced || !strings.Contains(d.Reason, "asked by alice") {
		t.Fatalf("decision %+v", d)
	}
	// The request as recorded, which the action cites.
	act := p.find(events.TypeOperatorAction, func(env events.Envelope) bool { return env.ID == rep.EventID })
	if act == nil || p.find(events.TypeOperatorAction, func(env events.Envelope) bool { return env.ID == act.CausationID }) == nil {
		t.Fatalf("the action %s or the request it cites is not in the trail", rep.EventID)
	}
	p.waitStatus("the wait gone", func(st events.GroupStatus) bool { return st.Planned == nil && st.Holder == "n2" })
	t.Logf("asked at %s, call ended %s later, moved %s after that", asked.Format(time.TimeOnly),
		hangup.Sub(asked).Round(time.Millisecond), moved.env.Time.Sub(hangup).Round(time.Millisecond))
}

// TestPlannedSwitchoverDeadline: with the call still up at the deadline a
// switchover gives up (nothing moves, the trail and status say so), and
// with force_after it moves anyway, marked forced.
func TestPlannedSwitchoverDeadline(t *testing.T) {
	p := newPlannedLab(t, "ctlA")
	p.askSwitchover("alice", events.OperatorRequest{Verb: events.OpSwitchover, Node: "n2", WithinMS: 1000},
		"then it gives up")
	gave := p.waitStage(events.PlannedGaveUp)
	if !strings.Contains(gave.pm.Reason, "n1 has 2 active channels") || gave.pm.Channels == nil || *gave.pm.Channels != 2 {
		t.Fatalf("gave-up stage %+v", gave.pm)
	}
	p.waitStatus("no wait left", func(st events.GroupStatus) bool { return st.Planned == nil })
	if h := p.holding(); len(h) != 1 || h[0] != "n1" || len(p.claimsOn("n2")) != 0 {
		t.Fatalf("holders %v, claims on n2 %d after giving up", h, len(p.claimsOn("n2")))
	}

	rep := p.askSwitchover("alice", events.OperatorRequest{Verb: events.OpSwitchover, Node: "n2", WithinMS: 1000, Drain: events.DrainForceAfter},
		"then it moves anyway")
	p.waitHolder("n2", 10*time.Second)
	moved := p.waitStage(events.PlannedMoved)
	dec := p.find(events.TypeArbiterDecision, func(env events.Envelope) bool { return env.CausationID == moved.env.ID })
	var d events.ArbiterDecision
	if dec != nil {
		_ = json.Unmarshal(dec.Data, &d)
	}
	if !d.Forced || !strings.Contains(d.Reason, "FORCED") || moved.pm.CausedBy[0] != rep.EventID {
		t.Fatalf("forced move: decision %+v, stage %+v", d, moved.pm)
	}
}

// TestPlannedSwitchoverCancel: a waiting switchover cancelled by another
// operator (recorded as them, citing the request) never moves, even once
// the call ends.
func TestPlannedSwitchoverCancel(t *testing.T) {
	p := newPlannedLab(t, "ctlA")
	rep := p.askSwitchover("alice", events.OperatorRequest{Verb: events.OpSwitchover, Node: "n2"}, "waits")
	cancel := p.ask("bob", events.OperatorRequest{Verb: events.OpSwitchover, Cancel: true, Reason: "customer call centre still busy"})
	if !cancel.Accepted || !strings.Contains(cancel.Message, "cancelled by bob with 2 active channels on n1") {
		t.Fatalf("cancel: %+v", cancel)
	}
	c := p.waitStage(events.PlannedCancelled)
	if c.pm.CausedBy[0] != cancel.EventID || c.pm.CausedBy[1] != rep.EventID || c.pm.Operator != "alice" {
		t.Fatalf("cancelled stage %+v: want bob's action %s then alice's %s", c.pm, cancel.EventID, rep.EventID)
	}
	act := p.find(events.TypeOperatorAction, func(env events.Envelope) bool { return env.ID == cancel.EventID })
	var a events.OperatorAction
	if act != nil {
		_ = json.Unmarshal(act.Data, &a)
	}
	if a.Operator != "bob" || !a.Cancel || a.Node != "n2" {
		t.Fatalf("cancel recorded as %+v", a)
	}
	// The call ends: with the wait cancelled nothing moves. Wait until the
	// arbiter's own status has been rewritten after n1 reported no calls
	// three times (heartbeats every 200 ms).
	p.peer.SetFigures(amipeer.Figures{})
	drained := time.Now()
	waittest.Until(t, 15*time.Second, "three heartbeats of n1 with no calls", func() bool {
		seen := 0
		for _, env := range p.trail(p.ctx) {
			var hb events.NodeHeartbeat
			if env.Type == events.TypeNodeHeartbeat && env.Time.After(drained) && json.Unmarshal(env.Data, &hb) == nil &&
				hb.Node == "n1" && hb.ActiveChannels != nil && *hb.ActiveChannels == 0 {
				seen++
			}
		}
		return seen >= 3
	})
	if h := p.holding(); len(h) != 1 || h[0] != "n1" || len(p.claimsOn("n2")) != 0 {
		t.Fatalf("a cancelled switchover moved: holders %v", h)
	}

}

// TestPlannedSwitchoverOverriddenByFailover: n1's PBX dies while a
// switchover waits for its call: the failover decides, the wait is
// recorded as overridden, and no planned move happens.
func TestPlannedSwitchoverOverriddenByFailover(t *testing.T) {
	p := newPlannedLab(t, "ctlA")
	rep := p.askSwitchover("alice", events.OperatorRequest{Verb: events.OpSwitchover, Node: "n2"}, "waits for n1 to drain")
	p.setPBX("n1", false)
	p.waitHolder("n2", 10*time.Second)
	o := p.waitStage(events.PlannedOverridden)
	if o.pm.CausedBy[0] != rep.EventID || !strings.Contains(o.pm.Reason, "holder n1 reports pbx down") {
		t.Fatalf("overridden stage %+v", o.pm)
	}
	fo := p.find(events.TypeArbiterDecision, func(env events.Envelope) bool {
		var d events.ArbiterDecision
		return json.Unmarshal(env.Data, &d) == nil && d.Action == events.ActionFailover && d.To == "n2"
	})
	if fo == nil || fo.Time.Before(o.env.Time) {
		t.Fatalf("no failover decision after the override: %+v", fo)
	}
	for _, s := range p.stages() {
		if s.pm.Stage == events.PlannedMoved {
			t.Fatalf("a planned move happened: %+v", s.pm)
		}
	}
}

// TestPlannedStandbyWaitsForTheCallToEnd: node standby bars n1 at once
// but leaves its group there until its call ends.
func TestPlannedStandbyWaitsForTheCallToEnd(t *testing.T) {
	p := newPlannedLab(t, "ctlA")
	rep := p.ask("carol", events.OperatorRequest{Verb: events.OpNodeStandby, Node: "n1", Reason: "disk swap at 14:00"})
	if !rep.Accepted || !strings.Contains(rep.Message, "n1 in standby") || !strings.Contains(rep.Message, "waits for n1 to drain") ||
		!strings.Contains(rep.Message, "fanctl node active n1 cancels it") {
		t.Fatalf("standby: %+v", rep)
	}
	st := p.waitStatus("the standby's wait", func(st events.GroupStatus) bool { return st.Planned != nil && st.Nodes["n1"].Standby })
	if st.Planned.Verb != events.OpNodeStandby || st.Planned.Operator != "carol" || st.Holder != "n1" {
		t.Fatalf("status %+v planned %+v", st, st.Planned)
	}
	hangup := time.Now()
	p.peer.SetFigures(amipeer.Figures{})
	p.waitHolder("n2", 10*time.Second)
	moved := p.waitStage(events.PlannedMoved)
	if moved.pm.To != "n2" || moved.pm.CausedBy[0] != rep.EventID || moved.env.Time.Before(hangup) {
		t.Fatalf("moved stage %+v at %s (call ended %s)", moved.pm, moved.env.Time, hangup)
	}
}
