package app

import (
	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/services/prober/internal/check"
	"github.com/prometheus/client_golang/prometheus"
)

// checkMetrics exports each check's runs for dashboards and alerts: how
// long each run took, the failures by error class, and the judged state of
// every check and quorum group (read from the service at scrape time).
type checkMetrics struct {
	s        *Service
	duration *prometheus.HistogramVec
	runs     *prometheus.CounterVec
	failures *prometheus.CounterVec
	state    *prometheus.Desc
}

func newCheckMetrics(s *Service, r prometheus.Registerer) *checkMetrics {
	m := &checkMetrics{s: s,
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "fan_prober_check_duration_seconds",
			Help:    "How long each run of a check took, successful or not.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5}}, []string{"check", "target_node"}),
		runs: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fan_prober_check_runs_total",
			Help: "Runs of each check that reached a verdict."}, []string{"check", "target_node"}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fan_prober_check_failures_total",
			Help: "Failed runs of each check, by error class (timeout, refused, auth, protocol, other...)."}, []string{"check", "target_node", "class"}),
		state: prometheus.NewDesc("fan_prober_check_state",
			"1 for the state each check and quorum group is judged in (up, down, unknown), 0 for the others.",
			[]string{"check", "target_node", "role", "state"}, nil),
	}
	for _, cc := range s.cfg.Checks {
		m.runs.WithLabelValues(cc.Name, cc.TargetNode)
	}
	r.MustRegister(m.duration, m.runs, m.failures, m)
	return m
}

// checkObserver records one check's runs. Its series are looked up once:
// a label look-up hashes every label value, and at a thousand runs a
// second that was about a twentieth of the prober's CPU.
type checkObserver struct {
	duration prometheus.Observer
	runs     prometheus.Counter
	failures *prometheus.CounterVec // curried with the check's labels; by class
}

// forCheck returns cc's observer (a nil one records nothing).
func (m *checkMetrics) forCheck(cc CheckConfig) *checkObserver {
	if m == nil {
		return nil
	}
	labels := prometheus.Labels{"check": cc.Name, "target_node": cc.TargetNode}
	return &checkObserver{
		duration: m.duration.With(labels),
		runs:     m.runs.With(labels),
		failures: m.failures.MustCurryWith(labels),
	}
}

// observe records one run that reached a verdict.
func (o *checkObserver) observe(r check.Result) {
	if o == nil {
		return
	}
	o.duration.Observe(r.Duration.Seconds())
	o.runs.Inc()
	if !r.OK {
		o.failures.WithLabelValues(string(r.Class)).Inc()
	}
}

func (m *checkMetrics) Describe(ch chan<- *prometheus.Desc) { ch <- m.state }

func (m *checkMetrics) Collect(ch chan<- prometheus.Metric) {
	m.s.mu.Lock()
	states := make(map[string]events.CheckState, len(m.s.states))
	for k, v := range m.s.states {
		states[k] = v
	}
	m.s.mu.Unlock()
	for name, st := range states {
		for _, h := range []events.Health{events.HealthUp, events.HealthDown, events.HealthUnknown} {
			v := 0.0
			if st.Health == h {
				v = 1
			}
			ch <- prometheus.MustNewConstMetric(m.state, prometheus.GaugeValue, v, name, st.TargetNode, string(st.Role), string(h))
		}
	}
}
