package keeper

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the keeper's Prometheus series.
type Metrics struct {
	kept            prometheus.Gauge
	adopted         prometheus.Counter
	notAdopted      *prometheus.CounterVec
	ended           *prometheus.CounterVec
	byes            prometheus.Counter
	retransmissions prometheus.Counter
	answered        *prometheus.CounterVec
	unanswered      prometheus.Counter
	sendErrors      prometheus.Counter
	refused         *prometheus.CounterVec
	recordErrors    *prometheus.CounterVec
	captureErrors   prometheus.Counter
	unseen481       prometheus.Counter
	expired         prometheus.Counter
}

// NewMetrics makes the series (registered by the service).
func NewMetrics() *Metrics {
	return &Metrics{
		kept: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "fan_ipmover_calls_kept", Help: "Adopted calls whose dialogs this node keeps now.",
		}),
		adopted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fan_ipmover_calls_adopted_total", Help: "Calls adopted when taking a group.",
		}),
		notAdopted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fan_ipmover_calls_not_adopted_total",
			Help: "Calls recorded for a group taken here and not adopted, by reason (invalid, anchored, incomplete, over_bound).",
		}, []string{"reason"}),
		ended: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fan_ipmover_kept_calls_ended_total",
			Help: "Kept calls ended by a phone, by the record's leg it was on (0, 1) and cause (bye: hung up; request: another in-dialog request).",
		}, []string{"leg", "cause"}),
		byes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fan_ipmover_kept_byes_sent_total", Help: "BYEs sent in kept dialogs (first transmissions).",
		}),
		retransmissions: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fan_ipmover_kept_bye_retransmissions_total", Help: "BYEs sent again on the RFC 3261 timers.",
		}),
		answered: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fan_ipmover_kept_byes_answered_total", Help: "Final answers to kept BYEs, by class (2xx, 4xx, ...).",
		}, []string{"class"}),
		unanswered: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fan_ipmover_kept_byes_unanswered_total", Help: "Kept BYEs given up after 64*T1 without a final answer.",
		}),
		sendErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fan_ipmover_kept_send_errors_total", Help: "BYE transmissions the raw socket refused.",
		}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fan_ipmover_kept_sip_refused_total",
			Help: "Messages on the kept dialogs' capture refused, by reason (malformed, too_large, source: in a kept dialog but not from its phone).",
		}, []string{"reason"}),
		recordErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fan_ipmover_kept_record_errors_total", Help: "Kept records not written to the calls bucket, by operation (put, delete).",
		}, []string{"op"}),
		captureErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fan_ipmover_kept_capture_errors_total", Help: "Captures of kept dialogs that stopped on an error.",
		}),
		unseen481: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fan_ipmover_kept_pbx_answers_unseen_total",
			Help: "Requests that ended a kept call whose PBX answer was not seen on the capture in time; their sender's BYE went anyway.",
		}),
		expired: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fan_ipmover_kept_calls_expired_total",
			Help: "Kept calls ended on both sides at the end of their lifetime (calls.keep_for from their first adoption).",
		}),
	}
}

// Collectors lists the series for registration.
func (m *Metrics) Collectors() []prometheus.Collector {
	return []prometheus.Collector{m.kept, m.adopted, m.notAdopted, m.ended, m.byes, m.retransmissions, m.answered,
		m.unanswered, m.sendErrors, m.refused, m.recordErrors, m.captureErrors, m.unseen481, m.expired}
}

// CountAdoption counts what a claim adopted.
func (m *Metrics) CountAdoption(adopted int, notAdopted map[string]int) {
	m.adopted.Add(float64(adopted))
	for r, n := range notAdopted {
		m.notAdopted.WithLabelValues(r).Add(float64(n))
	}
}
