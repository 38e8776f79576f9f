package notify

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/prometheus/client_golang/prometheus"
)

// Options are what a Notifier needs besides its configuration.
type Options struct {
	Cluster string
	// Agent is the webhooks' User-Agent (fan-arbiter/<version>).
	Agent string
	// Groups are the arbiter's groups (which checks each decides on).
	Groups []Group
	// Leading reports whether this replica holds the arbiter lease: only
	// then are hooks run. Called from the notifier's goroutines.
	Leading func() bool
	Log     *slog.Logger
	Metrics prometheus.Registerer
}

// recentMax bounds the events a follower keeps for catching up.
const recentMax = 1024

// leadershipPoll is how often the notifier looks at the lease, so that a
// replica that takes it catches up without waiting for the next event,
// and at holder changes that waited for their decision in vain.
const leadershipPoll = 250 * time.Millisecond

// Notifier runs the hooks. Every arbiter replica reads the same events;
// only the one holding the lease runs hooks, so each event is told once
// per term, by the replica deciding, whose groups and checks it knows. A
// follower keeps what happened in the last catch_up (and reads that much
// of the past when it starts); when it takes the lease it runs its hooks
// for those, because the replica that led may have died with them queued
// or running. So a hook hears of an event at least once while the leader
// changes (twice when the old leader had delivered it): the event id is
// the same every time, for receivers to dedupe.
type Notifier struct {
	cfg     Config
	log     *slog.Logger
	leading func() bool
	mapper  *Mapper
	hooks   []*hook
	m       *metrics
	now     func() time.Time

	mu         sync.Mutex
	wasLeading bool
	recent     []Event
}

// New builds a notifier from a validated configuration; it reads each
// webhook's secret.
func New(cfg Config, o Options) (*Notifier, error) {
	n := &Notifier{cfg: cfg, log: o.Log.With("component", "notify"), leading: o.Leading,
		mapper: NewMapper(o.Cluster, o.Groups), m: newMetrics(o.Metrics, cfg.Hooks), now: time.Now}
	client := newClient()
	for i, hc := range cfg.Hooks {
		h := &hook{cfg: hc, kind: kindCommand, max: cfg.Queue, wake: make(chan struct{}, 1)}
		if hc.Webhook != nil {
			secret, err := readSecret(fmt.Sprintf("notify.hooks[%d].webhook.secret_file", i), hc.Webhook.SecretFile)
			if err != nil {
				return nil, err
			}
			h.kind = kindWebhook
			h.wh = &webhook{cfg: *hc.Webhook, secret: secret, client: client, agent: o.Agent, timeout: hc.Timeout.D(),
				retried: n.m.retries.Inc}
		}
		h.groups, h.kinds = setOf(hc.Groups), setOf(hc.Events)
		n.hooks = append(n.hooks, h)
	}
	return n, nil
}

// Run reads the audit stream through watch and runs the hooks until ctx
// ends; it returns the watch's error (nil when ctx ended). Hooks still
// running then are killed, and events still queued are dropped and logged.
func (n *Notifier) Run(parent context.Context, watch func(context.Context, bus.WatchOptions, bus.EventHandler) error) error {
	ctx, cancel := context.WithCancel(parent)
	defer cancel()
	var wg sync.WaitGroup
	for _, h := range n.hooks {
		wg.Go(func() { n.work(ctx, h) })
	}
	wg.Go(func() {
		t := time.NewTicker(leadershipPoll)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				for _, ev := range n.mapper.Flush() {
					n.Offer(ev)
				}
				n.mu.Lock()
				n.sync(n.now())
				n.mu.Unlock()
			}
		}
	})
	// Reading from catch_up ago lets a replica that restarted (or
	// started to succeed one that crashed) tell what it missed meanwhile.
	n.mu.Lock()
	since := n.now().Add(-n.cfg.CatchUp.D())
	n.mu.Unlock()
	err := watch(ctx, bus.WatchOptions{Subjects: Subjects(n.mapper.cluster), Since: since}, n.mapper.Handler(n.Offer))
	cancel()
	wg.Wait()
	if parent.Err() != nil {
		return nil // stopped, not failed
	}
	return err
}

// Offer hands an event to every hook that wants it, or keeps it for
// catching up while this replica follows. It never blocks: a full queue
// drops its oldest event.
func (n *Notifier) Offer(ev Event) {
	n.mu.Lock()
	defer n.mu.Unlock()
	now := n.now()
	if !n.sync(now) {
		n.remember(ev, now)
		return
	}
	n.enqueue(ev)
}

// sync notices a change of leadership; a replica that has just taken the
// lease queues what it read in the last catch_up. Called under n.mu.
func (n *Notifier) sync(now time.Time) bool {
	leading := n.leading()
	if leading && !n.wasLeading {
		caught := 0
		for _, ev := range n.recent {
			if now.Sub(ev.Time) <= n.cfg.CatchUp.D() {
				n.enqueue(ev)
				caught++
			}
		}
		n.recent = nil
		n.log.Info("leading: hooks run here", "caught_up", caught, "catch_up", n.cfg.CatchUp.D().String())
	}
	n.wasLeading = leading
	return leading
}

// remember keeps ev for catching up. The window is measured on the
// events' own times (their producers' clocks), so that events read again
// after a restart count as when they happened, not as just read.
func (n *Notifier) remember(ev Event, now time.Time) {
	drop := 0
	for drop < len(n.recent) && (len(n.recent)-drop >= recentMax || now.Sub(n.recent[drop].Time) > n.cfg.CatchUp.D()) {
		drop++
	}
	n.recent = append(n.recent[drop:], ev)
}

func (n *Notifier) enqueue(ev Event) {
	for _, h := range n.hooks {
		if !h.wants(ev) {
			continue
		}
		if dropped, ok := h.push(ev); ok {
			n.m.dropped.WithLabelValues(h.kind).Inc()
			n.log.Warn("notify queue full: oldest event dropped", "hook", h.cfg.Name, "queue", h.max,
				"dropped_event_id", dropped.ID, "dropped_event", string(dropped.Kind), "group", dropped.Group)
		}
	}
}

// work runs one hook's events, one at a time, in the order read.
func (n *Notifier) work(ctx context.Context, h *hook) {
	for {
		select {
		case <-ctx.Done():
			if left := h.drain(); left > 0 {
				n.log.Warn("notify stopped with events queued", "hook", h.cfg.Name, "dropped", left)
			}
			return
		case <-h.wake:
		}
		for {
			ev, ok := h.pop()
			if !ok || ctx.Err() != nil {
				break
			}
			n.run(ctx, h, ev)
		}
	}
}

// run is one event through one hook, logged and counted.
func (n *Notifier) run(ctx context.Context, h *hook, ev Event) {
	start := time.Now()
	var (
		err    error
		output string
		tries  = 1
	)
	if h.wh != nil {
		tries, err = h.wh.deliver(ctx, ev)
	} else {
		output, err = runCommand(ctx, h.cfg.Command, ev, h.cfg.Timeout.D())
	}
	took := time.Since(start)
	result := resultOK
	switch {
	case err == nil:
	case ctx.Err() != nil:
		result = resultError
	case errors.Is(err, errTimedOut):
		result = resultTimeout
	default:
		result = resultFailed
	}
	n.m.runs.WithLabelValues(h.kind, result).Inc()
	n.m.duration.WithLabelValues(h.kind).Observe(took.Seconds())
	attrs := []any{"hook", h.cfg.Name, "kind", h.kind, "event", string(ev.Kind), "event_id", ev.ID, "group", ev.Group,
		"result", result, "tries", tries, "elapsed_ms", took.Milliseconds()}
	if output != "" {
		attrs = append(attrs, "output", output)
	}
	if err != nil {
		n.log.Warn("notify hook failed", append(attrs, "err", err)...)
		return
	}
	n.log.Info("notify hook ran", attrs...)
}

// Hook kinds (the kind label of the metrics).
const (
	kindCommand = "command"
	kindWebhook = "webhook"
)

// hook is one configured hook and its queue.
type hook struct {
	cfg    HookConfig
	kind   string
	wh     *webhook
	groups map[string]bool // nil: every group
	kinds  map[Kind]bool   // nil: every kind

	mu    sync.Mutex
	queue []Event
	max   int
	wake  chan struct{}
}

// wants reports whether the hook takes ev: a cluster's event (Group
// empty: a leaders hold) reaches it whatever its groups.
func (h *hook) wants(ev Event) bool {
	return (h.groups == nil || ev.Group == "" || h.groups[ev.Group]) && (h.kinds == nil || h.kinds[ev.Kind])
}

// push queues ev, dropping (and returning) the oldest when full.
func (h *hook) push(ev Event) (dropped Event, wasFull bool) {
	h.mu.Lock()
	if len(h.queue) >= h.max {
		dropped, wasFull = h.queue[0], true
		h.queue = h.queue[1:]
	}
	h.queue = append(h.queue, ev)
	h.mu.Unlock()
	select {
	case h.wake <- struct{}{}:
	default:
	}
	return dropped, wasFull
}

func (h *hook) pop() (Event, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.queue) == 0 {
		return Event{}, false
	}
	ev := h.queue[0]
	h.queue = h.queue[1:]
	return ev, true
}

func (h *hook) drain() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := len(h.queue)
	h.queue = nil
	return n
}

type metrics struct {
	runs     *prometheus.CounterVec
	duration *prometheus.HistogramVec
	dropped  *prometheus.CounterVec
	retries  prometheus.Counter
}

func newMetrics(r prometheus.Registerer, hooks []HookConfig) *metrics {
	m := &metrics{
		runs: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fan_notify_runs_total",
			Help: "Events run through a notify hook, by hook kind (command, webhook) and result (ok, failed, timeout, error)."},
			[]string{"kind", "result"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "fan_notify_run_duration_seconds",
			Help:    "How long one event took through a notify hook (a webhook: every try and the waits between), by hook kind.",
			Buckets: []float64{0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300}}, []string{"kind"}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fan_notify_dropped_total",
			Help: "Events dropped unrun because a notify hook's queue was full (the oldest goes), by hook kind."}, []string{"kind"}),
		retries: prometheus.NewCounter(prometheus.CounterOpts{Name: "fan_notify_retries_total",
			Help: "Webhook tries after a first one failed."}),
	}
	// Every series a configured hook can move exists from the start, so
	// an alert on an increase sees the first one.
	for _, h := range hooks {
		kind := kindCommand
		if h.Webhook != nil {
			kind = kindWebhook
		}
		for _, r := range []string{resultOK, resultFailed, resultTimeout, resultError} {
			m.runs.WithLabelValues(kind, r)
		}
		m.duration.WithLabelValues(kind)
		m.dropped.WithLabelValues(kind)
	}
	if r != nil {
		r.MustRegister(m.runs, m.duration, m.dropped, m.retries)
	}
	return m
}
