package decide

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/fanpbx/fan/pkg/events"
)

// Emit is one event for the shell to build with
// events.New(source, cluster, Payload, Options...) and publish, in order.
type Emit struct {
	// ID is the id pre-assigned through Options (events.WithID); decisions
	// name their commands by it, and the shell may log it.
	ID      string
	Payload events.Payload
	Options []events.Option
}

// Output is what one input produced. Publish Emits in order: a decision
// comes before its commands so the audit stream explains a move before it
// happens, and a release comes before the claim that replaces it.
type Output struct {
	Emits []Emit
}

// ref is an event the core may cite as a cause. corr is its correlation id
// when known, so that a chain keeps one correlation id.
type ref struct {
	id, corr string
}

func envRef(e events.Envelope) ref { return ref{id: e.ID, corr: e.CorrelationID} }

type obsKey struct{ observer, check string }

// observation is the last known state of one check run by one observer.
type observation struct {
	target string
	role   events.Role
	health events.Health
	since  time.Time // the observer's clock: only used to refuse going backwards
	cause  ref       // the event that told us
	origin string    // the transition that set the state, when a heartbeat told us
	at     time.Time // the arbiter's time when health took this value (stability is judged on it)
}

type nodeState struct {
	// lastBeacon and beaconEvery come from presence beacons (core NATS,
	// every ~100 ms); once a node sends them, missing a few makes it silent
	// long before a missed heartbeat would.
	lastBeacon  time.Time
	beaconEvery time.Duration
	lastHB      time.Time // the arbiter's time
	heardSince  time.Time // the arbiter's time since when the node has been heard without a silence
	hbInterval  time.Duration
	hbRef       ref
	channels    *int                // active channels in its last heartbeat; nil when its prober does not know
	calls       *int                // active calls likewise: what a move off it cuts, for the operator
	checks      map[string]struct{} // check names this node's prober reported
	groups      []int
	// proxy is the observer whose presence stands for this node's (a
	// member with HealthFrom, which runs no prober); "" for a normal node.
	proxy string
	// summary is its replicator's last calls summary: which of its calls
	// a move can carry across (calls.go).
	summary *callsHeard
}

type claim struct {
	node, cmdID, corr string
	deadline          time.Time
	action            events.Action
	prevHolder        string
	prevFenced        bool
}

type permit struct {
	window      string
	from, until time.Time
	cause       ref
}

type groupState struct {
	cfg        Group
	peerChecks map[string]bool // nil: any peer check
	holder     string
	lastHolder string // released or lost: the PreviousHolder of the next claim
	lastFenced bool
	pending    *claim
	failed     map[string]time.Time // node -> excluded until
	lastMove   time.Time
	situation  string // key of the last hold explained, "" when nothing to explain
	// told: failback waits already explained during this holder's tenure
	// and term (each at most once, however often the preferred node flaps).
	told   map[string]bool
	reason string // its text, for Snapshot
	permit *permit
	// maintenance is the operator's freeze of this group (its reason), and
	// flapFrozen the freeze the move cap imposed; either stops automatic moves.
	maintenance string
	flapFrozen  string
	moves       []time.Time // automatic moves within the last hour
	human       bool        // the standing hold asks for a human
	// planned is the operator's planned move waiting for the holder to
	// drain (or a standby's that gave up), at most one per group.
	planned *planned
	// pin is the operator's pin in force, pinAsk the pin of a switchover
	// still waiting to move (pin.go).
	pin    *pin
	pinAsk *pinAsk
}

type claimResult struct {
	node    string
	outcome events.Outcome
}

// maxResults bounds the remembered claim outcomes; a handover restores at
// most one claim per group, so this covers hundreds of groups.
const maxResults = 1024

type replKey struct{ node, peer, tree string }

// replReport is the last replication pass reported from node to peer for a tree.
type replReport struct {
	caughtUp bool
	at       time.Time // the arbiter's time of receipt
	cause    ref
}

// Core is the decision state machine. It is not safe for concurrent use:
// the shell feeds it from one goroutine, which also keeps decisions in the
// order the events were consumed.
type Core struct {
	cfg     Config
	groups  []*groupState
	byName  map[string]int
	nodes   map[string]*nodeState
	obs     map[obsKey]*observation
	peerIdx map[string]map[obsKey]struct{} // target -> peer-role observations of it

	epoch, maxEpoch uint64
	leading         bool
	origin, now     time.Time

	// results remembers recent claim outcomes seen while following, so a
	// successor that restores an outstanding claim confirmed during the
	// handover does not time it out and move the group again.
	results     map[string]claimResult
	resultOrder []string

	maintenance string         // the operator's cluster-wide freeze (its reason)
	standby     map[string]ref // node -> the operator action that put it in standby
	repl        map[replKey]*replReport

	affected []int // scratch, reused to keep the heartbeat path allocation-light
	// replyFor: the groups whose planned move the operator action being
	// handled started, so its reply can say what became of each.
	replyFor []*groupState

	// trigger and input are stamped on every decision (see
	// events.ArbiterDecision): what the core was doing, and the last
	// stored event it had read, so that a replay can do the same.
	trigger events.Trigger
	input   string
	// first is the first event given other than a failback permit (those
	// are read from each group's last, older than the rest): where this
	// core's view of the nodes begins.
	first string
	// inputAudit and inputLive are the last events handled from the audit
	// stream and from the live stream, which the arbiter reads at once.
	inputAudit, inputLive string
}

// New validates cfg, fills in defaults and returns a core that is not leading.
func New(cfg Config) (*Core, error) {
	cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	c := &Core{
		cfg:     cfg,
		byName:  map[string]int{},
		nodes:   map[string]*nodeState{},
		obs:     map[obsKey]*observation{},
		peerIdx: map[string]map[obsKey]struct{}{},
		standby: map[string]ref{},
		repl:    map[replKey]*replReport{},
		results: map[string]claimResult{},
	}
	for i, g := range cfg.Groups {
		g.Addresses = slices.Clone(g.Addresses)
		g.Nodes = slices.Clone(g.Nodes)
		gs := &groupState{cfg: g, failed: map[string]time.Time{}, told: map[string]bool{}}
		if len(g.PeerChecks) > 0 {
			gs.peerChecks = map[string]bool{}
			for _, pc := range g.PeerChecks {
				gs.peerChecks[pc] = true
			}
		}
		c.groups = append(c.groups, gs)
		c.byName[g.Name] = i
		g.HealthFrom = maps.Clone(g.HealthFrom)
		gs.cfg.HealthFrom = g.HealthFrom
		members := slices.Clone(g.Nodes)
		for _, n := range slices.Sorted(maps.Keys(g.HealthFrom)) {
			// The observer's heartbeats, beacons and transitions must reach
			// this group even if it is a member of none.
			if o := g.HealthFrom[n].Observer; !slices.Contains(members, o) {
				members = append(members, o)
			}
		}
		for _, n := range members {
			ns := c.nodes[n]
			if ns == nil {
				ns = &nodeState{checks: map[string]struct{}{}}
				c.nodes[n] = ns
			}
			ns.groups = append(ns.groups, i)
		}
		for n, hs := range g.HealthFrom {
			c.nodes[n].proxy = hs.Observer
		}
	}
	return c, nil
}

// Input is the id of the last stored event the core was given: a record
// of where a term began in the trail.
func (c *Core) Input() string { return c.input }

// ConfigDigest is the digest of the policy this core decides under.
func (c *Core) ConfigDigest() string { return c.cfg.Digest() }

// InputAudit and InputLive are the last events the core was given from the
// audit and from the live stream.
func (c *Core) InputAudit() string { return c.inputAudit }

// InputLive is the last event the core was given from the live stream
// (see InputAudit).
func (c *Core) InputLive() string { return c.inputLive }

// FirstInput is the id of the first one (failback permits aside).
func (c *Core) FirstInput() string { return c.first }

// ErrEpoch is returned when a leadership epoch is zero or goes backwards.
var ErrEpoch = errors.New("invalid leadership epoch")

// SetLeadership tells the core whether it leads and under which term.
// Commands are stamped with epoch; an epoch lower than one already seen is
// refused, because a term going backwards means two leaders.
func (c *Core) SetLeadership(epoch uint64, leading bool) error {
	if leading && epoch == 0 {
		return fmt.Errorf("%w: leading with epoch 0 (commands are fenced by it)", ErrEpoch)
	}
	if epoch < c.maxEpoch {
		return fmt.Errorf("%w: %d is older than %d", ErrEpoch, epoch, c.maxEpoch)
	}
	gained := leading && (!c.leading || epoch != c.epoch)
	c.epoch, c.maxEpoch, c.leading = epoch, epoch, leading
	if gained {
		// A new term explains the standing situation once more, so the audit
		// stream shows what this leader inherited.
		for _, g := range c.groups {
			g.situation, g.reason = "", ""
			clear(g.told)
		}
	}
	return nil
}

func (c *Core) clock(now time.Time) {
	if c.origin.IsZero() {
		c.origin = now
	}
	c.now = now
}

// Handle applies one consumed event. Events of another cluster, of nodes or
// groups not configured here, and types the arbiter does not use are
// ignored: they may belong to another arbiter. p is in its decoded form (a
// pointer, as events.Decode returns it); a payload value does not compile
// here, so none can slip past the switch below unseen.
func (c *Core) Handle(now time.Time, env events.Envelope, p events.Decoded) Output {
	c.clock(now)
	var out Output
	if env.Cluster != c.cfg.Cluster {
		return out
	}
	c.trigger, c.input = events.TriggerEvent, env.ID
	if c.first == "" && env.Type != events.TypeFailbackPermit {
		c.first = env.ID
	}
	if events.IsLive(env.Type) {
		c.inputLive = env.ID
	} else {
		c.inputAudit = env.ID
	}
	c.affected = c.affected[:0]
	switch v := p.(type) {
	case *events.HealthTransition:
		c.onTransition(env, *v)
	case *events.NodeHeartbeat:
		c.onHeartbeat(now, env, v)
	case *events.CommandResult:
		c.onResult(now, env, *v, &out)
	case *events.FailbackPermit:
		c.onPermit(env, *v)
	case *events.ReplicationStatus:
		c.onReplication(now, env, *v)
	case *events.CallsSummary:
		c.onCallsSummary(now, env, *v)
	}
	if c.leading {
		trig := envRef(env)
		for _, gi := range c.affected {
			c.evaluate(c.groups[gi], now, &trig, &out)
		}
	}
	return out
}

// Beacon notes a presence beacon: the node's prober is alive and on the
// bus. A node that has sent beacons is silent once PresenceMisses of its
// beacon intervals (plus PresenceGrace) pass without one — fractions of a
// second — which is how a crashed node or a cut link is noticed fast.
// Silence alone never moves anything: a silent holder is replaced only when
// its peers also cannot reach its PBX. Beacons carry no event id, so
// decisions cite the peers' transitions and the node's last heartbeat.
func (c *Core) Beacon(now time.Time, b events.Beacon) Output {
	c.clock(now)
	c.trigger = events.TriggerBeacon
	var out Output
	ns := c.nodes[b.Node]
	if ns == nil || b.IntervalMS <= 0 {
		return out
	}
	wasSilent := !ns.lastBeacon.IsZero() && c.silent(b.Node, now)
	ns.lastBeacon = now
	ns.beaconEvery = time.Duration(b.IntervalMS) * time.Millisecond
	if !wasSilent {
		return out
	}
	// Back from a silence: stability starts again, and the node may be
	// eligible again in its groups.
	ns.heardSince = now
	c.affected = c.affected[:0]
	c.touchNode(b.Node)
	if c.leading {
		for _, gi := range c.affected {
			c.evaluate(c.groups[gi], now, nil, &out)
		}
	}
	return out
}

// Tick runs the timers: claim timeouts, silence, settle and backoff expiry.
// The shell calls it periodically (a few times per second keeps timeouts
// within that much of their configured value).
func (c *Core) Tick(now time.Time) Output {
	c.clock(now)
	c.trigger = events.TriggerTick
	var out Output
	if !c.leading {
		return out
	}
	for _, g := range c.groups {
		c.evaluate(g, now, nil, &out)
	}
	return out
}

// Wake is the next moment after now at which a Tick could decide
// something no input will announce: a holder or a claimant falling silent
// (its beacons or heartbeats missed), or a claim's deadline. Zero when
// nothing is due or the core is not leading. The shell ticks then as well
// as periodically, so a crashed holder is judged the moment its silence
// limit passes, on its own beacon schedule, not up to a tick later.
func (c *Core) Wake(now time.Time) time.Time {
	if !c.leading {
		return time.Time{}
	}
	var next time.Time
	consider := func(t time.Time) {
		if t.After(now) && (next.IsZero() || t.Before(next)) {
			next = t
		}
	}
	for _, g := range c.groups {
		switch {
		case g.pending != nil:
			consider(g.pending.deadline)
			consider(c.quietUntil(g.pending.node).Add(time.Nanosecond))
		case g.holder != "":
			consider(c.busQuietUntil(g.holder).Add(time.Nanosecond))
		}
	}
	return next
}

func (c *Core) touch(gi int) {
	if !slices.Contains(c.affected, gi) {
		c.affected = append(c.affected, gi)
	}
}

func (c *Core) touchNode(n string) {
	if ns := c.nodes[n]; ns != nil {
		for _, gi := range ns.groups {
			c.touch(gi)
		}
	}
}

func (c *Core) onTransition(env events.Envelope, t events.HealthTransition) {
	observer := env.Source.Node
	if c.nodes[observer] == nil || c.nodes[t.TargetNode] == nil {
		return
	}
	if t.Role == events.RoleSelf && t.TargetNode != observer {
		return // a self check about someone else is malformed: trust nothing in it
	}
	c.setObs(obsKey{observer, t.Check}, t.TargetNode, t.Role, t.To, env.Time, envRef(env), "")
}

func (c *Core) onHeartbeat(now time.Time, env events.Envelope, hb *events.NodeHeartbeat) {
	ns := c.nodes[hb.Node]
	if ns == nil {
		return
	}
	if ns.lastHB.IsZero() || c.silent(hb.Node, now) {
		ns.heardSince = now // back from a silence: stability starts again
	}
	ns.lastHB = now
	ns.hbInterval = time.Duration(hb.IntervalMS) * time.Millisecond
	ns.hbRef = envRef(env)
	ns.channels, ns.calls = cloneInt(hb.ActiveChannels), cloneInt(hb.ActiveCalls)
	// Its own groups may see it become eligible; groups where it observes
	// someone as a peer may see their silent holder's evidence change.
	c.touchNode(hb.Node)
	accepted := 0
	for name, cs := range hb.Checks {
		k := obsKey{hb.Node, name}
		if c.nodes[cs.TargetNode] == nil || (cs.Role == events.RoleSelf && cs.TargetNode != hb.Node) {
			c.dropObs(k)
			continue
		}
		accepted++
		c.setObs(k, cs.TargetNode, cs.Role, cs.Health, cs.Since, envRef(env), cs.SinceEvent)
	}
	// Level-triggered: a check the prober no longer reports is forgotten.
	// An empty map says nothing (it is omitted on the wire), so it wipes nothing.
	if len(hb.Checks) > 0 && len(ns.checks) > accepted {
		for name := range ns.checks {
			if _, ok := hb.Checks[name]; !ok {
				c.dropObs(obsKey{hb.Node, name})
			}
		}
	}
}

func (c *Core) setObs(k obsKey, target string, role events.Role, h events.Health, since time.Time, cause ref, origin string) {
	o := c.obs[k]
	if o != nil {
		if o.target == target && o.role == role && o.health == h {
			return // a heartbeat repeating what we know: nothing changes, keep the original cause
		}
		if since.Before(o.since) {
			return // older than what we hold: redelivery or reordering
		}
		if o.target != target || o.role != role {
			c.dropObs(k)
			o = nil
		}
	}
	if o == nil {
		o = &observation{}
		c.obs[k] = o
		c.nodes[k.observer].checks[k.check] = struct{}{}
	}
	*o = observation{target: target, role: role, health: h, since: since, cause: cause, origin: origin, at: c.now}
	if role == events.RolePeer {
		idx := c.peerIdx[target]
		if idx == nil {
			idx = map[obsKey]struct{}{}
			c.peerIdx[target] = idx
		}
		idx[k] = struct{}{}
	}
	c.touchNode(target)
}

func (c *Core) dropObs(k obsKey) {
	o := c.obs[k]
	if o == nil {
		return
	}
	delete(c.obs, k)
	delete(c.nodes[k.observer].checks, k.check)
	if idx := c.peerIdx[o.target]; idx != nil {
		delete(idx, k)
	}
	c.touchNode(o.target)
}

func (c *Core) onResult(now time.Time, env events.Envelope, r events.CommandResult, out *Output) {
	gi, ok := c.byName[r.Group]
	if !ok || r.CommandType != events.TypeClaimIP {
		return
	}
	if _, seen := c.results[r.CommandID]; !seen {
		if len(c.resultOrder) == maxResults {
			delete(c.results, c.resultOrder[0])
			c.resultOrder = c.resultOrder[1:]
		}
		c.resultOrder = append(c.resultOrder, r.CommandID)
	}
	c.results[r.CommandID] = claimResult{node: r.Node, outcome: r.Outcome}
	if !c.leading {
		return
	}
	g := c.groups[gi]
	p := g.pending
	if p == nil || p.cmdID != r.CommandID || p.node != r.Node {
		return // a late answer to a claim already given up (and released)
	}
	switch r.Outcome {
	case events.OutcomeApplied, events.OutcomeDuplicate:
		g.holder, g.pending = r.Node, nil
		clear(g.failed)
		g.situation, g.reason = "", ""
		// The new holder may already be down: evaluate once more.
		c.touch(gi)
	default:
		why := fmt.Sprintf("claim on %s %s", r.Node, r.Outcome)
		if r.Error != "" {
			why += ": " + r.Error
		}
		c.retry(g, now, why, []ref{envRef(env), {id: p.cmdID, corr: p.corr}}, out)
	}
}

func (c *Core) onPermit(env events.Envelope, p events.FailbackPermit) {
	gi, ok := c.byName[p.Group]
	if !ok {
		return
	}
	g := c.groups[gi]
	// The scheduler restates an open window's permit on every tick: keep
	// the first event as the cause while the window is the same, so a
	// failback cites the permit that opened it.
	if old := g.permit; old != nil && old.window == p.Window && old.until.Equal(p.ValidUntil) && !p.ValidFrom.Before(old.from) {
		return
	}
	g.permit = &permit{window: p.Window, from: p.ValidFrom, until: p.ValidUntil, cause: envRef(env)}
	c.touch(gi)
}

// onReplication records the last pass per (source, target, tree). Only
// the time of receipt matters for "after the last move", on the arbiter's
// own clock, so a replicator's clock cannot make an old pass look new.
func (c *Core) onReplication(now time.Time, env events.Envelope, r events.ReplicationStatus) {
	if c.nodes[r.Node] == nil || c.nodes[r.Peer] == nil {
		return
	}
	k := replKey{r.Node, r.Peer, r.Tree}
	c.repl[k] = &replReport{caughtUp: r.CaughtUp && r.Error == "", at: now, cause: envRef(env)}
	c.touchNode(r.Peer)
}
