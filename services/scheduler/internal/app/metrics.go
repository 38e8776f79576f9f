package app

import "github.com/prometheus/client_golang/prometheus"

// windowMetrics exports, per group, whether a failback window is open and
// when the next edge (the open window's end, or the next window's start)
// falls, computed from the schedules at scrape time; and the permits
// published.
type windowMetrics struct {
	s        *Service
	permits  *prometheus.CounterVec
	open     *prometheus.Desc
	nextEdge *prometheus.Desc
}

func newWindowMetrics(s *Service, r prometheus.Registerer) *windowMetrics {
	m := &windowMetrics{s: s,
		permits: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fan_scheduler_permits_total",
			Help: "Failback permits (window ticks) posted for publication, by group."}, []string{"group"}),
		open: prometheus.NewDesc("fan_scheduler_window_open",
			"1 while one of the group's failback windows is open.", []string{"group"}, nil),
		nextEdge: prometheus.NewDesc("fan_scheduler_next_edge_timestamp_seconds",
			"When the group's window state next changes (Unix time): the open window's end, or the next window's start; absent with no window ahead.",
			[]string{"group", "edge"}, nil),
	}
	s.mu.Lock()
	for _, g := range s.cfg.Groups {
		m.permits.WithLabelValues(g.Name)
	}
	s.mu.Unlock()
	r.MustRegister(m.permits, m)
	return m
}

func (m *windowMetrics) permitted(group string) {
	if m != nil {
		m.permits.WithLabelValues(group).Inc()
	}
}

func (m *windowMetrics) Describe(ch chan<- *prometheus.Desc) { ch <- m.open; ch <- m.nextEdge }

func (m *windowMetrics) Collect(ch chan<- prometheus.Metric) {
	for _, g := range m.s.Plan(m.s.now(), "").Groups {
		open := 0.0
		switch {
		case g.Open != nil:
			open = 1
			ch <- prometheus.MustNewConstMetric(m.nextEdge, prometheus.GaugeValue, float64(g.Open.End.UnixMilli())/1000, g.Group, "close")
		case len(g.Windows) > 0:
			ch <- prometheus.MustNewConstMetric(m.nextEdge, prometheus.GaugeValue, float64(g.Windows[0].Start.UnixMilli())/1000, g.Group, "open")
		}
		ch <- prometheus.MustNewConstMetric(m.open, prometheus.GaugeValue, open, g.Group)
	}
}
