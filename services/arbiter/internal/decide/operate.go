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
	c.affected = c.affected[:0]
	out := Output{Emits: []Emit{{}}} // the action's record goes first, once its outcome is known
	trig := ref{id: r.ID, corr: r.RequestedID}
	accepted, msg := c.operate(now, r, trig, &out)
	if accepted {
		for _, gi := range c.affected {
			c.evaluate(c.groups[gi], now, &trig, &out)
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
		Comment: r.Comment, Accepted: accepted, Outcome: rep.Message}
	opts := []events.Option{events.WithID(r.ID), events.WithEpoch(c.epoch)}
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
		g, bad := c.group(r.Group)
		if g == nil {
			return false, bad
		}
		to := r.Node
		switch {
		case !slices.Contains(g.cfg.Nodes, to):
			return false, fmt.Sprintf("%s is not a node of group %s", to, g.cfg.Name)
		case g.pending != nil:
			return false, fmt.Sprintf("a claim on %s is outstanding; try again when it is settled", g.pending.node)
		case g.holder == to:
			return false, fmt.Sprintf("%s already holds group %s", to, g.cfg.Name)
		case c.isStandby(to):
			return false, fmt.Sprintf("%s is in standby", to)
		case !c.eligible(g, to, now):
			return false, fmt.Sprintf("%s cannot take group %s: %s", to, g.cfg.Name, c.whyNot(g, to, now))
		}
		from := g.holder
		c.operatorMove(g, now, events.ActionSwitchover, to, fmt.Sprintf("switchover to %s by operator %s", to, who), trig, out)
		return true, fmt.Sprintf("switchover of %s from %s to %s decided", g.cfg.Name, orNone(from), to)

	case events.OpFailback:
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
		}
		to := c.failbackTarget(g, h, now)
		if to == "" {
			return false, fmt.Sprintf("no node of higher priority than %s can take group %s (%s)", h, g.cfg.Name, c.summaryAbove(g, h, now))
		}
		c.operatorMove(g, now, events.ActionFailback, to, fmt.Sprintf("manual failback to %s by operator %s", to, who), trig, out)
		return true, fmt.Sprintf("failback of %s from %s to %s decided", g.cfg.Name, h, to)

	case events.OpMaintenanceOn, events.OpMaintenanceOff:
		on := r.Verb == events.OpMaintenanceOn
		why := "by " + who
		if r.Group == "" {
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
		g, bad := c.group(r.Group)
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

	case events.OpNodeStandby, events.OpNodeActive:
		n := r.Node
		if c.nodes[n] == nil {
			return false, "no node " + n + " in any group"
		}
		if r.Verb == events.OpNodeStandby {
			if c.isStandby(n) {
				return true, n + " already in standby"
			}
			c.standby[n] = trig
		} else {
			if !c.isStandby(n) {
				return true, n + " already active"
			}
			delete(c.standby, n)
		}
		c.touchNode(n)
		return true, n + " " + map[bool]string{true: "in standby", false: "active"}[r.Verb == events.OpNodeStandby]
	}
	return false, "unknown verb " + string(r.Verb)
}

// operatorMove moves a group on an operator's word: the holder (if any)
// releases first, and the move is not counted against the flap cap.
func (c *Core) operatorMove(g *groupState, now time.Time, action events.Action, to, reason string, trig ref, out *Output) {
	h := g.holder
	var release []string
	prev, fenced := g.lastHolder, g.lastFenced
	if h != "" {
		release, prev, fenced = []string{h}, h, true
	}
	c.move(g, now, action, h, to, reason, append([]ref{trig}, c.nodeCauses(g, to)...), release, prev, fenced, out)
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
