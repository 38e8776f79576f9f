package app

import (
	"sync"
	"sync/atomic"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/services/arbiter/internal/decide"
	"github.com/prometheus/client_golang/prometheus"
)

// stateMetrics exports what the arbiter knows and does, for dashboards and
// the alert rules in deploy/prometheus. Gauges are read at scrape time from
// the last snapshot the decision loop published (the core belongs to the
// loop alone); counters move where the loop acts. Only the replica that
// commands counts decisions and claim outcomes, so a sum over replicas is
// the cluster's count; every replica exports the gauges from its own view.
type stateMetrics struct {
	commanding atomic.Bool
	mu         sync.Mutex
	snap       decide.State
	has        bool

	decisions *prometheus.CounterVec
	failovers *prometheus.CounterVec
	failbacks *prometheus.CounterVec
	claims    *prometheus.CounterVec

	leader, epoch, held, holder, lastMove, needsHuman, frozen, permitOpen, nodeSilent, nodeHeard, nodeEligible, nodeHealthy *prometheus.Desc
}

func newStateMetrics(r prometheus.Registerer, groups []string) *stateMetrics {
	m := &stateMetrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fan_arbiter_decisions_total",
			Help: "Decisions this replica published while commanding, by group and action (place, failover, failback, switchover, retry, hold)."},
			[]string{"group", "action"}),
		failovers: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fan_arbiter_failovers_total",
			Help: "Failover decisions (the holder lost, the group moved to another node), by group."}, []string{"group"}),
		failbacks: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fan_arbiter_failbacks_total",
			Help: "Failback decisions (back to a preferred node, inside a permit or by an operator), by group."}, []string{"group"}),
		claims: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fan_arbiter_claim_results_total",
			Help: "Results of claim commands received while commanding, by group and outcome (applied, duplicate, stale_epoch, expired, failed)."},
			[]string{"group", "outcome"}),
		leader: prometheus.NewDesc("fan_arbiter_leader", "1 while this replica holds the lease and commands.", nil, nil),
		epoch:  prometheus.NewDesc("fan_arbiter_epoch", "The lease term this replica last knew (the epoch commands carry).", nil, nil),
		held: prometheus.NewDesc("fan_arbiter_group_held",
			"1 while the group has a confirmed holder, 0 while nobody answers on its addresses.", []string{"group"}, nil),
		holder: prometheus.NewDesc("fan_arbiter_group_holder",
			"1 for the node holding the group, 0 for its other nodes.", []string{"group", "node"}, nil),
		lastMove: prometheus.NewDesc("fan_arbiter_group_last_move_timestamp_seconds",
			"When the group last moved (Unix time; absent before its first move): time() minus it is the time since.", []string{"group"}, nil),
		needsHuman: prometheus.NewDesc("fan_arbiter_group_needs_human",
			"1 while the group's standing hold asks for a human (fanctl status says why).", []string{"group"}, nil),
		frozen: prometheus.NewDesc("fan_arbiter_group_frozen",
			"1 while no automatic move is allowed (maintenance, the flap cap).", []string{"group"}, nil),
		permitOpen: prometheus.NewDesc("fan_arbiter_failback_permit_open",
			"1 while a failback permit from the scheduler is in force for the group.", []string{"group"}, nil),
		nodeSilent: prometheus.NewDesc("fan_arbiter_node_silent",
			"1 while the node is silent (no heartbeat or presence beacon within the silence bound).", []string{"group", "node"}, nil),
		nodeHeard: prometheus.NewDesc("fan_arbiter_node_last_heard_timestamp_seconds",
			"When the arbiter last heard the node (Unix time; absent if never).", []string{"group", "node"}, nil),
		nodeEligible: prometheus.NewDesc("fan_arbiter_node_eligible",
			"1 while the node could take the group now: its health check up, heard, not in standby, not just failed a claim.",
			[]string{"group", "node"}, nil),
		nodeHealthy: prometheus.NewDesc("fan_arbiter_node_healthy",
			"1 while the group's health check is up on the node (as its own prober, or its health_from observer, reports).",
			[]string{"group", "node"}, nil),
	}
	// Zero series from the start, so rate() and increase() see the first one.
	for _, g := range groups {
		m.failovers.WithLabelValues(g)
		m.failbacks.WithLabelValues(g)
	}
	r.MustRegister(m.decisions, m.failovers, m.failbacks, m.claims, m)
	return m
}

// publish records the core's latest view for the next scrape.
func (m *stateMetrics) publish(st decide.State, commanding bool) {
	if m == nil {
		return
	}
	m.commanding.Store(commanding)
	m.mu.Lock()
	m.snap, m.has = st, true
	m.mu.Unlock()
}

// decided counts a decision the commanding replica published.
func (m *stateMetrics) decided(d events.ArbiterDecision) {
	if m == nil {
		return
	}
	m.decisions.WithLabelValues(d.Group, string(d.Action)).Inc()
	switch d.Action {
	case events.ActionFailover:
		m.failovers.WithLabelValues(d.Group).Inc()
	case events.ActionFailback:
		m.failbacks.WithLabelValues(d.Group).Inc()
	}
}

// observed counts claim results arriving while this replica commands.
func (m *stateMetrics) observed(p events.Payload, commanding bool) {
	if m == nil {
		return
	}
	if r, ok := p.(*events.CommandResult); ok && commanding && r.CommandType == events.TypeClaimIP {
		m.claims.WithLabelValues(r.Group, string(r.Outcome)).Inc()
	}
}

func (m *stateMetrics) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{m.leader, m.epoch, m.held, m.holder, m.lastMove, m.needsHuman, m.frozen, m.permitOpen,
		m.nodeSilent, m.nodeHeard, m.nodeEligible, m.nodeHealthy} {
		ch <- d
	}
}

func (m *stateMetrics) Collect(ch chan<- prometheus.Metric) {
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	gauge(m.leader, b2f(m.commanding.Load()))
	m.mu.Lock()
	st, has := m.snap, m.has
	m.mu.Unlock()
	if !has {
		return
	}
	gauge(m.epoch, float64(st.Epoch))
	for _, g := range st.Groups {
		gauge(m.held, b2f(g.Holder != ""), g.Name)
		if !g.LastMove.IsZero() {
			gauge(m.lastMove, float64(g.LastMove.UnixMilli())/1000, g.Name)
		}
		gauge(m.needsHuman, b2f(g.NeedsHuman), g.Name)
		gauge(m.frozen, b2f(g.Frozen != ""), g.Name)
		gauge(m.permitOpen, b2f(g.Permit != nil && !st.At.Before(g.Permit.ValidFrom) && st.At.Before(g.Permit.ValidUntil)), g.Name)
		for _, n := range g.Nodes {
			gauge(m.holder, b2f(n.Node == g.Holder), g.Name, n.Node)
			gauge(m.nodeSilent, b2f(n.Silent), g.Name, n.Node)
			gauge(m.nodeEligible, b2f(n.Eligible), g.Name, n.Node)
			gauge(m.nodeHealthy, b2f(n.Health == events.HealthUp), g.Name, n.Node)
			if !n.LastHeartbeat.IsZero() {
				gauge(m.nodeHeard, float64(n.LastHeartbeat.UnixMilli())/1000, g.Name, n.Node)
			}
		}
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
