package bus

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
)

// ErrOutboxClosed is returned by Post once the outbox drains for shutdown.
var ErrOutboxClosed = errors.New("outbox closed")

// ErrOutboxCommand is returned when a command is posted: commands are fenced
// by the arbiter's lease and expire at their deadline, so retrying them blindly
// is the arbiter's business, not the outbox's.
var ErrOutboxCommand = errors.New("commands are not posted through the outbox")

// OutboxConfig tunes an Outbox; zero values take the defaults.
type OutboxConfig struct {
	// Cap bounds how many events may wait (default 4096). At the cap the
	// oldest waiting event is dropped, counted and logged.
	Cap int
	// Attempt bounds one publish and its acknowledgement (default 500 ms,
	// a hundred times a normal ack). A stream without a leader does not
	// answer at all, so this plus MaxBackoff bounds how late an event is
	// stored after the stream is back: under a heartbeat interval.
	Attempt time.Duration
	// MinBackoff and MaxBackoff space the retries of a failed publish
	// (defaults 10 ms and 250 ms, doubling).
	MinBackoff, MaxBackoff time.Duration
	// OnFull, when set, is told when the outbox starts dropping at its cap
	// (true) and when it has room again (false), e.g. to raise a condition.
	// It is called without the outbox's lock held, from the posting or the
	// publishing goroutine.
	OnFull func(full bool)
}

func (c *OutboxConfig) defaults() {
	if c.Cap <= 0 {
		c.Cap = 4096
	}
	if c.Attempt <= 0 {
		c.Attempt = 500 * time.Millisecond
	}
	if c.MinBackoff <= 0 {
		c.MinBackoff = 10 * time.Millisecond
	}
	if c.MaxBackoff < c.MinBackoff {
		c.MaxBackoff = max(250*time.Millisecond, c.MinBackoff)
	}
}

// Outbox publishes events that must not be lost while JetStream cannot store
// them (a stream electing a leader takes 4 to 9 s, a server restart longer).
// Post queues an event and returns at once; one background loop publishes
// the queue with acknowledgements, retrying each event until the server has
// stored it, or until a newer event posted under the same key supersedes it.
//
// Order: events are stored in the order they were posted, across all keys,
// except that a superseded event is skipped. Each event waits until every
// event posted before it is stored, superseded or dropped; so a consumer
// never sees an older event of a key after a newer one, nor an event before
// one posted earlier by this process. A superseding event takes the place
// of the newest post, not of the one it replaces.
//
// Retries are idempotent: the envelope id is the Nats-Msg-Id, so a publish
// whose acknowledgement was lost and is retried inside the stream's dedupe
// window (two minutes for the audit stream) is stored once. An outage longer
// than that which also loses an acknowledgement may store an event twice;
// fan's consumers treat a repeated event as a no-op.
//
// Memory is bounded by Cap. Keys bound it in practice: a check, a group or a
// heartbeat has at most one event waiting.
type Outbox struct {
	b   *Bus
	cfg OutboxConfig
	log *slog.Logger

	mu     sync.Mutex
	queue  *list.List // of *outboxEntry, oldest first
	byKey  map[string]*list.Element
	wake   chan struct{}
	closed bool
	full   bool
	// idle is closed and replaced whenever the queue empties; Close waits on it.
	idle chan struct{}

	stop chan struct{}
	done chan struct{}

	pending    prometheus.GaugeFunc
	retries    prometheus.Counter
	stored     prometheus.Counter
	superseded prometheus.Counter
	dropped    *prometheus.CounterVec
	fullGauge  prometheus.GaugeFunc
}

type outboxEntry struct {
	key     string
	subject string
	id      string
	typ     events.Type
	data    []byte
	posted  time.Time
	// gone is set when the entry left the queue (superseded or dropped)
	// while the loop was publishing it: a failed attempt is then not retried.
	gone bool
}

// NewOutbox starts an outbox publishing on b. Close drains and stops it.
func NewOutbox(b *Bus, cfg OutboxConfig, log *slog.Logger) *Outbox {
	cfg.defaults()
	o := &Outbox{b: b, cfg: cfg, log: log.With("component", "outbox"), queue: list.New(), byKey: map[string]*list.Element{},
		wake: make(chan struct{}, 1), idle: make(chan struct{}), stop: make(chan struct{}), done: make(chan struct{})}
	close(o.idle)
	o.pending = prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "fan_outbox_pending",
		Help: "Events waiting in the outbox to be stored on JetStream."}, func() float64 { return float64(o.Pending()) })
	o.fullGauge = prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "fan_outbox_full",
		Help: "1 while the outbox is at its cap and drops its oldest events."}, func() float64 {
		if o.Full() {
			return 1
		}
		return 0
	})
	o.retries = prometheus.NewCounter(prometheus.CounterOpts{Name: "fan_outbox_retries_total",
		Help: "Failed publish attempts of outbox events that were retried."})
	o.stored = prometheus.NewCounter(prometheus.CounterOpts{Name: "fan_outbox_stored_total",
		Help: "Outbox events stored on JetStream."})
	o.superseded = prometheus.NewCounter(prometheus.CounterOpts{Name: "fan_outbox_superseded_total",
		Help: "Outbox events never sent because a newer event of the same key replaced them."})
	o.dropped = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fan_outbox_dropped_total",
		Help: "Outbox events given up: full (the cap was reached), refused (the server will never store it), shutdown (still waiting at the drain deadline)."},
		[]string{"reason"})
	go o.run()
	return o
}

// Describe and Collect make the outbox's metrics registrable as one collector.
func (o *Outbox) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range o.collectors() {
		c.Describe(ch)
	}
}

// Collect implements prometheus.Collector.
func (o *Outbox) Collect(ch chan<- prometheus.Metric) {
	for _, c := range o.collectors() {
		c.Collect(ch)
	}
}

func (o *Outbox) collectors() []prometheus.Collector {
	return []prometheus.Collector{o.pending, o.fullGauge, o.retries, o.stored, o.superseded, o.dropped}
}

// Emit posts p without a key (it supersedes nothing and is never
// superseded), in a new envelope from this service. It has Bus.Emit's
// signature so a component can take either; ctx is not used, as posting
// never waits.
func (o *Outbox) Emit(_ context.Context, p events.Payload, opts ...events.Option) (events.Envelope, error) {
	return o.Post("", p, opts...)
}

// Post wraps p in a new envelope from this service and queues it under key;
// see PostEnvelope.
func (o *Outbox) Post(key string, p events.Payload, opts ...events.Option) (events.Envelope, error) {
	if _, ok := p.(events.Command); ok {
		return events.Envelope{}, fmt.Errorf("post %s: %w", p.EventType(), ErrOutboxCommand)
	}
	env, err := events.New(o.b.Source(), o.b.id.Cluster, p, opts...)
	if err != nil {
		return events.Envelope{}, err
	}
	return env, o.PostEnvelope(key, env, p)
}

// PostEnvelope queues a built envelope and returns at once. A waiting event
// posted under the same non-empty key is superseded: it will never be sent.
// The empty key supersedes nothing.
func (o *Outbox) PostEnvelope(key string, env events.Envelope, p events.Payload) error {
	if _, ok := p.(events.Command); ok {
		return fmt.Errorf("post %s %s: %w", env.Type, env.ID, ErrOutboxCommand)
	}
	data, err := env.Encode()
	if err != nil {
		return err
	}
	e := &outboxEntry{key: key, subject: events.Subject(env, p), id: env.ID, typ: env.Type, data: data, posted: time.Now()}
	o.mu.Lock()
	if o.closed {
		o.mu.Unlock()
		return fmt.Errorf("post %s %s: %w", env.Type, env.ID, ErrOutboxClosed)
	}
	if key != "" {
		if old, ok := o.byKey[key]; ok {
			o.removeLocked(old)
			o.superseded.Inc()
		}
	}
	var lost *outboxEntry
	nowFull := false
	if o.queue.Len() >= o.cfg.Cap {
		lost = o.removeLocked(o.queue.Front())
		o.dropped.WithLabelValues("full").Inc()
		if !o.full {
			o.full, nowFull = true, true
		}
	}
	if o.queue.Len() == 0 {
		o.idle = make(chan struct{})
	}
	el := o.queue.PushBack(e)
	if key != "" {
		o.byKey[key] = el
	}
	o.mu.Unlock()
	if nowFull {
		o.log.Error("outbox full: dropping the oldest waiting events until the bus stores again", "cap", o.cfg.Cap)
		if o.cfg.OnFull != nil {
			o.cfg.OnFull(true)
		}
	}
	if lost != nil {
		o.log.Warn("outbox event dropped", "reason", "full", "type", lost.typ, "event_id", lost.id, "waited", time.Since(lost.posted))
	}
	select {
	case o.wake <- struct{}{}:
	default:
	}
	return nil
}

// removeLocked takes an element out of the queue; the entry is marked gone
// in case the loop is publishing it.
func (o *Outbox) removeLocked(el *list.Element) *outboxEntry {
	e := o.queue.Remove(el).(*outboxEntry)
	e.gone = true
	if e.key != "" && o.byKey[e.key] == el {
		delete(o.byKey, e.key)
	}
	if o.queue.Len() == 0 {
		close(o.idle)
	}
	return e
}

// Pending is how many events wait to be stored.
func (o *Outbox) Pending() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.queue.Len()
}

// Full reports whether the outbox dropped an event at its cap since it last
// had room to spare (below half the cap).
func (o *Outbox) Full() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.full
}

// Close stops accepting posts and publishes what waits until the queue is
// empty or ctx ends; what is left then is dropped, counted and logged.
func (o *Outbox) Close(ctx context.Context) error {
	o.mu.Lock()
	if o.closed {
		o.mu.Unlock()
		<-o.done
		return nil
	}
	o.closed = true
	idle := o.idle
	o.mu.Unlock()
	var err error
	select {
	case <-idle:
	case <-ctx.Done():
	}
	close(o.stop)
	<-o.done
	o.mu.Lock()
	n := o.queue.Len()
	for o.queue.Len() > 0 {
		e := o.removeLocked(o.queue.Front())
		o.dropped.WithLabelValues("shutdown").Inc()
		o.log.Warn("outbox event not stored before shutdown", "type", e.typ, "event_id", e.id, "waited", time.Since(e.posted))
	}
	o.mu.Unlock()
	if n > 0 {
		err = fmt.Errorf("outbox: %d events not stored before the shutdown deadline", n)
	}
	return err
}

func (o *Outbox) run() {
	defer close(o.done)
	backoff := o.cfg.MinBackoff
	failing := 0 // consecutive failed attempts, for the log
	var failingSince time.Time
	for {
		o.mu.Lock()
		front := o.queue.Front()
		var e *outboxEntry
		if front != nil {
			e = front.Value.(*outboxEntry)
		}
		o.mu.Unlock()
		if e == nil {
			select {
			case <-o.wake:
				continue
			case <-o.stop:
				return
			}
		}
		err := o.publish(e)
		o.mu.Lock()
		gone := e.gone
		roomAgain := false
		switch {
		case err == nil || permanent(err):
			if !gone {
				o.removeLocked(front)
			}
			if o.full && o.queue.Len() < o.cfg.Cap/2 {
				o.full, roomAgain = false, true
			}
		case !gone:
			o.retries.Inc()
		}
		o.mu.Unlock()
		if roomAgain {
			o.log.Info("outbox has room again", "cap", o.cfg.Cap)
			if o.cfg.OnFull != nil {
				o.cfg.OnFull(false)
			}
		}
		if err == nil {
			o.stored.Inc()
			if failing > 0 {
				o.log.Info("outbox storing again", "failed_attempts", failing, "outage", time.Since(failingSince))
			}
			failing, backoff = 0, o.cfg.MinBackoff
			continue
		}
		if permanent(err) {
			o.dropped.WithLabelValues("refused").Inc()
			o.log.Error("outbox event refused by the server; dropped", "type", e.typ, "event_id", e.id, "err", err)
			continue
		}
		if gone {
			continue // superseded or dropped meanwhile: the next one is tried at once
		}
		if failing == 0 {
			failingSince = time.Now()
			o.log.Warn("outbox publish failed; retrying until stored", "type", e.typ, "event_id", e.id, "err", err)
		}
		failing++
		select {
		case <-time.After(backoff):
		case <-o.stop:
			return
		}
		backoff = min(2*backoff, o.cfg.MaxBackoff)
	}
}

func (o *Outbox) publish(e *outboxEntry) error {
	ctx, cancel := context.WithTimeout(context.Background(), o.cfg.Attempt)
	defer cancel()
	go func() {
		// Shutdown must not wait out a whole attempt.
		select {
		case <-o.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	if _, err := o.b.JS.Publish(ctx, e.subject, e.data, jetstream.WithMsgID(e.id)); err != nil {
		return fmt.Errorf("publish %s %s on %s: %w", e.typ, e.id, e.subject, err)
	}
	return nil
}

// permanent reports errors that no retry can cure: the message itself is
// refused. Anything else (no responders, timeouts, a lost connection, a
// stream that is not there yet) is worth retrying.
func permanent(err error) bool {
	if errors.Is(err, nats.ErrMaxPayload) || errors.Is(err, nats.ErrBadSubject) {
		return true
	}
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		switch apiErr.ErrorCode {
		case jetstream.JSErrCodeStreamMessageExceedsMaximum:
			return true
		}
	}
	return false
}
