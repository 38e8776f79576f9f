package app

import (
	"github.com/fanpbx/fan/services/arbiter/internal/decide"
	"github.com/prometheus/client_golang/prometheus"
)

// pinMetrics exports what operators asked the decision core to keep: each
// group's pin (fanctl switchover) and its planned move waiting for calls
// to end, from the same snapshot as stateMetrics. The leaders hold is
// holdMetrics' (hold.go).
type pinMetrics struct {
	s                                                         *stateMetrics
	pinned, pinSince, pinUntil, waiting, waitSince, waitUntil *prometheus.Desc
}

func newPinMetrics(s *stateMetrics) *pinMetrics {
	return &pinMetrics{s: s,
		pinned: prometheus.NewDesc("fan_arbiter_group_pinned",
			"1 for the node an operator's switchover pinned the group to (no automatic failback moves it off), 0 for the group's other nodes.",
			[]string{"group", "node"}, nil),
		pinSince: prometheus.NewDesc("fan_arbiter_group_pin_since_timestamp_seconds",
			"When the group's pin began (Unix time; absent without a pin).", []string{"group"}, nil),
		pinUntil: prometheus.NewDesc("fan_arbiter_group_pin_until_timestamp_seconds",
			"When the group's pin ends by itself (Unix time; absent without a pin, or for one that lasts until cleared).", []string{"group"}, nil),
		waiting: prometheus.NewDesc("fan_arbiter_group_planned_waiting",
			"1 while an operator's planned move (switchover, node standby) waits for the holder's calls to end.", []string{"group"}, nil),
		waitSince: prometheus.NewDesc("fan_arbiter_group_planned_since_timestamp_seconds",
			"When the waiting planned move was asked for (Unix time; absent while none waits).", []string{"group"}, nil),
		waitUntil: prometheus.NewDesc("fan_arbiter_group_planned_deadline_timestamp_seconds",
			"When the waiting planned move gives up, or moves anyway with force_after (Unix time; absent while none waits).", []string{"group"}, nil),
	}
}

func (m *pinMetrics) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{m.pinned, m.pinSince, m.pinUntil, m.waiting, m.waitSince, m.waitUntil} {
		ch <- d
	}
}

func (m *pinMetrics) Collect(ch chan<- prometheus.Metric) {
	m.s.mu.Lock()
	st, has := m.s.snap, m.s.has
	m.s.mu.Unlock()
	if !has {
		return
	}
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	for _, g := range st.Groups {
		pinned := ""
		if p := decide.PinStatus(g); p != nil {
			pinned = p.Node
			gauge(m.pinSince, float64(p.Since.UnixMilli())/1000, g.Name)
			if !p.Until.IsZero() {
				gauge(m.pinUntil, float64(p.Until.UnixMilli())/1000, g.Name)
			}
		}
		for _, n := range g.Nodes {
			gauge(m.pinned, b2f(n.Node == pinned), g.Name, n.Node)
		}
		p := g.Planned
		gauge(m.waiting, b2f(p != nil && !p.GaveUp), g.Name)
		if p != nil && !p.GaveUp {
			gauge(m.waitSince, float64(p.RequestedAt.UnixMilli())/1000, g.Name)
			gauge(m.waitUntil, float64(p.Deadline.UnixMilli())/1000, g.Name)
		}
	}
}
