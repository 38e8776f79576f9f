package notify

import (
	"slices"
	"sync"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
)

// Group is what the mapper needs of one of the arbiter's groups: which
// nodes it has and which checks it decides on.
type Group struct {
	Name  string
	Nodes []string
	// HealthCheck is the self check that makes a member eligible.
	HealthCheck string
	// PeerChecks count as evidence about a silent holder (nil: every one).
	PeerChecks []string
	// HealthFrom names, for a member without a prober, the observer and
	// its check that decide the member's health.
	HealthFrom map[string]HealthSource
	// Holder is the group's holder when the notifier starts, if known
	// (the group status the leader keeps), until the events say otherwise.
	Holder string
}

// HealthSource is one HealthFrom entry.
type HealthSource struct{ Observer, Check string }

// Subjects are what the notifier reads from the audit stream: decisions
// (reasons, needs-human), the sourced copies of claims (previous holder,
// term), executors' results (a claim applied is a holder change), health
// transitions, pins, leaders holds and planned moves' stages.
func Subjects(cluster string) []string {
	return []string{
		events.DecisionSubject(cluster, "*"),
		events.CommandSubject(cluster, "*", events.VerbClaim),
		events.AllCommandResults(cluster),
		events.AllHealth(cluster),
		events.PinSubject(cluster, "*"),
		events.LeadersHoldSubject(cluster),
		events.PlannedMoveSubject(cluster, "*"),
	}
}

// memoSize bounds what the mapper remembers of decisions and claims: a
// claim's result arrives within its timeout, a few at most per group.
const memoSize = 1024

// decisionWait is how long a holder change waits for the decision behind
// it (its reason) when the executor's result is read first: the arbiter
// publishes the claim at once and the decision through its outbox, so a
// fast executor's result can be stored ahead of the decision.
const decisionWait = 2 * time.Second

// Mapper turns the audit stream's events into the events hooks are told
// of. It keeps what it needs across events (the holder of each group, the
// claims and decisions a result refers to), bounded; it does no I/O.
type Mapper struct {
	mu      sync.Mutex
	now     func() time.Time
	cluster string
	groups  map[string]*groupInfo
	order   []string
	epoch   uint64
	// claims and decisions by command id.
	claims    *memo[claimInfo]
	decisions *memo[decisionInfo]
	// waiting are holder changes read before their decision, by claim id.
	waiting map[string]waitingChange
}

type waitingChange struct {
	ev    Event
	until time.Time
}

type groupInfo struct {
	Group
	nodes  map[string]bool
	peers  map[string]bool // nil: every peer check
	holder string          // confirmed holder, as read
	last   string          // the holder before it released, while none holds
}

type claimInfo struct {
	previous string
	epoch    uint64
	decision string
}

type decisionInfo struct {
	id     string
	reason string
	action events.Action
	from   string
}

// NewMapper maps events of cluster for groups.
func NewMapper(cluster string, groups []Group) *Mapper {
	m := &Mapper{now: time.Now, cluster: cluster, groups: map[string]*groupInfo{}, claims: newMemo[claimInfo](memoSize),
		decisions: newMemo[decisionInfo](memoSize), waiting: map[string]waitingChange{}}
	for _, g := range groups {
		m.groups[g.Name] = &groupInfo{Group: g, nodes: setOf(g.Nodes), peers: setOf(g.PeerChecks), holder: g.Holder}
		m.order = append(m.order, g.Name)
	}
	return m
}

// Handler is Map as a bus.EventHandler feeding offer.
func (m *Mapper) Handler(offer func(Event)) bus.EventHandler {
	return func(env events.Envelope, p events.Decoded, _ uint64) {
		for _, ev := range m.Map(env, p) {
			offer(ev)
		}
	}
}

// Map returns the hook events env reports (often none). p is in its decoded
// form (a pointer, as events.Decode returns it): the switch below matches
// pointers only, and a payload value does not compile here.
func (m *Mapper) Map(env events.Envelope, p events.Decoded) []Event {
	m.mu.Lock()
	defer m.mu.Unlock()
	if env.Cluster != m.cluster {
		return nil
	}
	switch v := p.(type) {
	case *events.ArbiterDecision:
		return m.decision(env, v)
	case *events.ClaimIP:
		m.epoch = max(m.epoch, env.Epoch)
		m.claims.put(env.ID, claimInfo{previous: v.PreviousHolder, epoch: env.Epoch, decision: env.CausationID})
	case *events.CommandResult:
		return m.result(env, v)
	case *events.HealthTransition:
		return m.health(env, v)
	case *events.GroupPin:
		g := m.groups[v.Group]
		if g == nil {
			return nil
		}
		return []Event{{ID: env.ID, Kind: KindPin, Time: env.Time, Cluster: env.Cluster, Group: v.Group, Node: v.Node,
			Holder: g.holder, Epoch: env.Epoch, Reason: v.Why, Stage: string(v.Stage), End: string(v.End), Operator: v.Operator,
			Since: v.Since, Until: v.Until}}
	case *events.LeadersHold:
		return []Event{{ID: env.ID, Kind: KindLeadersHold, Time: env.Time, Cluster: env.Cluster, Epoch: env.Epoch, Reason: v.Why,
			Stage: string(v.Stage), End: string(v.End), Operator: v.Operator, Since: v.Since, Until: v.Until, Server: v.Server}}
	case *events.PlannedMove:
		g := m.groups[v.Group]
		if g == nil {
			return nil
		}
		return []Event{{ID: env.ID, Kind: KindPlanned, Time: env.Time, Cluster: env.Cluster, Group: v.Group, Node: v.From,
			Holder: g.holder, Epoch: env.Epoch, Reason: v.Reason, Stage: string(v.Stage), Operator: v.Operator,
			Since: v.RequestedAt, Until: v.Deadline}}
	}
	return nil
}

func (m *Mapper) decision(env events.Envelope, d *events.ArbiterDecision) []Event {
	m.epoch = max(m.epoch, env.Epoch)
	g := m.groups[d.Group]
	if g == nil {
		return nil
	}
	var out []Event
	for _, c := range d.Commands {
		di := decisionInfo{id: env.ID, reason: d.Reason, action: d.Action, from: d.From}
		m.decisions.put(c, di)
		if w, ok := m.waiting[c]; ok {
			delete(m.waiting, c)
			out = append(out, di.explain(w.ev))
		}
	}
	if !d.NeedsHuman {
		return out
	}
	node := d.To
	if node == "" {
		node = d.From
	}
	return append(out, Event{ID: env.ID, Kind: KindNeedsHuman, Time: env.Time, Cluster: env.Cluster, Group: d.Group, Node: node,
		Holder: g.holder, Epoch: env.Epoch, Reason: d.Reason, Action: d.Action, Decision: env.ID})
}

// explain adds the decision behind a holder change to it.
func (d decisionInfo) explain(ev Event) Event {
	ev.Decision, ev.Reason, ev.Action = d.id, d.reason, d.action
	if ev.Previous == "" && d.action != events.ActionRetry && d.from != ev.Holder {
		// The claim's copy is sourced into the audit stream apart from
		// the result, and may come after it: the decision names the
		// holder it moved the group from.
		ev.Previous = d.from
	}
	return ev
}

// Flush returns the holder changes that waited decisionWait for their
// decision in vain, told without its reason.
func (m *Mapper) Flush() []Event {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now()
	var out []Event
	for id, w := range m.waiting {
		if !now.Before(w.until) {
			delete(m.waiting, id)
			out = append(out, w.ev)
		}
	}
	slices.SortFunc(out, func(a, b Event) int { return a.Time.Compare(b.Time) })
	return out
}

// result makes a claim applied a holder change, and notes a release of the
// holder (so that the next holder change names it as previous).
func (m *Mapper) result(env events.Envelope, r *events.CommandResult) []Event {
	g := m.groups[r.Group]
	if g == nil || r.Outcome != events.OutcomeApplied {
		return nil
	}
	if r.CommandType == events.TypeReleaseIP {
		if g.holder == r.Node {
			g.last, g.holder = g.holder, ""
		}
		return nil
	}
	if r.CommandType != events.TypeClaimIP || g.holder == r.Node {
		// Not a claim, or a second claim applied on the holder (a retry
		// of an unanswered one): nothing changed hands.
		return nil
	}
	ev := Event{ID: env.ID, Kind: KindHolderChange, Time: env.Time, Cluster: env.Cluster, Group: r.Group, Node: r.Node,
		Holder: r.Node, Epoch: env.Epoch}
	prev := g.holder
	if prev == "" {
		prev = g.last
	}
	if cl, ok := m.claims.get(r.CommandID); ok {
		if prev == "" {
			// Read nothing of the group yet (started since): the claim
			// names the holder the arbiter released.
			prev = cl.previous
		}
		ev.Epoch = max(ev.Epoch, cl.epoch)
		ev.Decision = cl.decision
	}
	if prev != r.Node {
		ev.Previous = prev
	}
	if ev.Epoch == 0 {
		// An executor that does not stamp its results: the latest term read.
		ev.Epoch = m.epoch
	}
	g.holder, g.last = r.Node, ""
	m.epoch = max(m.epoch, ev.Epoch)
	if d, ok := m.decisions.get(r.CommandID); ok {
		return []Event{d.explain(ev)}
	}
	if len(m.waiting) >= memoSize {
		return []Event{ev}
	}
	m.waiting[r.CommandID] = waitingChange{ev: ev, until: m.now().Add(decisionWait)}
	return nil
}

// health reports a transition of a check one of the groups decides on:
// a member's own health check, a peer check about a member, or the
// observer's check a member's health is taken from.
func (m *Mapper) health(env events.Envelope, h *events.HealthTransition) []Event {
	observer := env.Source.Node
	var out []Event
	for _, name := range m.order {
		g := m.groups[name]
		if !g.decidesOn(observer, h) {
			continue
		}
		out = append(out, Event{ID: env.ID, Kind: KindHealth, Time: env.Time, Cluster: env.Cluster, Group: name,
			Node: h.TargetNode, Holder: g.holder, Epoch: m.epoch, Reason: h.Reason, Check: h.Check,
			Health: h.To, HealthFrom: h.From, Observer: observer})
	}
	return out
}

func (g *groupInfo) decidesOn(observer string, h *events.HealthTransition) bool {
	if !g.nodes[h.TargetNode] {
		return false
	}
	if hs, ok := g.HealthFrom[h.TargetNode]; ok && hs.Observer == observer && hs.Check == h.Check {
		return true
	}
	switch h.Role {
	case events.RoleSelf:
		return h.Check == g.HealthCheck && observer == h.TargetNode
	case events.RolePeer:
		return g.peers == nil || g.peers[h.Check]
	}
	return false
}

// setOf is the set of xs; nil (meaning "every one" where it is used)
// when xs is empty.
func setOf[K comparable](xs []K) map[K]bool {
	if len(xs) == 0 {
		return nil
	}
	s := make(map[K]bool, len(xs))
	for _, x := range xs {
		s[x] = true
	}
	return s
}

// memo is a map that forgets its oldest entries beyond size.
type memo[V any] struct {
	size  int
	m     map[string]V
	order []string
}

func newMemo[V any](size int) *memo[V] { return &memo[V]{size: size, m: map[string]V{}} }

func (c *memo[V]) put(k string, v V) {
	if _, ok := c.m[k]; !ok {
		c.order = append(c.order, k)
		if len(c.order) > c.size {
			delete(c.m, c.order[0])
			c.order = c.order[1:]
		}
	}
	c.m[k] = v
}

func (c *memo[V]) get(k string) (V, bool) {
	v, ok := c.m[k]
	return v, ok
}
