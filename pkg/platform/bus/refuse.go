package bus

import (
	"github.com/fanpbx/fan/pkg/events"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// newRefusedCounter counts the messages this connection's consumers dropped,
// by reason (events.Refused*). A rising subject_mismatch count means someone
// with publish rights on a subject is saying things that subject does not
// allow: the log line names the subject and what the message claimed.
func newRefusedCounter() *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fan_events_refused_total",
		Help: "Messages dropped by this service's consumers because they did not decode or did not match their subject.",
	}, []string{"reason"})
	for _, r := range []string{events.RefusedUndecodable, events.RefusedSubject, events.RefusedNotCommand} {
		c.WithLabelValues(r)
	}
	return c
}

// Refusals is the fan_events_refused_total collector, for the service's
// metrics registry.
func (b *Bus) Refusals() prometheus.Collector { return b.refused }

// RefusedCount reports how many messages were refused for reason (tests
// and status pages).
func (b *Bus) RefusedCount(reason string) float64 {
	var m dto.Metric
	_ = b.refused.WithLabelValues(reason).Write(&m)
	return m.GetCounter().GetValue()
}

// Refuse records a dropped message: one count, and one log line with
// stable keys unless a flood of refusals for the same reason has used up
// its lines (see refusalLog; the next line logged says how many were left
// out). err is what DecodeFrom (or a check of the caller's) returned;
// reason is events.RefusalReason(err) unless the caller knows better.
func (b *Bus) Refuse(reason, subject string, err error, keys ...any) {
	b.refused.WithLabelValues(reason).Inc()
	ok, left := b.refusals.allow(reason)
	if !ok {
		return
	}
	args := append([]any{"reason", reason, "subject", subject, "err", err}, keys...)
	if left > 0 {
		args = append(args, "not_logged_before", left)
	}
	b.log.Warn("message refused", args...)
}

// DecodeFrom decodes a message read on subject and verifies it against its
// subject (events.DecodeFrom), refusing (logged, counted) what does not
// pass. Every reader of fan's streams goes through it, or through Watch and
// ConsumeCommands, which do.
func (b *Bus) DecodeFrom(subject string, data []byte) (events.Envelope, events.Decoded, bool) {
	env, p, err := events.DecodeFrom(subject, data)
	if err != nil {
		b.Refuse(events.RefusalReason(err), subject, err, "event_id", env.ID, "type", env.Type,
			"source_service", env.Source.Service, "source_node", env.Source.Node)
		return env, nil, false
	}
	return env, p, true
}
