package calls

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	calls     *prometheus.GaugeVec
	channels  prometheus.Gauge
	recorded  prometheus.Counter
	refused   prometheus.Counter
	writes    *prometheus.CounterVec
	delay     *prometheus.HistogramVec
	dropped   prometheus.Counter
	reconcile *prometheus.CounterVec

	moved        *prometheus.GaugeVec
	hungUp       *prometheus.CounterVec
	hangupErrors prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		calls: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "fan_replicator_calls",
			Help: "Calls (bridges of two channels) this node's Asterisk has up, by state: carriable (direct media, complete record on the bus), anchored, incomplete, unrecorded."}, []string{"state"}),
		channels: prometheus.NewGauge(prometheus.GaugeOpts{Name: "fan_replicator_call_channels",
			Help: "Channels this node's Asterisk has up, as the recorder follows them."}),
		recorded: prometheus.NewCounter(prometheus.CounterOpts{Name: "fan_replicator_calls_recorded_total",
			Help: "Calls whose first record this node stored on the bus."}),
		refused: prometheus.NewCounter(prometheus.CounterOpts{Name: "fan_replicator_calls_refused_total",
			Help: "Calls not recorded because this node already had events.MaxCallsPerNode records (each counted once)."}),
		writes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fan_replicator_call_writes_total",
			Help: "Writes of call records to the bus, by operation (put, delete) and outcome (ok, error)."}, []string{"op", "outcome"}),
		delay: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "fan_replicator_call_record_seconds",
			Help:    "From a call's bridging (answered) or its media going direct (direct) to its record stored on the bus.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 14)}, []string{"since"}),
		dropped: prometheus.NewCounter(prometheus.CounterOpts{Name: "fan_replicator_call_events_dropped_total",
			Help: "Asterisk call events dropped because the recorder fell behind reading them; each made a reconcile."}),
		reconcile: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fan_replicator_call_reconciles_total",
			Help: "Reads of every channel (CoreShowChannels), by cause (start, gap, interval) and outcome (ok, error)."}, []string{"cause", "outcome"}),
		moved: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "fan_replicator_moved_calls",
			Help: "Calls this node's Asterisk still has in a group a move took away, by state: kept (another node keeps them), waiting (none does, or not yet)."}, []string{"state"}),
		hungUp: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fan_replicator_moved_calls_hung_up_total",
			Help: "Calls a move left on this node whose channels it hung up, by reason (ended: at the node that kept them; never_kept: no node kept them within the grace)."}, []string{"reason"}),
		hangupErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: "fan_replicator_moved_call_hangup_errors_total",
			Help: "Hang-ups of a moved call's channels that Asterisk refused or did not answer (retried)."}),
	}
	if reg != nil {
		reg.MustRegister(m.calls, m.channels, m.recorded, m.refused, m.writes, m.delay, m.dropped, m.reconcile,
			m.moved, m.hungUp, m.hangupErrors)
	}
	return m
}
