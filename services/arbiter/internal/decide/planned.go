package decide

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/fanpbx/fan/pkg/events"
)

// Planned moves. Moving the address ends the calls on the old holder that
// the new one cannot carry across, so an operator's switchover or node
// standby waits, by default, until the holder has at most the group's
// drain limit (the failback's drain_max_channels) of channels that are not
// in a carried call, up to a deadline; then it gives up, or with
// force_after moves anyway. The count comes from the holder's current
// calls summary (calls.go), which tells the carried calls apart; without
// one, from its heartbeat's active channels, every one waited for. A
// holder whose count is not reported, or is silent on the bus, is not
// drained. A failover (the holder is down)
// ends the wait: the planned move is overridden, never in the way. Each
// stage is a PlannedMove citing the operator's action, and the move's
// decision cites the stage that decided it.

// waitingEvery bounds how often a changing channel count is recorded
// while a planned move waits (status shows it live): a busy PBX's count
// changes with every call, and thirty records in a half-hour wait explain
// as much as three hundred.
const waitingEvery = time.Minute

// planned is a group's planned move.
type planned struct {
	verb           events.OperatorVerb
	from, to       string // to is empty for a standby until the move is decided
	operator       string
	reason         string // the operator's reason
	requestID      string // the OperatorAction recorded before acting (stage requested)
	action         ref    // the OperatorAction recording the outcome: every stage cites it
	since          time.Time
	deadline       time.Time
	drain          events.DrainMode
	gaveUp         bool // a standby's wait gave up: the holder keeps the group until an operator acts
	lastReport     time.Time
	lastCount      *int
	lastReportedTo string
}

// PlannedState is a group's planned move as persisted (restored). Of the
// facts, Channels (the holder's count now) and MaxChannels (the group's
// limit) are informational.
type PlannedState struct {
	events.PlannedFacts
	Reason        string    `json:"reason,omitempty"` // the operator's
	ActionID      string    `json:"action_id"`
	CorrelationID string    `json:"correlation_id,omitempty"`
	GaveUp        bool      `json:"gave_up,omitempty"`
	LastReport    time.Time `json:"last_report,omitzero"`
	LastCount     *int      `json:"last_count,omitempty"`
	LastTo        string    `json:"last_to,omitempty"`
}

func (p *planned) facts(g *groupState, ch *int, calls *events.HolderCalls) events.PlannedFacts {
	return events.PlannedFacts{Verb: p.verb, From: p.from, To: p.to, Operator: p.operator, RequestID: p.requestID,
		RequestedAt: p.since, Deadline: p.deadline, Drain: p.drain, MaxChannels: g.cfg.Failback.DrainMaxChannels, Channels: cloneInt(ch),
		Calls: calls}
}

func (p *planned) state(c *Core, g *groupState) *PlannedState {
	ch, calls := c.holderLoad(g, p.from, c.now)
	return &PlannedState{PlannedFacts: p.facts(g, ch, calls), Reason: p.reason, ActionID: p.action.id,
		CorrelationID: p.action.corr, GaveUp: p.gaveUp, LastReport: p.lastReport, LastCount: cloneInt(p.lastCount), LastTo: p.lastReportedTo}
}

func (s *PlannedState) validate(g *groupState) error {
	switch {
	case s.Verb != events.OpSwitchover && s.Verb != events.OpNodeStandby:
		return fmt.Errorf("planned move with verb %q", s.Verb)
	case !slices.Contains(g.cfg.Nodes, s.From):
		return fmt.Errorf("planned move from %s, not a member", s.From)
	case s.To != "" && !slices.Contains(g.cfg.Nodes, s.To):
		return fmt.Errorf("planned move to %s, not a member", s.To)
	case s.ActionID == "" || s.RequestID == "":
		return fmt.Errorf("planned move without its operator action")
	case s.Drain != events.DrainWait && s.Drain != events.DrainForceAfter:
		return fmt.Errorf("planned move with drain %q", s.Drain)
	}
	return nil
}

func (s *PlannedState) restore() *planned {
	return &planned{verb: s.Verb, from: s.From, to: s.To, operator: s.Operator, reason: s.Reason, requestID: s.RequestID,
		action: ref{id: s.ActionID, corr: s.CorrelationID}, since: s.RequestedAt, deadline: s.Deadline, drain: s.Drain,
		gaveUp: s.GaveUp, lastReport: s.LastReport, lastCount: cloneInt(s.LastCount), lastReportedTo: s.LastTo}
}

func cloneInt(p *int) *int {
	if p == nil {
		return nil
	}
	n := *p
	return &n
}

// startPlanned begins a planned move of g away from its holder; the next
// evaluation moves it at once if the holder has drained.
func (c *Core) startPlanned(g *groupState, now time.Time, r Request, to string, trig ref) {
	within := g.cfg.Planned.DrainWithin
	if r.WithinMS > 0 {
		within = time.Duration(r.WithinMS) * time.Millisecond
	}
	drain := r.Drain
	if drain == "" {
		drain = events.DrainWait
	}
	g.planned = &planned{verb: r.Verb, from: g.holder, to: to, operator: r.Operator, reason: r.Reason, requestID: r.RequestedID,
		action: trig, since: now, deadline: now.Add(within), drain: drain}
	if g.planned.requestID == "" {
		g.planned.requestID = trig.id
	}
	g.situation, g.reason, g.human = "", "", false
	c.touch(c.byName[g.cfg.Name])
}

// drain is whether a holder counts as drained, with what it was judged on.
type drain struct {
	ok       bool
	channels *int        // the holder's active channels
	calls    *callsHeard // its current calls summary, when the count is its
	why      string      // the count, for reasons
}

// holderCalls is the summary's counts for a planned move's records.
func (d drain) holderCalls() *events.HolderCalls {
	if d.calls == nil {
		return nil
	}
	return d.calls.holderCalls()
}

// drained reports whether h counts as drained in g: the channels a move
// would end (all of them, or with a current calls summary those not in a
// call carried across) within the limit.
func (c *Core) drained(g *groupState, h string, now time.Time) drain {
	limit := g.cfg.Failback.DrainMaxChannels
	ns := c.nodes[h]
	switch {
	case limit < 0:
		return drain{ok: true, channels: ns.channels, why: "the group does not wait for calls (drain_max_channels < 0)"}
	case ns.proxy != "":
		return drain{ok: true, why: h + " runs no prober and carries no calls fan can count"}
	case c.silent(h, now):
		return drain{channels: ns.channels, why: h + " is silent on the bus, so its active channels are not known"}
	}
	if sh := c.currentCalls(g, h, now); sh != nil {
		hc := sh.holderCalls()
		n := hc.Channels
		return drain{ok: hc.Uncarried() <= limit, channels: &n, calls: sh, why: fmt.Sprintf("%s (limit %d)", carriedCount(h, hc), limit)}
	}
	switch {
	case ns.channels == nil:
		return drain{why: h + "'s active channels are unknown (its prober does not report them)"}
	case *ns.channels > limit:
		return drain{channels: ns.channels, why: fmt.Sprintf("%s has %s (limit %d)", h, plural(*ns.channels, "active channel"), limit)}
	}
	return drain{ok: true, channels: ns.channels, why: fmt.Sprintf("%s has %s (limit %d)", h, plural(*ns.channels, "active channel"), limit)}
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}

// cutCount says how many calls a move cuts now, for --now replies: with
// h's current calls summary, which of its channels are carried across.
func (c *Core) cutCount(g *groupState, h string) string {
	if sh := c.currentCalls(g, h, c.now); sh != nil {
		hc := sh.holderCalls()
		if hc.Uncarried() == 0 {
			return carriedCount(h, hc) + ": none cut"
		}
		return carriedCount(h, hc) + ": the rest cut"
	}
	if c.nodes[h].channels != nil {
		return c.countNow(h) + " cut"
	}
	return h + "'s active channels unknown (its prober does not report them), so any calls on it were cut"
}

func (p *planned) what(g *groupState) string {
	if p.verb == events.OpNodeStandby {
		return fmt.Sprintf("planned move of %s off %s (standby)", g.cfg.Name, p.from)
	}
	return fmt.Sprintf("planned switchover of %s from %s to %s", g.cfg.Name, p.from, p.to)
}

func (p *planned) atDeadline() string {
	if p.drain == events.DrainForceAfter {
		return "then it moves anyway"
	}
	return "then it gives up"
}

// considerPlanned runs g's planned move: move if drained (or forced at the
// deadline), give up at the deadline, otherwise wait. h is the holder,
// which is not down.
func (c *Core) considerPlanned(g *groupState, h string, now time.Time, frozen string, out *Output) {
	p := g.planned
	if p.gaveUp {
		c.holdOnce(g, "planned-gave-up:"+h, fmt.Sprintf("holder %s is in standby, but the %s gave up at %s: %s keeps the group until an operator moves it "+
			"(fanctl switchover, or fanctl node standby %s again)", h, p.what(g), p.deadline.UTC().Format(time.RFC3339), h, h), []ref{p.action}, out)
		return
	}
	d := c.drained(g, h, now)
	ok, ch, count := d.ok, d.channels, d.why
	to, why := p.to, ""
	if p.verb == events.OpNodeStandby {
		to = c.best(g, now, h)
		switch {
		case frozen != "":
			to, why = "", frozen
		case to == "":
			why = "no other node is eligible (" + c.summary(g, now, h) + ")"
		}
	} else if !c.eligible(g, to, now) || c.isStandby(to) || c.failedUntil(g, to, now) {
		to, why = "", to+" cannot take the group now ("+c.whyNot(g, to, now)+")"
	}
	hb := c.nodes[h].hbRef
	past := !now.Before(p.deadline)
	switch {
	case to != "" && (ok || (past && p.drain == events.DrainForceAfter)):
		forced := !ok
		reason := fmt.Sprintf("%s, asked by %s at %s: %s after %s", p.what(g), p.operator, p.since.UTC().Format(time.RFC3339),
			count, now.Sub(p.since).Round(time.Second))
		if forced {
			reason = fmt.Sprintf("%s, asked by %s at %s: FORCED at the deadline (force_after): %s", p.what(g), p.operator,
				p.since.UTC().Format(time.RFC3339), count)
		}
		if p.verb == events.OpNodeStandby {
			reason += "; " + to + " is the highest-priority eligible node"
		}
		p.to = to
		causes := []ref{hb}
		if d.calls != nil {
			causes = append(causes, d.calls.ref)
		}
		moved := c.emitPlanned(g, p, events.PlannedMoved, reason, ch, d.holderCalls(), out, causes...)
		g.planned = nil
		who := p.operator
		if p.reason != "" {
			who += ": " + p.reason
		}
		c.move(g, now, events.ActionSwitchover, h, to, fmt.Sprintf("%s (operator %s)", reason, who),
			append([]ref{moved, hb}, c.nodeCauses(g, to)...), []string{h}, h, true, out,
			func(d *events.ArbiterDecision) { d.Forced = forced })
	case past:
		because := count
		switch {
		case ok:
			because = why
		case p.drain == events.DrainForceAfter:
			because = count + ", and the move could not be forced: " + why
		}
		reason := fmt.Sprintf("%s, asked by %s at %s, gave up at the deadline %s: %s; nothing moved", p.what(g), p.operator,
			p.since.UTC().Format(time.RFC3339), p.deadline.UTC().Format(time.RFC3339), because)
		c.emitPlanned(g, p, events.PlannedGaveUp, reason, ch, d.holderCalls(), out, hb)
		g.situation, g.reason, g.human = "", "", false
		if p.verb == events.OpNodeStandby {
			p.gaveUp = true // the node stays in standby; leaveStandby must not move it at once
			return
		}
		g.planned = nil
	default:
		reason := fmt.Sprintf("%s, asked by %s at %s, waits for %s to drain: %s; deadline %s, %s", p.what(g), p.operator,
			p.since.UTC().Format(time.RFC3339), h, count, p.deadline.UTC().Format(time.RFC3339), p.atDeadline())
		if ok {
			reason = fmt.Sprintf("%s, asked by %s at %s: %s is drained (%s) but %s; deadline %s, %s", p.what(g), p.operator,
				p.since.UTC().Format(time.RFC3339), h, count, why, p.deadline.UTC().Format(time.RFC3339), p.atDeadline())
		}
		g.situation, g.reason, g.human = "planned-wait", reason, false
		if p.lastReport.IsZero() || ((!sameCount(p.lastCount, ch) || p.lastReportedTo != to) && now.Sub(p.lastReport) >= waitingEvery) {
			c.emitPlanned(g, p, events.PlannedWaiting, reason, ch, d.holderCalls(), out, hb)
			p.lastReport, p.lastCount, p.lastReportedTo = now, cloneInt(ch), to
		}
	}
}

func sameCount(a, b *int) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

// endPlanned ends g's planned move because something else decides now
// (stage overridden), or because an operator cancelled it (stage
// cancelled, with the cancel's action first among causes).
func (c *Core) endPlanned(g *groupState, stage events.PlannedStage, reason string, causes []ref, out *Output) {
	p := g.planned
	g.planned = nil
	if p.gaveUp && stage == events.PlannedOverridden {
		return // its end was recorded when it gave up
	}
	ch, calls := c.holderLoad(g, p.from, c.now)
	c.emitPlanned(g, p, stage, reason, ch, calls, out, causes...)
}

// emitPlanned records a stage; the operator's action is always cited, and
// first unless the stage has a more direct cause (a cancel's own action).
func (c *Core) emitPlanned(g *groupState, p *planned, stage events.PlannedStage, reason string, ch *int, calls *events.HolderCalls,
	out *Output, more ...ref) ref {
	causes := []ref{p.action}
	if stage == events.PlannedCancelled && len(more) > 0 {
		causes = []ref{more[0], p.action}
		more = more[1:]
	}
	causes = dedup(append(causes, more...))
	id := c.cfg.NewID()
	pm := events.PlannedMove{Group: g.cfg.Name, Stage: stage, PlannedFacts: p.facts(g, ch, calls), Reason: reason, Trigger: c.trigger, Input: c.input, InputAudit: c.inputAudit, InputLive: c.inputLive}
	for _, r := range causes {
		pm.CausedBy = append(pm.CausedBy, r.id)
	}
	out.Emits = append(out.Emits, Emit{ID: id, Payload: pm, Options: []events.Option{
		events.WithID(id), events.CausedByID(causes[0].id, corrOf(causes[0])), events.WithEpoch(c.epoch), events.At(c.now.UTC()),
	}})
	return ref{id: id, corr: corrOf(causes[0])}
}

// cancelPlanned is fanctl switchover --cancel.
func (c *Core) cancelPlanned(r Request, trig ref, out *Output) (bool, string) {
	g, bad := c.group(r.Group)
	if g == nil {
		return false, bad
	}
	p := g.planned
	switch {
	case p == nil:
		return false, "no planned move waits in group " + g.cfg.Name
	case p.verb == events.OpNodeStandby:
		return false, fmt.Sprintf("the %s comes from %s's standby: `fanctl node active %s` cancels it", p.what(g), p.from, p.from)
	}
	msg := fmt.Sprintf("%s, asked by %s at %s, cancelled by %s with %s", p.what(g), p.operator, p.since.UTC().Format(time.RFC3339),
		r.Operator, c.countNow(p.from))
	c.endPlanned(g, events.PlannedCancelled, msg, []ref{trig}, out)
	g.situation, g.reason, g.human = "", "", false
	c.touch(c.byName[g.cfg.Name])
	return true, msg
}

// countNow is the holder's load as its last heartbeat told it: the
// channels the drain counts, and the calls they make when known.
func (c *Core) countNow(h string) string {
	ns := c.nodes[h]
	if ns.channels == nil {
		return h + "'s active channels unknown"
	}
	s := plural(*ns.channels, "active channel")
	if ns.calls != nil {
		s += " (" + plural(*ns.calls, "call") + ")"
	}
	return s + " on " + h
}

// plannedReply tells the operator what became of the planned moves just
// asked for, once the groups have been evaluated.
func plannedReply(gs []*groupState) string {
	var parts []string
	for _, g := range gs {
		switch p := g.planned; {
		case p != nil && !p.gaveUp:
			cancel := "fanctl switchover --cancel --group " + g.cfg.Name
			if p.verb == events.OpNodeStandby {
				cancel = "fanctl node active " + p.from
			}
			parts = append(parts, g.reason+" (fanctl status shows the wait; "+cancel+" cancels it)")
		case p == nil && g.pending != nil:
			parts = append(parts, fmt.Sprintf("%s: the holder has drained, moving to %s", g.cfg.Name, g.pending.node))
		case p != nil:
			parts = append(parts, fmt.Sprintf("%s: the wait ended without a move", g.cfg.Name))
		}
	}
	return strings.Join(parts, "; ")
}

// PlannedTarget is the target of the switchover waiting in group (the only
// group when group is empty), or "".
func (c *Core) PlannedTarget(group string) string {
	g, _ := c.group(group)
	if g == nil || g.planned == nil {
		return ""
	}
	return g.planned.to
}
