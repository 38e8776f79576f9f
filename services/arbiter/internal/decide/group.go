package decide

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/fanpbx/fan/pkg/events"
)

// silent reports whether n has been quiet on the bus for too long. A node
// never heard from counts from the core's first input, so a restored holder
// gets the same grace as one that just heartbeated.
func (c *Core) silent(n string, now time.Time) bool {
	ns := c.nodes[n]
	last := ns.lastHB
	if last.IsZero() {
		last = c.origin
	}
	limit := c.cfg.SilentAfter
	if adv := 3 * ns.hbInterval; adv > limit {
		limit = adv // a node told us it beats slower: three of its beats
	}
	return now.Sub(last) > limit
}

func (c *Core) selfObs(g *groupState, n string) *observation {
	o := c.obs[obsKey{n, g.cfg.HealthCheck}]
	if o == nil || o.role != events.RoleSelf || o.target != n {
		return nil
	}
	return o
}

func (c *Core) eligible(g *groupState, n string, now time.Time) bool {
	o := c.selfObs(g, n)
	return o != nil && o.health == events.HealthUp && !c.nodes[n].lastHB.IsZero() && !c.silent(n, now)
}

// lost reports that n positively turned bad: its check went down or it fell
// silent. A node merely not heard from yet (a leader restored a moment ago)
// is not lost; its claim gets the full ClaimTimeout.
func (c *Core) lost(g *groupState, n string, now time.Time) bool {
	o := c.selfObs(g, n)
	return (o != nil && o.health == events.HealthDown) || c.silent(n, now)
}

// whyNot says in a few words why n is not eligible, for hold reasons.
func (c *Core) whyNot(g *groupState, n string, now time.Time) string {
	switch o := c.selfObs(g, n); {
	case o != nil && o.health == events.HealthDown:
		return n + " " + g.cfg.HealthCheck + " down"
	case c.nodes[n].lastHB.IsZero():
		return n + " never heard"
	case c.silent(n, now):
		return n + " silent"
	case o == nil || o.health != events.HealthUp:
		return n + " " + g.cfg.HealthCheck + " unknown"
	case c.failedUntil(g, n, now):
		return n + " claim just failed"
	}
	return n + " eligible"
}

func (c *Core) failedUntil(g *groupState, n string, now time.Time) bool {
	until, ok := g.failed[n]
	if ok && !now.Before(until) {
		delete(g.failed, n)
		return false
	}
	return ok
}

// best is the highest-priority eligible node, skipping skip and the nodes
// whose claim just failed.
func (c *Core) best(g *groupState, now time.Time, skip string) string {
	for _, n := range g.cfg.Nodes {
		if n != skip && c.eligible(g, n, now) && !c.failedUntil(g, n, now) {
			return n
		}
	}
	return ""
}

func (c *Core) summary(g *groupState, now time.Time, skip string) string {
	var parts []string
	for _, n := range g.cfg.Nodes {
		if n != skip {
			parts = append(parts, c.whyNot(g, n, now))
		}
	}
	return strings.Join(parts, ", ")
}

// nodeCauses are the events that explain n's current state: its self
// observation and its last heartbeat.
func (c *Core) nodeCauses(g *groupState, n string) []ref {
	var out []ref
	if o := c.selfObs(g, n); o != nil {
		out = append(out, o.cause)
		if o.origin != "" {
			out = append(out, ref{id: o.origin})
		}
	}
	if r := c.nodes[n].hbRef; r.id != "" {
		out = append(out, r)
	}
	return out
}

// holderView is the arbiter's judgement of the current holder.
type holderView struct {
	down   bool
	silent bool
	key    string // situation key when held
	why    string
	causes []ref
}

func (c *Core) judgeHolder(g *groupState, h string, now time.Time) holderView {
	if o := c.selfObs(g, h); o != nil && o.health == events.HealthDown {
		v := holderView{down: true, why: fmt.Sprintf("holder %s reports %s down", h, g.cfg.HealthCheck), causes: []ref{o.cause}}
		if o.origin != "" {
			v.causes = append(v.causes, ref{id: o.origin})
		}
		return v
	}
	if !c.silent(h, now) {
		return holderView{}
	}
	var ups, downs []string
	var upC, downC []ref
	for k := range c.peerIdx[h] {
		o := c.obs[k]
		if k.observer == h || o.role != events.RolePeer || c.silent(k.observer, now) {
			continue // a silent observer's view is as stale as the holder's
		}
		if g.peerChecks != nil && !g.peerChecks[k.check] {
			continue
		}
		switch o.health {
		case events.HealthUp:
			ups, upC = append(ups, k.observer+"/"+k.check), append(upC, o.cause)
		case events.HealthDown:
			downs, downC = append(downs, k.observer+"/"+k.check), append(downC, o.cause)
		}
	}
	var last []ref
	if r := c.nodes[h].hbRef; r.id != "" {
		last = []ref{r}
	}
	switch {
	case len(ups) > 0:
		return holderView{silent: true, key: "silent-reachable:" + h,
			why:    fmt.Sprintf("holder %s is silent on the bus but peers still reach it (%s): not replaced", h, strings.Join(sorted(ups), ", ")),
			causes: append(upC, last...)}
	case len(downs) > 0:
		return holderView{down: true,
			why:    fmt.Sprintf("holder %s is silent on the bus and peers cannot reach it (%s)", h, strings.Join(sorted(downs), ", ")),
			causes: append(downC, last...)}
	}
	return holderView{silent: true, key: "silent-no-evidence:" + h,
		why:    fmt.Sprintf("holder %s is silent on the bus and no peer reports on it: not replaced", h),
		causes: last}
}

// evaluate applies the rules to one group. trig is the event being handled,
// nil on a Tick.
func (c *Core) evaluate(g *groupState, now time.Time, trig *ref, out *Output) {
	with := func(rs ...[]ref) []ref {
		var all []ref
		if trig != nil {
			all = append(all, *trig)
		}
		for _, r := range rs {
			all = append(all, r...)
		}
		return all
	}
	if p := g.pending; p != nil {
		cmd := ref{id: p.cmdID, corr: p.corr}
		switch {
		case !now.Before(p.deadline):
			c.retry(g, now, fmt.Sprintf("claim on %s not confirmed within %s", p.node, c.cfg.ClaimTimeout), []ref{cmd}, out)
		case c.lost(g, p.node, now):
			c.retry(g, now, fmt.Sprintf("claimant %s is no longer eligible (%s)", p.node, c.whyNot(g, p.node, now)),
				with([]ref{cmd}, c.nodeCauses(g, p.node)), out)
		}
		return // otherwise wait for the executor's answer
	}
	h := g.holder
	if h == "" {
		c.place(g, now, with, out)
		return
	}
	v := c.judgeHolder(g, h, now)
	switch {
	case v.down:
		to := c.best(g, now, h)
		if to == "" {
			c.hold(g, "down-no-target:"+h, fmt.Sprintf("%s; no other eligible node (%s)", v.why, c.summary(g, now, h)), with(v.causes), nil, out)
			return
		}
		c.move(g, now, events.ActionFailover, h, to,
			fmt.Sprintf("%s; %s is the highest-priority eligible node", v.why, to),
			with(v.causes, c.nodeCauses(g, to)), []string{h}, h, true, out)
	case v.silent:
		c.hold(g, v.key, v.why, with(v.causes), nil, out)
	case g.cfg.Nodes[0] != h && c.eligible(g, g.cfg.Nodes[0], now):
		if g.failbackTold {
			return // once per holder's tenure: a flapping preferred node must not flood the audit stream
		}
		g.failbackTold = true
		pref := g.cfg.Nodes[0]
		c.hold(g, "failback:"+h+":"+pref,
			fmt.Sprintf("preferred %s is eligible again while %s holds and is not down: failback needs a permit and is not automatic in this version", pref, h),
			with(c.nodeCauses(g, pref)), nil, out)
	default:
		g.situation, g.reason = "", ""
	}
}

func (c *Core) place(g *groupState, now time.Time, with func(...[]ref) []ref, out *Output) {
	to := c.best(g, now, "")
	if to == "" {
		var causes [][]ref
		for _, n := range g.cfg.Nodes {
			causes = append(causes, c.nodeCauses(g, n))
		}
		c.hold(g, "no-candidate", "no holder and no eligible node ("+c.summary(g, now, "")+")", with(causes...), nil, out)
		return
	}
	if now.Sub(c.origin) < c.cfg.SettleAfter {
		for _, n := range g.cfg.Nodes {
			if n == to {
				break
			}
			if c.nodes[n].lastHB.IsZero() {
				return // a preferred node may just not have spoken yet; Tick comes back
			}
		}
	}
	c.move(g, now, events.ActionPlace, "", to,
		fmt.Sprintf("no holder; %s is the highest-priority eligible node", to),
		with(c.nodeCauses(g, to)), nil, g.lastHolder, g.lastFenced, out)
}

// retry gives up the outstanding claim: the claimant is released (it may
// have applied the claim late, or may still do so from its queue) and
// skipped for RetryBackoff, and the next eligible node is claimed.
func (c *Core) retry(g *groupState, now time.Time, why string, causes []ref, out *Output) {
	p := g.pending
	g.pending = nil
	g.failed[p.node] = now.Add(c.cfg.RetryBackoff)
	to := c.best(g, now, p.node)
	if to == "" {
		c.hold(g, "no-candidate", fmt.Sprintf("%s; no other eligible node (%s): released, group has no holder", why, c.summary(g, now, p.node)),
			causes, []string{p.node}, out)
		return
	}
	c.move(g, now, events.ActionRetry, p.node, to, fmt.Sprintf("%s; trying %s", why, to),
		append(causes, c.nodeCauses(g, to)...), []string{p.node}, p.prevHolder, p.prevFenced, out)
}

// move emits a decision, releases, then the claim, and records the claim
// as outstanding. Every release is issued before the claim so that no node
// is told to hold the address while another still is.
func (c *Core) move(g *groupState, now time.Time, action events.Action, from, to, reason string, causes []ref,
	release []string, prev string, prevFenced bool, out *Output) {
	causes = dedup(causes)
	id, d, primary := c.decision(g, action, from, to, reason, causes, len(release)+1)
	notAfter := now.Add(c.cfg.CommandTTL)
	corr := corrOf(primary)
	c.emit(out, id, d, primary)
	cause := ref{id: id, corr: corr}
	for i, n := range release {
		c.emitCommand(out, d.Commands[i], events.ReleaseIP{Group: g.cfg.Name, Node: n, Addresses: g.cfg.Addresses, NotAfter: notAfter,
			Reason: fmt.Sprintf("%s to %s", action, to)}, cause)
	}
	claimID := d.Commands[len(release)]
	c.emitCommand(out, claimID, events.ClaimIP{Group: g.cfg.Name, Node: to, Addresses: g.cfg.Addresses, NotAfter: notAfter,
		PreviousHolder: prev, PreviousHolderFenced: prev != "" && prevFenced}, cause)
	if action == events.ActionFailover {
		// It has been told to release: the next claims (retries, or a later
		// placement) may name it as fenced.
		g.lastHolder, g.lastFenced = from, true
	}
	g.holder = ""
	g.pending = &claim{node: to, cmdID: claimID, corr: corr, deadline: now.Add(c.cfg.ClaimTimeout), action: action,
		prevHolder: prev, prevFenced: prevFenced}
	g.lastMove = now
	g.situation, g.reason = "", ""
	g.failbackTold = false
}

// hold explains why nothing moves, once per situation. A hold that releases
// a failed claimant is always emitted: a command must never go unexplained.
func (c *Core) hold(g *groupState, key, reason string, causes []ref, release []string, out *Output) {
	if len(release) == 0 && key == g.situation {
		return
	}
	causes = dedup(causes)
	if len(causes) == 0 {
		return // nothing to cite (a Tick with no evidence): wait for an event that explains it
	}
	g.situation, g.reason = key, reason
	from := g.holder
	id, d, primary := c.decision(g, events.ActionHold, from, "", reason, causes, len(release))
	c.emit(out, id, d, primary)
	cause := ref{id: id, corr: corrOf(primary)}
	for i, n := range release {
		c.emitCommand(out, d.Commands[i], events.ReleaseIP{Group: g.cfg.Name, Node: n, Addresses: g.cfg.Addresses,
			NotAfter: c.now.Add(c.cfg.CommandTTL), Reason: reason}, cause)
	}
}

// decision builds the decision payload. Its own id is drawn before its
// commands' ids, so ids follow emission order.
func (c *Core) decision(g *groupState, action events.Action, from, to, reason string, causes []ref, ncmd int) (string, events.ArbiterDecision, ref) {
	id := c.cfg.NewID()
	d := events.ArbiterDecision{Group: g.cfg.Name, Action: action, From: from, To: to, Reason: reason}
	for _, r := range causes {
		d.CausedBy = append(d.CausedBy, r.id)
	}
	for range ncmd {
		d.Commands = append(d.Commands, c.cfg.NewID())
	}
	return id, d, causes[0]
}

func (c *Core) emit(out *Output, id string, d events.ArbiterDecision, primary ref) {
	out.Emits = append(out.Emits, Emit{ID: id, Payload: d, Options: []events.Option{
		events.WithID(id), events.CausedByID(primary.id, corrOf(primary)), events.WithEpoch(c.epoch),
	}})
}

func (c *Core) emitCommand(out *Output, id string, p events.Payload, cause ref) {
	out.Emits = append(out.Emits, Emit{ID: id, Payload: p, Options: []events.Option{
		events.WithID(id), events.CausedByID(cause.id, cause.corr), events.WithEpoch(c.epoch),
	}})
}

func corrOf(r ref) string {
	if r.corr != "" {
		return r.corr
	}
	return r.id
}

func dedup(rs []ref) []ref {
	out := rs[:0:0]
	for _, r := range rs {
		if r.id == "" {
			continue
		}
		dup := false
		for _, o := range out {
			if o.id == r.id {
				dup = true
				break
			}
		}
		if !dup {
			out = append(out, r)
		}
	}
	return out
}

// sorted keeps map iteration order out of reasons: the same state gives the same text.
func sorted(s []string) []string {
	slices.Sort(s)
	return s
}
