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
	return now.After(c.quietUntil(n))
}

// quietUntil is the last instant at which n still counts as heard: after
// it, n is silent until its next beacon or heartbeat.
func (c *Core) quietUntil(n string) time.Time {
	hb, beacon := c.heardUntil(n)
	if !beacon.IsZero() && beacon.Before(hb) {
		return beacon
	}
	return hb
}

// busQuietUntil is the last instant at which n still counts as on the bus:
// for a node that sends beacons, when they stop; otherwise when its
// heartbeats do. See busSilent.
func (c *Core) busQuietUntil(n string) time.Time {
	hb, beacon := c.heardUntil(n)
	if !beacon.IsZero() {
		return beacon
	}
	return hb
}

// busSilent reports whether the holder n is off the bus, the judgement
// that lets its peers' reports move it. A node whose beacons still arrive
// is on the bus even when its heartbeats are late: they come through the
// live stream, which after a partition heals, a stream leader moves or
// this arbiter's own delivery stalls can lag for seconds while the node is
// fine. Counting that as silence let a peer's report of the holder down,
// left over from a cut of that peer just healed, move a healthy holder
// (seen in the three-server chaos). Late heartbeats still make a node
// silent for everything else (eligibility, drained calls): what the
// arbiter knows of it is stale.
func (c *Core) busSilent(n string, now time.Time) bool {
	return now.After(c.busQuietUntil(n))
}

// heardUntil is when n's heartbeats and when its beacons (zero: it sends
// none) count as missed.
func (c *Core) heardUntil(n string) (hb, beacon time.Time) {
	ns := c.presence(n)
	last := ns.lastHB
	if last.IsZero() {
		last = c.origin
	}
	limit := c.cfg.SilentAfter
	if adv := 3 * ns.hbInterval; adv > limit {
		limit = adv // a node told us it beats slower: three of its beats
	}
	if !ns.lastBeacon.IsZero() {
		beacon = ns.lastBeacon.Add(time.Duration(c.cfg.PresenceMisses)*ns.beaconEvery + c.cfg.PresenceGrace)
	}
	return last.Add(limit), beacon
}

// presence is the node whose heartbeats and beacons say whether n is heard:
// n itself, or for a member without a prober, its observer.
func (c *Core) presence(n string) *nodeState {
	ns := c.nodes[n]
	if ns.proxy != "" {
		return c.nodes[ns.proxy]
	}
	return ns
}

// selfObs is the observation that decides n's health in g: its own prober's
// self check, or the HealthFrom observer's check about n.
func (c *Core) selfObs(g *groupState, n string) *observation {
	if hs, ok := g.cfg.HealthFrom[n]; ok {
		o := c.obs[obsKey{hs.Observer, hs.Check}]
		if o == nil || o.target != n {
			return nil
		}
		return o
	}
	o := c.obs[obsKey{n, g.cfg.HealthCheck}]
	if o == nil || o.role != events.RoleSelf || o.target != n {
		return nil
	}
	return o
}

// healthCheck names the check that decides n's health in g, for reasons.
func (g *groupState) healthCheck(n string) string {
	if hs, ok := g.cfg.HealthFrom[n]; ok {
		return hs.Observer + "/" + hs.Check
	}
	return g.cfg.HealthCheck
}

func (c *Core) eligible(g *groupState, n string, now time.Time) bool {
	o := c.selfObs(g, n)
	return o != nil && o.health == events.HealthUp && !c.presence(n).lastHB.IsZero() && !c.silent(n, now)
}

// lost reports that n, a claimant, positively turned bad: its check went
// down or it fell off the bus (busSilent: its beacons stopped, or, for a
// node without beacons, its heartbeats). Late heartbeats alone do not: the
// live stream lags for seconds when its raft leader moves, which a new
// leader's steward does right after taking over, and giving a claim up
// releases the group (an operator's switchover was turned into a release
// and a placement on another node that way). A node merely not heard from
// yet (a leader restored a moment ago) is not lost; its claim gets the
// full ClaimTimeout.
func (c *Core) lost(g *groupState, n string, now time.Time) bool {
	o := c.selfObs(g, n)
	return (o != nil && o.health == events.HealthDown) || c.busSilent(n, now)
}

// whyNot says in a few words why n is not eligible, for hold reasons.
func (c *Core) whyNot(g *groupState, n string, now time.Time) string {
	switch o := c.selfObs(g, n); {
	case o != nil && o.health == events.HealthDown:
		return n + " " + g.healthCheck(n) + " down"
	case c.presence(n).lastHB.IsZero():
		return n + " never heard"
	case c.silent(n, now):
		return n + " silent"
	case o == nil || o.health != events.HealthUp:
		return n + " " + g.healthCheck(n) + " unknown"
	case c.isStandby(n):
		return n + " in standby"
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
		if n != skip && c.eligible(g, n, now) && !c.isStandby(n) && !c.failedUntil(g, n, now) {
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
	if r := c.presence(n).hbRef; r.id != "" {
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
		v := holderView{down: true, why: fmt.Sprintf("holder %s reports %s down", h, g.healthCheck(h)), causes: []ref{o.cause}}
		if o.origin != "" {
			v.causes = append(v.causes, ref{id: o.origin})
		}
		return v
	}
	if !c.busSilent(h, now) {
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
	if r := c.presence(h).hbRef; r.id != "" {
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
	c.pinTick(g, now, out)
	if p := g.pending; p != nil {
		cmd := ref{id: p.cmdID, corr: p.corr}
		switch {
		case !now.Before(p.deadline):
			c.retryUnanswered(g, now, fmt.Sprintf("claim on %s not confirmed within %s", p.node, c.cfg.ClaimTimeout), []ref{cmd}, out)
		case c.lost(g, p.node, now):
			c.retry(g, now, fmt.Sprintf("claimant %s is no longer eligible (%s)", p.node, c.whyNot(g, p.node, now)),
				with([]ref{cmd}, c.nodeCauses(g, p.node)), out)
		}
		return // otherwise wait for the executor's answer
	}
	frozen := c.frozenWhy(g)
	h := g.holder
	if h == "" {
		if p := g.planned; p != nil {
			c.endPlanned(g, events.PlannedOverridden, fmt.Sprintf("%s overridden: the group has no holder", p.what(g)), with(), out)
		}
		if frozen != "" {
			c.hold(g, "frozen-empty", "no holder, and "+frozen+": nothing is placed until a human unfreezes it",
				with(c.allNodeCauses(g)...), nil, true, out)
			return
		}
		c.place(g, now, with, out)
		return
	}
	v := c.judgeHolder(g, h, now)
	if p := g.planned; p != nil && (v.down || p.from != h) {
		// A failover always overrides a waiting planned move.
		why := fmt.Sprintf("%s overridden: %s", p.what(g), v.why)
		if !v.down {
			why = fmt.Sprintf("%s overridden: the holder is now %s", p.what(g), h)
		}
		c.endPlanned(g, events.PlannedOverridden, why, with(v.causes), out)
	}
	switch {
	case g.planned != nil && !v.down:
		c.considerPlanned(g, h, now, frozen, out)
	case v.down:
		if frozen != "" {
			c.hold(g, "frozen-down:"+h, fmt.Sprintf("%s; %s: not replaced, a human must act", v.why, frozen), with(v.causes), nil, true, out)
			return
		}
		to := c.best(g, now, h)
		if to == "" {
			c.hold(g, "down-no-target:"+h, fmt.Sprintf("%s; no other eligible node (%s)", v.why, c.summary(g, now, h)), with(v.causes), nil, false, out)
			return
		}
		if c.capReached(g, now) {
			c.freeze(g, "frozen-down:"+h, v.why, with(v.causes), out)
			return
		}
		g.moves = append(g.moves, now)
		c.move(g, now, events.ActionFailover, h, to,
			fmt.Sprintf("%s; %s is the highest-priority eligible node%s", v.why, to, c.callsNote(g, h)),
			with(v.causes, c.nodeCauses(g, to)), []string{h}, h, true, out)
	case v.silent:
		c.hold(g, v.key, v.why, with(v.causes), nil, false, out)
	case c.isStandby(h):
		c.leaveStandby(g, h, now, with, frozen, out)
	default:
		c.considerFailback(g, h, now, with, frozen, out)
	}
}

// leaveStandby moves a group off a holder an operator put in standby, like
// Pacemaker's standby: at once, without hold-down, since a human asked.
func (c *Core) leaveStandby(g *groupState, h string, now time.Time, with func(...[]ref) []ref, frozen string, out *Output) {
	causes := with([]ref{c.standby[h]})
	if frozen != "" {
		c.holdOnce(g, "standby-frozen:"+h, fmt.Sprintf("holder %s is in standby but %s: it keeps the group", h, frozen), causes, out)
		return
	}
	to := c.best(g, now, h)
	if to == "" {
		c.holdOnce(g, "standby-no-target:"+h, fmt.Sprintf("holder %s is in standby but no other node is eligible (%s): it keeps the group",
			h, c.summary(g, now, h)), causes, out)
		return
	}
	c.move(g, now, events.ActionSwitchover, h, to, fmt.Sprintf("holder %s is in standby (operator); %s is the highest-priority eligible node%s",
		h, to, c.callsNote(g, h)), append(causes, c.nodeCauses(g, to)...), []string{h}, h, true, out)
}

// considerFailback moves the group back to a more preferred node only when
// every condition holds: a permit in force, past the hold-down, the target
// stable, replication back to it caught up (when required), calls drained
// (or the window closing with force), and the move cap not reached. Each
// wait is explained once per tenure.
func (c *Core) considerFailback(g *groupState, h string, now time.Time, with func(...[]ref) []ref, frozen string, out *Output) {
	to := c.failbackTarget(g, h, now)
	if to == "" {
		g.situation, g.reason, g.human = "", "", false
		return
	}
	pol := g.cfg.Failback
	causes := with(c.nodeCauses(g, to))
	key := func(k string) string { return "failback-" + k + ":" + h + ":" + to }
	if frozen != "" {
		c.holdOnce(g, key("frozen"), fmt.Sprintf("preferred %s is eligible again while %s holds; %s: no failback", to, h, frozen), causes, out)
		return
	}
	if c.pinHoldsFailback(g, h, to, with, out) {
		return
	}
	p := g.permit
	if p == nil || now.Before(p.from) || !now.Before(p.until) {
		c.holdOnce(g, key("permit"), fmt.Sprintf("preferred %s is eligible again while %s holds and is not down: failback needs a permit (no failback window is open)", to, h),
			causes, out)
		return
	}
	causes = append(causes, p.cause)
	if until := g.lastMove.Add(c.cfg.HoldDown); now.Before(until) {
		c.holdOnce(g, key("hold-down"), fmt.Sprintf("failback to %s waits for the hold-down after the last move (until %s)", to, until.Format(time.RFC3339)), causes, out)
		return
	}
	if since := c.stableSince(g, to); now.Sub(since) < pol.StableFor {
		c.holdOnce(g, key("stable"), fmt.Sprintf("failback to %s waits until it has been healthy for %s (healthy since %s)",
			to, pol.StableFor, since.Format(time.RFC3339)), causes, out)
		return
	}
	if pol.RequireReplication {
		ok, why, refs := c.replicated(g, h, to)
		if !ok {
			c.holdOnce(g, key("replication"), fmt.Sprintf("failback to %s waits for replication: %s", to, why), append(causes, refs...), out)
			return
		}
		causes = append(causes, refs...)
	}
	forced := false
	// A member without a prober (a DNS site) reports no calls to drain.
	if pol.DrainMaxChannels >= 0 && c.nodes[h].proxy == "" {
		ch := c.nodes[h].channels
		if ch == nil || *ch > pol.DrainMaxChannels {
			busy := "its active channels are unknown (its prober does not report them)"
			if ch != nil {
				busy = fmt.Sprintf("it has %d active channels (limit %d)", *ch, pol.DrainMaxChannels)
			}
			closing := !now.Before(p.until.Add(-pol.ForceBefore))
			if !(pol.OnWindowClose == WindowCloseForce && closing) {
				c.holdOnce(g, key("drain"), fmt.Sprintf("failback to %s waits for %s to drain: %s; on window close: %s", to, h, busy, pol.OnWindowClose),
					append(causes, c.nodes[h].hbRef), out)
				return
			}
			forced = true
		}
		causes = append(causes, c.nodes[h].hbRef)
	}
	if c.capReached(g, now) {
		c.freeze(g, key("frozen"), fmt.Sprintf("failback from %s to %s is due", h, to), causes, out)
		g.told[key("frozen")] = true
		return
	}
	reason := fmt.Sprintf("failback to preferred %s inside window %s: healthy for %s", to, p.window, now.Sub(c.stableSince(g, to)).Round(time.Second))
	if pol.RequireReplication {
		reason += ", replication caught up"
	}
	if forced {
		reason += fmt.Sprintf("; FORCED with calls on %s because the window closes at %s", h, p.until.Format(time.RFC3339))
	} else if pol.DrainMaxChannels >= 0 {
		reason += ", calls drained"
	}
	g.moves = append(g.moves, now)
	c.move(g, now, events.ActionFailback, h, to, reason, causes, []string{h}, h, true, out, func(d *events.ArbiterDecision) { d.Forced = forced })
}

// failbackTarget is the highest-priority node above the holder that could
// take the group now: eligible, not in standby, not just failed.
func (c *Core) failbackTarget(g *groupState, h string, now time.Time) string {
	for _, n := range g.cfg.Nodes {
		if n == h {
			return ""
		}
		if c.eligible(g, n, now) && !c.isStandby(n) && !c.failedUntil(g, n, now) {
			return n
		}
	}
	return ""
}

// stableSince is since when n has been both healthy and heard without a
// silence, on the arbiter's clock. A leader that just started counts from
// its first sight of the node: it never assumes stability it did not see.
func (c *Core) stableSince(g *groupState, n string) time.Time {
	since := c.presence(n).heardSince
	if o := c.selfObs(g, n); o != nil && o.at.After(since) {
		since = o.at
	}
	return since
}

// replicated reports whether every tree the holder replicated to the
// target since the last move is caught up (and that there is at least one).
func (c *Core) replicated(g *groupState, h, to string) (bool, string, []ref) {
	type tr struct {
		tree string
		r    *replReport
	}
	var trees []tr
	for k, r := range c.repl {
		if k.node == h && k.peer == to && r.at.After(g.lastMove) {
			trees = append(trees, tr{k.tree, r})
		}
	}
	if len(trees) == 0 {
		return false, fmt.Sprintf("no replication report from %s to %s since the last move", h, to), nil
	}
	slices.SortFunc(trees, func(a, b tr) int { return strings.Compare(a.tree, b.tree) })
	var lagging []string
	var refs []ref
	for _, t := range trees {
		refs = append(refs, t.r.cause)
		if !t.r.caughtUp {
			lagging = append(lagging, t.tree)
		}
	}
	if len(lagging) > 0 {
		return false, fmt.Sprintf("%s -> %s not caught up for %s", h, to, strings.Join(lagging, ", ")), refs
	}
	return true, "", refs
}

func (c *Core) isStandby(n string) bool {
	_, ok := c.standby[n]
	return ok
}

// frozenWhy says why the group makes no automatic move, or "".
func (c *Core) frozenWhy(g *groupState) string {
	switch {
	case c.maintenance != "":
		return "the cluster is in maintenance (" + c.maintenance + ")"
	case g.maintenance != "":
		return "group " + g.cfg.Name + " is in maintenance (" + g.maintenance + ")"
	case g.flapFrozen != "":
		return "group " + g.cfg.Name + " is frozen (" + g.flapFrozen + ")"
	}
	return ""
}

// capReached prunes the move history to the last hour and reports whether
// another automatic move would exceed the cap.
func (c *Core) capReached(g *groupState, now time.Time) bool {
	cut := now.Add(-time.Hour)
	i := 0
	for i < len(g.moves) && !g.moves[i].After(cut) {
		i++
	}
	g.moves = g.moves[i:]
	return c.cfg.MaxMovesPerHour > 0 && len(g.moves) >= c.cfg.MaxMovesPerHour
}

// freeze stops automatic moves in the group and asks for a human.
// key is the situation the group stays in while frozen, so the freeze is
// not explained twice.
func (c *Core) freeze(g *groupState, key, why string, causes []ref, out *Output) {
	g.flapFrozen = fmt.Sprintf("%d automatic moves in the last hour, the most allowed", len(g.moves))
	c.hold(g, key, fmt.Sprintf("%s, but group %s has moved %d times in the last hour (max %d): frozen against flapping; a human must look, then `fanctl maintenance off --group %s`",
		why, g.cfg.Name, len(g.moves), c.cfg.MaxMovesPerHour, g.cfg.Name), causes, nil, true, out)
}

func (c *Core) allNodeCauses(g *groupState) [][]ref {
	var causes [][]ref
	for _, n := range g.cfg.Nodes {
		causes = append(causes, c.nodeCauses(g, n))
	}
	return causes
}

func (c *Core) place(g *groupState, now time.Time, with func(...[]ref) []ref, out *Output) {
	to := c.best(g, now, "")
	if to == "" {
		c.hold(g, "no-candidate", "no holder and no eligible node ("+c.summary(g, now, "")+")", with(c.allNodeCauses(g)...), nil, false, out)
		return
	}
	if now.Sub(c.origin) < c.cfg.SettleAfter {
		for _, n := range g.cfg.Nodes {
			if n == to {
				break
			}
			if c.isStandby(n) {
				continue
			}
			// A preferred node may not have spoken yet, or spoken before its
			// checks reached a verdict (a prober's first rise, a monitor's
			// quorum): placing elsewhere now would cost a failback later.
			// Tick comes back.
			if o := c.selfObs(g, n); c.presence(n).lastHB.IsZero() || o == nil || o.health == events.HealthUnknown {
				return
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
// retryUnanswered is retry for a claim that got no answer at all. When its
// node is the only eligible one, it is claimed again at once rather than
// left out for RetryBackoff with the group holding nothing: the usual cause
// is not the node but the bus (the node's command consumer electing a new
// leader after a NATS server died, 4 to 9 s), and no other node could take
// the address anyway. That is safe: the unanswered claim can no longer
// start (ClaimTTL), and one that did start is ahead of the new one in the
// node's ordered queue and holds the same addresses. A claim the node
// answered with a failure is never repeated this way.
func (c *Core) retryUnanswered(g *groupState, now time.Time, why string, causes []ref, out *Output) {
	p := g.pending
	if c.frozenWhy(g) == "" && c.eligible(g, p.node, now) && !c.isStandby(p.node) && c.best(g, now, p.node) == "" {
		g.pending = nil
		c.move(g, now, events.ActionRetry, p.node, p.node,
			fmt.Sprintf("%s; %s is the only eligible node: claiming it again", why, p.node),
			append(causes, c.nodeCauses(g, p.node)...), nil, p.prevHolder, p.prevFenced, out)
		return
	}
	c.retry(g, now, why, causes, out)
}

func (c *Core) retry(g *groupState, now time.Time, why string, causes []ref, out *Output) {
	p := g.pending
	g.pending = nil
	g.failed[p.node] = now.Add(c.cfg.RetryBackoff)
	if frozen := c.frozenWhy(g); frozen != "" {
		c.hold(g, "frozen-empty", fmt.Sprintf("%s; %s: released, no other claim, group has no holder", why, frozen),
			causes, []string{p.node}, true, out)
		return
	}
	to := c.best(g, now, p.node)
	if to == "" {
		c.hold(g, "no-candidate", fmt.Sprintf("%s; no other eligible node (%s): released, group has no holder", why, c.summary(g, now, p.node)),
			causes, []string{p.node}, false, out)
		return
	}
	c.move(g, now, events.ActionRetry, p.node, to, fmt.Sprintf("%s; trying %s", why, to),
		append(causes, c.nodeCauses(g, to)...), []string{p.node}, p.prevHolder, p.prevFenced, out)
}

// move emits a decision, releases, then the claim, and records the claim
// as outstanding. Every release is issued before the claim so that no node
// is told to hold the address while another still is.
func (c *Core) move(g *groupState, now time.Time, action events.Action, from, to, reason string, causes []ref,
	release []string, prev string, prevFenced bool, out *Output, mods ...func(*events.ArbiterDecision)) {
	// A move away from a holder says what it had up, by its last calls
	// summary since it took the group, and cites it.
	var calls *callsHeard
	if from != "" && action != events.ActionRetry {
		if calls = c.tenureCalls(g, from); calls != nil {
			causes = append(causes, calls.ref)
		}
	}
	causes = dedup(causes)
	if prev == to {
		// Moving back to the node that held it last (a retry after a
		// failed failback): it is not its own previous holder.
		prev, prevFenced = "", false
	}
	id, d, primary := c.decision(g, action, from, to, reason, causes, len(release)+1)
	if calls != nil {
		d.Calls = calls.holderCalls()
	}
	for _, m := range mods {
		m(&d)
	}
	notAfter := now.Add(c.cfg.CommandTTL)
	corr := corrOf(primary)
	c.emit(out, id, d, primary)
	cause := ref{id: id, corr: corr}
	// Releases and the claim reach different executors at the same moment.
	// A released node still on the bus lets go within milliseconds: the
	// claimant waits for that (bounded) rather than announce while it still
	// answers. One off the bus (busSilent: its beacons stopped) cannot
	// answer, and is cut off or dead.
	var after []string
	for i, n := range release {
		c.emitCommand(out, d.Commands[i], events.ReleaseIP{Group: g.cfg.Name, Node: n, Addresses: g.cfg.Addresses, NotAfter: notAfter,
			Reason: fmt.Sprintf("%s to %s", action, to)}, cause)
		if !c.busSilent(n, now) {
			after = append(after, d.Commands[i])
		}
	}
	claimID := d.Commands[len(release)]
	// Claims expire when the arbiter gives up on them (see Config.ClaimTTL).
	c.emitCommand(out, claimID, events.ClaimIP{Group: g.cfg.Name, Node: to, Addresses: g.cfg.Addresses, NotAfter: now.Add(c.cfg.ClaimTTL()),
		PreviousHolder: prev, PreviousHolderFenced: prev != "" && prevFenced, AfterReleases: after}, cause)
	if from != "" && len(release) > 0 && release[0] == from && action != events.ActionRetry {
		// It has been told to release: the next claims (retries, or a later
		// placement) may name it as fenced.
		g.lastHolder, g.lastFenced = from, true
	}
	g.holder = ""
	g.pending = &claim{node: to, cmdID: claimID, corr: corr, deadline: now.Add(c.cfg.ClaimTimeout), action: action,
		prevHolder: prev, prevFenced: prevFenced}
	g.lastMove = now
	g.situation, g.reason, g.human = "", "", false
	clear(g.told)
	c.pinMoved(g, action, from, to, ref{id: id, corr: corr}, d.CausedBy, out)
}

// hold explains why nothing moves, once per situation. A hold that releases
// a failed claimant is always emitted: a command must never go unexplained.
func (c *Core) hold(g *groupState, key, reason string, causes []ref, release []string, human bool, out *Output) {
	if len(release) == 0 && key == g.situation {
		// Explained already; the status still says it as it stands now
		// (a node named "never heard" when the hold began has been heard
		// since), without a new decision.
		g.reason = reason
		return
	}
	causes = dedup(causes)
	if len(causes) == 0 {
		return // nothing to cite (a Tick with no evidence): wait for an event that explains it
	}
	g.situation, g.reason, g.human = key, reason, human
	from := g.holder
	id, d, primary := c.decision(g, events.ActionHold, from, "", reason, causes, len(release))
	d.NeedsHuman = human
	c.emit(out, id, d, primary)
	cause := ref{id: id, corr: corrOf(primary)}
	for i, n := range release {
		c.emitCommand(out, d.Commands[i], events.ReleaseIP{Group: g.cfg.Name, Node: n, Addresses: g.cfg.Addresses,
			NotAfter: c.now.Add(c.cfg.CommandTTL), Reason: reason}, cause)
	}
}

// holdOnce is hold for waits that may come and go with a flapping node:
// each is explained at most once per holder's tenure and term, so a flap
// cannot flood the audit stream; the status still shows the current one.
func (c *Core) holdOnce(g *groupState, key, reason string, causes []ref, out *Output) {
	if g.told[key] {
		g.situation, g.reason, g.human = key, reason, false
		return
	}
	before := len(out.Emits)
	c.hold(g, key, reason, causes, nil, false, out)
	if len(out.Emits) > before {
		g.told[key] = true
	}
}

// decision builds the decision payload. Its own id is drawn before its
// commands' ids, so ids follow emission order.
func (c *Core) decision(g *groupState, action events.Action, from, to, reason string, causes []ref, ncmd int) (string, events.ArbiterDecision, ref) {
	id := c.cfg.NewID()
	d := events.ArbiterDecision{Group: g.cfg.Name, Action: action, From: from, To: to, Reason: reason, Trigger: c.trigger, Input: c.input, InputAudit: c.inputAudit, InputLive: c.inputLive}
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
		events.WithID(id), events.CausedByID(primary.id, corrOf(primary)), events.WithEpoch(c.epoch), events.At(c.now.UTC()),
	}})
}

func (c *Core) emitCommand(out *Output, id string, p events.Payload, cause ref) {
	out.Emits = append(out.Emits, Emit{ID: id, Payload: p, Options: []events.Option{
		events.WithID(id), events.CausedByID(cause.id, cause.corr), events.WithEpoch(c.epoch), events.At(c.now.UTC()),
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
