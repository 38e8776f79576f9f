package decide

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/fanpbx/fan/pkg/events"
)

// Request is an operator action for the core. ID is the id the shell
// pre-assigns to the OperatorAction event recording it, so the decisions
// the action causes can cite it.
type Request struct {
	ID string
	// RequestedID is the OperatorAction (stage requested) the shell stored
	// before asking the core; the record of the outcome cites it.
	RequestedID string
	events.OperatorRequest
}

// Reply is what the operator is told.
type Reply struct {
	Accepted  bool
	Message   string
	Decisions []string // ids of the decisions the action caused
}

// notLeading refuses an operator action on a core that does not lead:
// only the leader may act, and it alone records the action.
const notLeading = "this arbiter is not the leader"

// Operate applies an operator action. The Output starts with the
// OperatorAction event (accepted or refused, naming who asked), followed by
// the decisions it caused. A refused action changes nothing. Operator
// actions are not subject to the hold-down or the move cap (a human
// asked), but a switchover or failback still needs a healthy target.
func (c *Core) Operate(now time.Time, r Request) (Reply, Output) {
	c.clock(now)
	if err := r.Validate(); err != nil {
		return Reply{Message: err.Error()}, Output{}
	}
	if !c.leading {
		return Reply{Message: notLeading}, Output{}
	}
	c.trigger = events.TriggerOperator
	c.affected = c.affected[:0]
	c.replyFor = c.replyFor[:0]
	out := Output{Emits: []Emit{{}}} // the action's record goes first, once its outcome is known
	trig := ref{id: r.ID, corr: r.RequestedID}
	accepted, msg := c.operatePinned(now, r, trig, &out)
	if accepted {
		for _, gi := range c.affected {
			c.evaluate(c.groups[gi], now, &trig, &out)
		}
		if len(c.replyFor) > 0 {
			msg += ": " + plannedReply(c.replyFor)
		}
	}
	rep := Reply{Accepted: accepted, Message: msg}
	for _, e := range out.Emits[1:] {
		if _, ok := e.Payload.(events.ArbiterDecision); ok {
			rep.Decisions = append(rep.Decisions, e.ID)
		}
	}
	if accepted && len(rep.Decisions) > 0 {
		rep.Message += fmt.Sprintf(" (%d decision(s))", len(rep.Decisions))
	}
	act := events.OperatorAction{Verb: r.Verb, Group: r.Group, Node: r.Node, Reason: r.Reason, Operator: r.Operator,
		Comment: r.Comment, Accepted: accepted, Outcome: rep.Message, Drain: r.Drain, WithinMS: r.WithinMS, Cancel: r.Cancel, Input: c.input,
		InputAudit: c.inputAudit, InputLive: c.inputLive, ForMS: r.ForMS, Until: r.Until}
	opts := []events.Option{events.WithID(r.ID), events.WithEpoch(c.epoch), events.At(now.UTC())}
	if r.RequestedID != "" {
		opts = append(opts, events.CausedByID(r.RequestedID, r.RequestedID))
	}
	out.Emits[0] = Emit{ID: r.ID, Payload: act, Options: opts}
	return rep, out
}

func (c *Core) group(name string) (*groupState, string) {
	if name == "" {
		if len(c.groups) == 1 {
			return c.groups[0], ""
		}
		return nil, "this cluster has several groups: name one"
	}
	gi, ok := c.byName[name]
	if !ok {
		return nil, "no group " + name
	}
	return c.groups[gi], ""
}

func (c *Core) operate(now time.Time, r Request, trig ref, out *Output) (bool, string) {
	who := r.Operator
	if r.Reason != "" {
		who += ": " + r.Reason
	}
	switch r.Verb {
	case events.OpSwitchover:
		if r.Cancel {
			return c.cancelPlanned(r, trig, out)
		}
		return c.switchover(now, r, who, trig, out)
	case events.OpFailback:
		return c.failback(now, r, who, trig, out)
	case events.OpMaintenanceOn, events.OpMaintenanceOff:
		on := r.Verb == events.OpMaintenanceOn
		if r.Group == "" {
			return c.clusterMaintenance(on, "by "+who)
		}
		return c.groupMaintenance(r.Group, on, "by "+who)
	case events.OpNodeStandby, events.OpNodeActive:
		n := r.Node
		if c.nodes[n] == nil {
			return false, "no node " + n + " in any group"
		}
		if r.Verb == events.OpNodeStandby {
			return c.standbyNode(now, r, trig, out)
		}
		return c.activeNode(n, r, trig, out)
	}
	return false, "unknown verb " + string(r.Verb)
}

// switchover moves a group to the node asked for: at once when the holder
// is down or the operator said --now, otherwise after a planned wait for
// the holder's calls to drain.
func (c *Core) switchover(now time.Time, r Request, who string, trig ref, out *Output) (bool, string) {
	g, bad := c.group(r.Group)
	if g == nil {
		return false, bad
	}
	to := r.Node
	switch {
	case g.planned != nil && !g.planned.gaveUp && r.Drain != events.DrainNow:
		p := g.planned
		return false, fmt.Sprintf("a %s, asked by %s at %s, is waiting: cancel it first (fanctl switchover --cancel --group %s), or move now (--now)",
			p.what(g), p.operator, p.since.UTC().Format(time.RFC3339), g.cfg.Name)
	case !slices.Contains(g.cfg.Nodes, to):
		return false, fmt.Sprintf("%s is not a node of group %s", to, g.cfg.Name)
	case g.pending != nil:
		return false, fmt.Sprintf("a claim on %s is outstanding; try again when it is settled", g.pending.node)
	case g.holder == to:
		return false, fmt.Sprintf("%s already holds group %s (with --for or --until, a switchover to it pins it there)", to, g.cfg.Name)
	case c.isStandby(to):
		return false, fmt.Sprintf("%s is in standby", to)
	case !c.eligible(g, to, now):
		return false, fmt.Sprintf("%s cannot take group %s: %s", to, g.cfg.Name, c.whyNot(g, to, now))
	}
	from := g.holder
	// A holder that is down carries no calls worth waiting for.
	if from != "" && r.Drain != events.DrainNow && !c.judgeHolder(g, from, now).down {
		if g.planned != nil { // a standby's wait that gave up: this request takes over
			g.planned = nil
		}
		c.startPlanned(g, now, r, to, trig)
		c.replyFor = append(c.replyFor, g)
		return true, fmt.Sprintf("switchover (drain %s)", orWait(r.Drain))
	}
	msg := fmt.Sprintf("switchover of %s from %s to %s decided", g.cfg.Name, orNone(from), to)
	if from != "" {
		msg += " (now: " + c.cutCount(g, from) + ")"
	}
	if p := g.planned; p != nil {
		c.endPlanned(g, events.PlannedCancelled, fmt.Sprintf("%s, asked by %s at %s, replaced by a switchover now by %s with %s",
			p.what(g), p.operator, p.since.UTC().Format(time.RFC3339), r.Operator, c.countNow(p.from)), []ref{trig}, out)
	}
	c.operatorMove(g, now, events.ActionSwitchover, to, fmt.Sprintf("switchover to %s by operator %s", to, who), trig, out,
		r.Drain == events.DrainNow && from != "" && !c.drainedNow(g, from))
	return true, msg
}

// failback moves a group back to the node of highest priority that can
// take it.
func (c *Core) failback(now time.Time, r Request, who string, trig ref, out *Output) (bool, string) {
	g, bad := c.group(r.Group)
	if g == nil {
		return false, bad
	}
	h := g.holder
	switch {
	case g.pending != nil:
		return false, fmt.Sprintf("a claim on %s is outstanding; try again when it is settled", g.pending.node)
	case h == "":
		return false, fmt.Sprintf("group %s has no holder to fail back from", g.cfg.Name)
	case g.planned != nil && !g.planned.gaveUp:
		return false, fmt.Sprintf("a %s is waiting: cancel it first", g.planned.what(g))
	}
	to := c.failbackTarget(g, h, now)
	if to == "" {
		return false, fmt.Sprintf("no node of higher priority than %s can take group %s (%s)", h, g.cfg.Name, c.summaryAbove(g, h, now))
	}
	c.operatorMove(g, now, events.ActionFailback, to, fmt.Sprintf("manual failback to %s by operator %s", to, who), trig, out, false)
	return true, fmt.Sprintf("failback of %s from %s to %s decided", g.cfg.Name, h, to)
}

// clusterMaintenance turns the whole cluster's maintenance on or off.
func (c *Core) clusterMaintenance(on bool, why string) (bool, string) {
	if on == (c.maintenance != "") {
		return true, "cluster maintenance already " + onOff(on)
	}
	c.maintenance = ""
	if on {
		c.maintenance = why
	}
	for gi := range c.groups {
		c.touch(gi)
	}
	msg := "cluster maintenance " + onOff(on)
	if !on {
		for _, g := range c.groups {
			if f := c.frozenWhy(g); f != "" {
				msg += "; " + f
			}
		}
	}
	return true, msg
}

// groupMaintenance turns one group's maintenance on or off.
func (c *Core) groupMaintenance(group string, on bool, why string) (bool, string) {
	g, bad := c.group(group)
	if g == nil {
		return false, bad
	}
	if on {
		g.maintenance = why
	} else {
		// A human has looked: the flap freeze and its count go too.
		g.maintenance, g.flapFrozen, g.moves = "", "", nil
	}
	c.touch(c.byName[g.cfg.Name])
	msg := "group " + g.cfg.Name + " maintenance " + onOff(on)
	if !on && c.maintenance != "" {
		msg += "; the cluster is still in maintenance"
	}
	return true, msg
}

// activeNode takes node n out of standby, cancelling the planned moves
// away from it that its standby started.
func (c *Core) activeNode(n string, r Request, trig ref, out *Output) (bool, string) {
	if !c.isStandby(n) {
		return true, n + " already active"
	}
	delete(c.standby, n)
	msg := n + " active"
	for _, gi := range c.nodes[n].groups {
		g := c.groups[gi]
		if p := g.planned; p != nil && p.verb == events.OpNodeStandby && p.from == n {
			what := fmt.Sprintf("%s, asked by %s at %s, cancelled by %s", p.what(g), p.operator, p.since.UTC().Format(time.RFC3339), r.Operator)
			if !p.gaveUp {
				what += " with " + c.countNow(n)
			}
			c.endPlanned(g, events.PlannedCancelled, what, []ref{trig}, out)
			g.situation, g.reason, g.human = "", "", false
			msg += "; " + what
		}
	}
	c.touchNode(n)
	return true, msg
}

// operatorMove moves a group on an operator's word: the holder (if any)
// releases first, and the move is not counted against the flap cap.
// forced marks a move made with calls up (--now on a busy holder).
func (c *Core) operatorMove(g *groupState, now time.Time, action events.Action, to, reason string, trig ref, out *Output, forced bool) {
	h := g.holder
	var release []string
	prev, fenced := g.lastHolder, g.lastFenced
	causes := append([]ref{trig}, c.nodeCauses(g, to)...)
	if h != "" {
		release, prev, fenced = []string{h}, h, true
		if forced {
			reason += "; FORCED with " + c.countNow(h)
			causes = append(causes, c.nodes[h].hbRef)
		}
		reason += c.callsNote(g, h)
	}
	c.move(g, now, action, h, to, reason, causes, release, prev, fenced, out,
		func(d *events.ArbiterDecision) { d.Forced = forced })
}

// drainedNow reports whether h is known to carry no more than the limit
// of channels a move would end.
func (c *Core) drainedNow(g *groupState, h string) bool {
	return c.drained(g, h, c.now).ok
}

// standbyNode is fanctl node standby: the node may hold nothing, and each
// group it holds moves away once it has drained (or at once with --now).
// Asked again for a node already in standby, it starts the waits that
// gave up over again.
func (c *Core) standbyNode(now time.Time, r Request, trig ref, out *Output) (bool, string) {
	n := r.Node
	already := c.isStandby(n)
	if !already {
		c.standby[n] = trig
	}
	var cut []string
	for _, gi := range c.nodes[n].groups {
		g := c.groups[gi]
		if g.holder != n || g.pending != nil {
			continue
		}
		p := g.planned
		if r.Drain == events.DrainNow {
			if p != nil && p.verb == events.OpNodeStandby {
				// leaveStandby moves it at once once the wait is gone.
				c.endPlanned(g, events.PlannedCancelled, fmt.Sprintf("%s, asked by %s at %s, replaced by a standby now by %s with %s",
					p.what(g), p.operator, p.since.UTC().Format(time.RFC3339), r.Operator, c.countNow(n)), []ref{trig}, out)
			}
			cut = append(cut, g.cfg.Name+": "+c.cutCount(g, n))
			continue
		}
		if c.judgeHolder(g, n, now).down {
			continue // no calls worth waiting for: leaving it is a failover
		}
		if p == nil || p.gaveUp {
			g.planned = nil
			c.startPlanned(g, now, r, "", trig)
			c.replyFor = append(c.replyFor, g)
		}
	}
	c.touchNode(n)
	switch {
	case len(cut) > 0:
		return true, n + " in standby (now: " + strings.Join(cut, "; ") + ")"
	case already && len(c.replyFor) == 0:
		return true, n + " already in standby"
	}
	return true, n + " in standby"
}

func orWait(m events.DrainMode) events.DrainMode {
	if m == "" {
		return events.DrainWait
	}
	return m
}

func (c *Core) summaryAbove(g *groupState, h string, now time.Time) string {
	i := slices.Index(g.cfg.Nodes, h)
	if i <= 0 {
		return h + " is the preferred node"
	}
	var parts []string
	for _, n := range g.cfg.Nodes[:i] {
		parts = append(parts, c.whyNot(g, n, now))
	}
	return strings.Join(parts, ", ")
}

func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}

func onOff(on bool) string {
	if on {
		return "on"
	}
	return "off"
}
