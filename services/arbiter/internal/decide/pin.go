package decide

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/fanpbx/fan/pkg/events"
)

// Pins. What an operator moves stays moved: a switchover pins its group to
// its target once the move is decided, and no automatic failback moves the
// group off that node until the pin ends. It ends when an operator clears
// it (OpUnpin) or moves the group elsewhere (another switchover, which pins
// anew; a manual failback; a standby of the pinned node), at the end it
// was asked with (ForMS from the move, or Until), or when the group leaves
// the node on its own: a failover, which a pin never stops, or a claim on
// it that failed. A pinned node that fails with nowhere to move keeps its
// pin: nothing moved. Each start and end is a GroupPin citing its cause,
// the pin is part of the persisted state, and a failback it holds off is
// explained once per tenure, citing the pin.
//
// A switchover that waits for calls to end carries its pin asked (pinAsk)
// until it moves; one cancelled, overridden or given up pins nothing.

// pin is a group's pin in force.
type pin struct {
	node, operator, reason string
	requestID              string
	action                 ref // the switchover's OperatorAction
	since, until           time.Time
	started                ref // the GroupPin that started it
}

// pinAsk is the pin a switchover asked for, until it moves.
type pinAsk struct {
	to, operator, reason, requestID string
	action                          ref
	forD                            time.Duration
	until                           time.Time
}

// PinState is a group's pin as persisted (restored).
type PinState struct {
	events.PinFacts
	StartedID     string `json:"started_id"`
	CorrelationID string `json:"correlation_id,omitempty"`
}

// PinAskState is the pin of a switchover still waiting to move (restored).
type PinAskState struct {
	To            string    `json:"to"`
	Operator      string    `json:"operator"`
	Reason        string    `json:"reason,omitempty"`
	RequestID     string    `json:"request_id"`
	ActionID      string    `json:"action_id"`
	CorrelationID string    `json:"correlation_id,omitempty"`
	ForMS         int64     `json:"for_ms,omitempty"`
	Until         time.Time `json:"until,omitzero"`
}

func (p *pin) facts() events.PinFacts {
	return events.PinFacts{Node: p.node, Operator: p.operator, Reason: p.reason, RequestID: p.requestID, ActionID: p.action.id,
		Since: p.since, Until: p.until}
}

// pinStates is g's pin and pin asked, as persisted.
func (g *groupState) pinStates() (*PinState, *PinAskState) {
	var ps *PinState
	var as *PinAskState
	if p := g.pin; p != nil {
		ps = &PinState{PinFacts: p.facts(), StartedID: p.started.id, CorrelationID: p.started.corr}
	}
	if a := g.pinAsk; a != nil {
		as = &PinAskState{To: a.to, Operator: a.operator, Reason: a.reason, RequestID: a.requestID, ActionID: a.action.id,
			CorrelationID: a.action.corr, ForMS: a.forD.Milliseconds(), Until: a.until}
	}
	return ps, as
}

// checkPins refuses a persisted pin that the group's configuration cannot
// hold: a node that is no member, or a pin without its causes.
func (g *groupState) checkPins(gs GroupState) error {
	if p := gs.Pin; p != nil {
		switch {
		case !slices.Contains(g.cfg.Nodes, p.Node):
			return fmt.Errorf("pin to %s, not a member", p.Node)
		case p.StartedID == "" || p.ActionID == "":
			return errors.New("pin without its start or its operator action")
		}
	}
	if a := gs.PinAsked; a != nil {
		switch {
		case !slices.Contains(g.cfg.Nodes, a.To):
			return fmt.Errorf("pin asked to %s, not a member", a.To)
		case a.ActionID == "":
			return errors.New("pin asked without its operator action")
		}
	}
	return nil
}

// restorePins loads what checkPins accepted.
func (g *groupState) restorePins(gs GroupState) {
	g.pin, g.pinAsk = nil, nil
	if p := gs.Pin; p != nil {
		g.pin = &pin{node: p.Node, operator: p.Operator, reason: p.Reason, requestID: p.RequestID, action: ref{id: p.ActionID},
			since: p.Since, until: p.Until, started: ref{id: p.StartedID, corr: p.CorrelationID}}
	}
	if a := gs.PinAsked; a != nil {
		g.pinAsk = &pinAsk{to: a.To, operator: a.Operator, reason: a.Reason, requestID: a.RequestID, action: ref{id: a.ActionID, corr: a.CorrelationID},
			forD: time.Duration(a.ForMS) * time.Millisecond, until: a.Until}
	}
}

// operatePinned is operate with pins: an unpin is answered here; a
// switchover carries the pin it asks for into the move (pinMoved starts
// it), and its reply says what the pin will be.
func (c *Core) operatePinned(now time.Time, r Request, trig ref, out *Output) (bool, string) {
	if r.Verb == events.OpUnpin {
		return c.unpin(r, trig, out)
	}
	if r.Verb != events.OpSwitchover || r.Cancel {
		return c.operate(now, r, trig, out)
	}
	g, _ := c.group(r.Group)
	if g == nil {
		return c.operate(now, r, trig, out) // refused there, with its reason
	}
	if g.holder != "" && g.holder == r.Node && (r.ForMS != 0 || !r.Until.IsZero()) {
		return c.pinInPlace(now, g, r, trig, out)
	}
	prev := g.pinAsk
	ask := &pinAsk{to: r.Node, operator: r.Operator, reason: r.Reason, requestID: r.RequestedID, action: trig,
		forD: time.Duration(r.ForMS) * time.Millisecond, until: r.Until}
	if ask.requestID == "" {
		ask.requestID = trig.id
	}
	g.pinAsk = ask
	ok, msg := c.operate(now, r, trig, out)
	if !ok {
		g.pinAsk = prev
		return ok, msg
	}
	if g.pinAsk == ask && (g.planned == nil || g.planned.action.id != trig.id) {
		g.pinAsk = nil // neither moved nor waiting: nothing to pin
	}
	return true, msg + "; " + c.pinPromise(g, ask)
}

// pinInPlace is a switchover to the node that already holds the group,
// with an end (--for, --until): nothing moves, and the group is pinned
// where it is from now, replacing the pin in force. It is how an operator
// whose maintenance runs longer than planned renews a pin about to end, and
// how one keeps a group where a failover put it during a night's work.
// Without an end the request is refused as before ("already holds"): a pin
// that lasts until cleared is made by a move.
func (c *Core) pinInPlace(now time.Time, g *groupState, r Request, trig ref, out *Output) (bool, string) {
	h := g.holder
	until := r.Until
	if r.ForMS != 0 {
		until = now.Add(time.Duration(r.ForMS) * time.Millisecond)
	}
	switch {
	case g.pending != nil:
		return false, fmt.Sprintf("a claim on %s is outstanding; try again when it is settled", g.pending.node)
	case g.planned != nil && !g.planned.gaveUp:
		p := g.planned
		return false, fmt.Sprintf("a %s, asked by %s at %s, is waiting: cancel it first (fanctl switchover --cancel --group %s)",
			p.what(g), p.operator, p.since.UTC().Format(time.RFC3339), g.cfg.Name)
	case c.isStandby(h):
		return false, fmt.Sprintf("%s is in standby: it keeps the group only until the group can move (fanctl node active %s first)", h, h)
	case !until.After(now):
		return false, fmt.Sprintf("until %s has passed (the arbiter's clock says %s)", until.UTC().Format(time.RFC3339), now.UTC().Format(time.RFC3339))
	case until.Sub(now) > events.MaxPinFor:
		return false, fmt.Sprintf("a pin until %s lasts %s, at most %s", until.UTC().Format(time.RFC3339), until.Sub(now).Round(time.Second), events.MaxPinFor)
	}
	requestID := r.RequestedID
	if requestID == "" {
		requestID = trig.id
	}
	msg := ""
	if p := g.pin; p != nil {
		msg = fmt.Sprintf(" (replacing the %s)", describePin(g, p))
		c.endPin(g, events.PinReplaced, fmt.Sprintf("%s: replaced by %s's pin of %s where it is, until %s", describePin(g, p), r.Operator,
			h, until.UTC().Format(time.RFC3339)), []ref{trig, p.started}, out)
	}
	g.pin = &pin{node: h, operator: r.Operator, reason: r.Reason, requestID: requestID, action: trig, since: now, until: until}
	why := fmt.Sprintf("%s pins %s where it is, on %s, until %s: nothing moves; no automatic failback moves it, a failover still does "+
		"(fanctl switchover --clear --group %s ends the pin)", r.Operator, g.cfg.Name, h, until.UTC().Format(time.RFC3339), g.cfg.Name)
	g.pin.started = c.emitPin(g, events.PinStarted, g.pin.facts(), "", why, []ref{trig}, out)
	// The failback the pin holds off is explained anew, citing this pin.
	g.situation, g.reason, g.human = "", "", false
	c.touch(c.byName[g.cfg.Name])
	return true, fmt.Sprintf("%s already holds group %s: pinned there until %s%s; no automatic failback moves it (fanctl switchover --clear --group %s ends the pin)",
		h, g.cfg.Name, until.UTC().Format(time.RFC3339), msg, g.cfg.Name)
}

// pinPromise tells the operator what pin the switchover makes.
func (c *Core) pinPromise(g *groupState, a *pinAsk) string {
	until := "until cleared"
	switch {
	case a.forD > 0:
		until = fmt.Sprintf("for %s from the move", a.forD)
	case !a.until.IsZero():
		until = "until " + a.until.UTC().Format(time.RFC3339)
	}
	return fmt.Sprintf("%s stays on %s once moved: pinned %s, no automatic failback moves it (fanctl switchover --clear --group %s ends the pin)",
		g.cfg.Name, a.to, until, g.cfg.Name)
}

// unpin is fanctl switchover --clear.
func (c *Core) unpin(r Request, trig ref, out *Output) (bool, string) {
	g, bad := c.group(r.Group)
	if g == nil {
		return false, bad
	}
	p := g.pin
	if p == nil {
		msg := "group " + g.cfg.Name + " has no pin"
		if a := g.pinAsk; a != nil {
			msg += fmt.Sprintf("; the switchover to %s waiting for calls to end pins it when it moves (fanctl switchover --cancel --group %s cancels it)",
				a.to, g.cfg.Name)
		}
		return true, msg
	}
	why := fmt.Sprintf("%s, cleared by %s", describePin(g, p), r.Operator)
	if r.Reason != "" {
		why += " (" + r.Reason + ")"
	}
	c.endPin(g, events.PinCleared, why, []ref{trig, p.started}, out)
	g.situation, g.reason, g.human = "", "", false
	c.touch(c.byName[g.cfg.Name])
	return true, why + ": automatic failback may move the group again (in a failback window)"
}

// describePin says whose pin it is, where, why and until when.
func describePin(g *groupState, p *pin) string {
	s := fmt.Sprintf("pin of %s to %s by %s", g.cfg.Name, p.node, p.operator)
	if p.reason != "" {
		s += " (" + p.reason + ")"
	}
	s += " since " + p.since.UTC().Format(time.RFC3339)
	if !p.until.IsZero() {
		s += " until " + p.until.UTC().Format(time.RFC3339)
	}
	return s
}

// pinTick runs before every evaluation of g: a pin whose end has come
// ends, and the pin of a switchover that no longer waits (cancelled,
// overridden, given up) is dropped.
func (c *Core) pinTick(g *groupState, now time.Time, out *Output) {
	if a := g.pinAsk; a != nil && (g.planned == nil || g.planned.action.id != a.action.id) {
		g.pinAsk = nil
	}
	if p := g.pin; p != nil && !p.until.IsZero() && !now.Before(p.until) {
		c.endPin(g, events.PinExpired, describePin(g, p)+": its end has come", []ref{p.started}, out)
	}
}

// pinHoldsFailback explains, once per tenure, that g's pin keeps it on its
// holder h while a failback to the more preferred to would be considered,
// and reports whether it does.
func (c *Core) pinHoldsFailback(g *groupState, h, to string, with func(...[]ref) []ref, out *Output) bool {
	p := g.pin
	if p == nil || p.node != h {
		return false
	}
	c.holdOnce(g, "failback-pinned:"+h+":"+to, fmt.Sprintf("preferred %s is eligible again while %s holds, but the %s keeps the group on %s: "+
		"no failback until the pin ends (fanctl switchover --clear --group %s)", to, h, describePin(g, p), h, g.cfg.Name),
		with([]ref{p.started}, c.nodeCauses(g, to)), out)
	return true
}

// pinMoved runs after every move of g (its decision emitted as id, caused
// by causes): the pin in force ends when the group leaves its node, and a
// switchover's pin asked starts when it moves the group to its target.
func (c *Core) pinMoved(g *groupState, action events.Action, from, to string, decision ref, causes []string, out *Output) {
	a := g.pinAsk
	asked := a != nil && action == events.ActionSwitchover && to == a.to && c.movedByAsk(a, causes, out)
	if p := g.pin; p != nil && to != p.node {
		end, why := events.PinLost, fmt.Sprintf("the group was placed on %s after it had lost its holder", to)
		switch {
		case action == events.ActionFailover:
			end, why = events.PinFailed, fmt.Sprintf("%s failed and the group failed over to %s", p.node, to)
		case action == events.ActionRetry:
			end, why = events.PinFailed, fmt.Sprintf("the claim on %s failed and the group moves to %s", p.node, to)
		case asked:
			end, why = events.PinReplaced, fmt.Sprintf("replaced by %s's switchover to %s", a.operator, to)
		case action == events.ActionSwitchover && c.isStandby(from):
			end, why = events.PinReplaced, fmt.Sprintf("%s was put in standby and the group moves to %s", from, to)
		case action == events.ActionFailback && c.trigger == events.TriggerOperator:
			end, why = events.PinReplaced, fmt.Sprintf("an operator failed the group back to %s", to)
		case action == events.ActionSwitchover || action == events.ActionFailback:
			end, why = events.PinReplaced, fmt.Sprintf("an operator moved the group to %s", to)
		}
		c.annotate(out, decision.id, fmt.Sprintf("; this ends the pin of %s to %s by %s", g.cfg.Name, p.node, p.operator))
		c.endPin(g, end, describePin(g, p)+": "+why, []ref{decision, p.started}, out)
	}
	if !asked {
		return
	}
	g.pinAsk = nil
	until := a.until
	if a.forD > 0 {
		until = c.now.Add(a.forD)
	}
	if !until.IsZero() && !until.After(c.now) {
		c.annotate(out, decision.id, fmt.Sprintf("; no pin: the end it was asked with (%s) passed before the move", until.UTC().Format(time.RFC3339)))
		return
	}
	g.pin = &pin{node: to, operator: a.operator, reason: a.reason, requestID: a.requestID, action: a.action, since: c.now, until: until}
	why := fmt.Sprintf("%s's switchover moves %s to %s: pinned", a.operator, g.cfg.Name, to)
	if until.IsZero() {
		why += " until cleared"
	} else {
		why += " until " + until.UTC().Format(time.RFC3339)
	}
	why += fmt.Sprintf("; no automatic failback moves it, a failover still does (fanctl switchover --clear --group %s ends the pin)", g.cfg.Name)
	g.pin.started = c.emitPin(g, events.PinStarted, g.pin.facts(), "", why, []ref{decision, a.action}, out)
}

// movedByAsk reports whether a switchover decision citing causes is the
// one a asked for: it cites the operator's action (a move made at once) or
// the planned move's stage "moved" that does (a move made once the calls
// had ended).
func (c *Core) movedByAsk(a *pinAsk, causes []string, out *Output) bool {
	if len(causes) == 0 {
		return false
	}
	if causes[0] == a.action.id {
		return true
	}
	for _, e := range out.Emits {
		if pm, ok := e.Payload.(events.PlannedMove); ok && e.ID == causes[0] {
			return pm.Stage == events.PlannedMoved && pm.Verb == events.OpSwitchover && slices.Contains(pm.CausedBy, a.action.id)
		}
	}
	return false
}

// annotate adds to the reason of the decision id already in out: what a
// move also did to a pin belongs on its line of the trail.
func (c *Core) annotate(out *Output, id, more string) {
	for i := range out.Emits {
		if d, ok := out.Emits[i].Payload.(events.ArbiterDecision); ok && out.Emits[i].ID == id {
			d.Reason += more
			out.Emits[i].Payload = d
			return
		}
	}
}

// endPin ends g's pin and records how.
func (c *Core) endPin(g *groupState, end events.PinEnd, why string, causes []ref, out *Output) {
	p := g.pin
	g.pin = nil
	c.emitPin(g, events.PinEnded, p.facts(), end, why, causes, out)
}

// emitPin records a pin's start or end.
func (c *Core) emitPin(g *groupState, stage events.PinStage, facts events.PinFacts, end events.PinEnd, why string, causes []ref, out *Output) ref {
	causes = dedup(causes)
	id := c.cfg.NewID()
	gp := events.GroupPin{Group: g.cfg.Name, Stage: stage, PinFacts: facts, End: end, Why: why, Trigger: c.trigger, Input: c.input,
		InputAudit: c.inputAudit, InputLive: c.inputLive}
	for _, r := range causes {
		gp.CausedBy = append(gp.CausedBy, r.id)
	}
	out.Emits = append(out.Emits, Emit{ID: id, Payload: gp, Options: []events.Option{
		events.WithID(id), events.CausedByID(causes[0].id, corrOf(causes[0])), events.WithEpoch(c.epoch), events.At(c.now.UTC()),
	}})
	return ref{id: id, corr: corrOf(causes[0])}
}

// PinStatus is g's pin as the group status shows it (nil: none).
func PinStatus(gs GroupState) *events.PinStatus {
	if gs.Pin == nil {
		return nil
	}
	return &events.PinStatus{PinFacts: gs.Pin.PinFacts, EventID: gs.Pin.StartedID}
}
