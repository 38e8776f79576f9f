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

	astdbChanges    *prometheus.CounterVec
	astdbDropped    *prometheus.CounterVec
	astdbGaps       *prometheus.CounterVec
	astdbUnreported *prometheus.CounterVec
	astdbHeld       *prometheus.GaugeVec
	astdbHeldTotal  *prometheus.CounterVec
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
		astdbChanges: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fan_replicator_astdb_changes_total",
			Help: "AstDB keys changed by deltas: published by the source, applied by a target, by how the source learned of them (reported, reconciled, polled; unpublished: a delta that could not be sent)."}, []string{"tree", "role", "cause"}),
		astdbDropped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fan_replicator_astdb_events_dropped_total",
			Help: "Asterisk events dropped because the replicator fell behind reading them; each one made a reconcile."}, []string{"tree"}),
		astdbGaps: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fan_replicator_astdb_gaps_total",
			Help: "Times changes may have been missed: events (a new AMI connection or dropped events, on the source), sequence (deltas missed, on a target), apply (a target could not apply a delta); each makes a reconcile."}, []string{"tree", "reason"}),
		astdbUnreported: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fan_replicator_astdb_unreported_total",
			Help: "Registration changes the source's reconcile found that no Asterisk event had reported."}, []string{"tree"}),
		astdbHeld: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "fan_replicator_astdb_deletes_held",
			Help: "On a target: AstDB deletions held back because the holder's manifest lacks more keys than the safety share, unreported and unexpired."}, []string{"tree"}),
		astdbHeldTotal: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fan_replicator_astdb_deletes_held_total",
			Help: "On a target: AstDB keys newly held back from deletion."}, []string{"tree"}),
	}
	if reg != nil {
		reg.MustRegister(m.lag, m.caughtUp, m.source, m.passes, m.duration, m.files, m.bytes, m.conflicts, m.valve, m.direct,
			m.astdbChanges, m.astdbDropped, m.astdbGaps, m.astdbUnreported, m.astdbHeld, m.astdbHeldTotal)
	}
	return m
}
