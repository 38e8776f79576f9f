package replicate

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	lag       *prometheus.GaugeVec
	caughtUp  *prometheus.GaugeVec
	source    *prometheus.GaugeVec
	passes    *prometheus.CounterVec
	duration  *prometheus.HistogramVec
	files     *prometheus.CounterVec
	bytes     *prometheus.CounterVec
	conflicts *prometheus.CounterVec
	valve     *prometheus.CounterVec
	direct    *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		lag: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "fan_replicator_lag_seconds",
			Help: "On the source: time since the oldest change a peer has not confirmed (0 when caught up)."}, []string{"tree", "peer"}),
		caughtUp: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "fan_replicator_caught_up",
			Help: "On the source: 1 when the peer confirmed the latest manifest of the tree."}, []string{"tree", "peer"}),
		source: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "fan_replicator_source",
			Help: "1 while this node is the tree's source (the group's holder in the current epoch)."}, []string{"tree"}),
		passes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fan_replicator_passes_total",
			Help: "Passes by role (source publishes, target applies) and outcome."}, []string{"tree", "role", "outcome"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "fan_replicator_pass_duration_seconds",
			Help: "Duration of passes that changed something.", Buckets: prometheus.ExponentialBuckets(0.001, 2, 16)}, []string{"tree", "role"}),
		files: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fan_replicator_files_total",
			Help: "Files uploaded (source) or written (target)."}, []string{"tree", "role"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fan_replicator_bytes_total",
			Help: "Bytes uploaded (source) or written (target)."}, []string{"tree", "role"}),
		conflicts: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fan_replicator_conflicts_total",
			Help: "Local files a target preserved before replication replaced them."}, []string{"tree"}),
		valve: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fan_replicator_safety_valve_trips_total",
			Help: "Passes refused because they would delete too much."}, []string{"tree"}),
		direct: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fan_replicator_direct_bytes_total",
			Help: "Content bytes sent to peers (served) or received from the holder (fetched) by direct transfer, outside the object store."}, []string{"role"}),
	}
	if reg != nil {
		reg.MustRegister(m.lag, m.caughtUp, m.source, m.passes, m.duration, m.files, m.bytes, m.conflicts, m.valve, m.direct)
	}
	return m
}
