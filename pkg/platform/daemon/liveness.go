package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Loop is one of a service's main loops as the watchdog sees it. The loop
// calls Alive on every turn; if a loop stays silent longer than its bound,
// the process stops pinging systemd's watchdog, /healthz fails and the
// status endpoint names the loop. A loop that ends on purpose calls Done.
//
// Only the loops themselves can prove they turn: a goroutine that pings the
// watchdog on a timer of its own would keep a deadlocked service alive.
type Loop struct {
	name  string
	bound time.Duration
	sup   *supervisor
	last  atomic.Int64 // nanoseconds since sup.base
}

// Alive records one turn of the loop.
func (l *Loop) Alive() { l.last.Store(int64(l.sup.now().Sub(l.sup.base))) }

// Done removes the loop: it ended on purpose (shutdown) and is no longer
// expected to turn.
func (l *Loop) Done() {
	l.sup.mu.Lock()
	defer l.sup.mu.Unlock()
	if l.sup.loops[l.name] == l {
		delete(l.sup.loops, l.name)
	}
}

// LoopStatus is one loop's freshness, as /healthz, the status endpoint and
// the metrics report it.
type LoopStatus struct {
	Name string `json:"name"`
	// SilentSeconds is the time since the loop's last turn.
	SilentSeconds float64 `json:"silent_seconds"`
	// BoundSeconds is the longest silence the loop promised.
	BoundSeconds float64 `json:"bound_seconds"`
	Stale        bool    `json:"stale"`
}

// supervisor is the process-wide part of the daemon: the systemd notifier,
// the registered loops and the reload bookkeeping. Run creates one and hands
// it to the Runtime through the context, because the watchdog must tick
// before the bus is up (a slow bus is not a hung process) and SIGHUP may
// arrive at any time.
type supervisor struct {
	notify *Notifier
	log    *slog.Logger
	now    func() time.Time
	base   time.Time

	mu      sync.Mutex
	loops   map[string]*Loop
	stale   string // last reported stale set, to report changes only once
	reloads *prometheus.CounterVec
	pings   prometheus.Counter
}

func newSupervisor(n *Notifier, log *slog.Logger) *supervisor {
	s := &supervisor{notify: n, log: log, now: time.Now, loops: map[string]*Loop{},
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fan_reloads_total",
			Help: "SIGHUP reloads by result: applied, restart_needed (some keys need a restart), failed, unsupported.",
		}, []string{"result"}),
		pings: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fan_watchdog_pings_total",
			Help: "WATCHDOG=1 notifications sent to systemd (only while every main loop is fresh).",
		}),
	}
	s.base = s.now()
	return s
}

type supervisorKey struct{}

func withSupervisor(ctx context.Context, s *supervisor) context.Context {
	return context.WithValue(ctx, supervisorKey{}, s)
}

// supervisorFrom returns Run's supervisor, or a silent one for a Runtime
// started without Run (tests, tools).
func supervisorFrom(ctx context.Context, log *slog.Logger) *supervisor {
	if s, ok := ctx.Value(supervisorKey{}).(*supervisor); ok {
		return s
	}
	return newSupervisor(&Notifier{}, log)
}

func (s *supervisor) loop(name string, bound time.Duration) *Loop {
	if bound <= 0 {
		panic(fmt.Sprintf("daemon: loop %q needs a positive silence bound", name))
	}
	l := &Loop{name: name, bound: bound, sup: s}
	l.Alive()
	s.mu.Lock()
	s.loops[name] = l
	s.mu.Unlock()
	return l
}

// loopStatus reports every registered loop, sorted by name.
func (s *supervisor) loopStatus() []LoopStatus {
	now := s.now().Sub(s.base)
	s.mu.Lock()
	out := make([]LoopStatus, 0, len(s.loops))
	for _, l := range s.loops {
		silent := now - time.Duration(l.last.Load())
		out = append(out, LoopStatus{Name: l.name, SilentSeconds: silent.Seconds(), BoundSeconds: l.bound.Seconds(), Stale: silent > l.bound})
	}
	s.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

func staleNames(ls []LoopStatus) []string {
	var names []string
	for _, l := range ls {
		if l.Stale {
			names = append(names, l.Name)
		}
	}
	return names
}

// watchdogTick pings the watchdog if every loop is fresh and reports the
// change when the set of stale loops changes. It returns whether it pinged.
func (s *supervisor) watchdogTick() bool {
	stale := staleNames(s.loopStatus())
	key := strings.Join(stale, ",")
	s.mu.Lock()
	changed := key != s.stale
	s.stale = key
	s.mu.Unlock()
	if len(stale) > 0 {
		if changed {
			s.log.Error("main loop silent: withholding the watchdog so systemd restarts the service", "stale_loops", stale)
			s.send("STATUS=watchdog withheld: silent loops " + key)
		}
		return false
	}
	if changed {
		s.log.Info("all main loops alive again: watchdog resumed")
		s.send("STATUS=running")
	}
	if s.send(NotifyWatchdog) {
		s.pings.Inc()
	}
	return true
}

// runWatchdog ticks at half the manager's watchdog timeout until ctx ends.
func (s *supervisor) runWatchdog(ctx context.Context) {
	iv := s.notify.WatchdogInterval()
	if iv <= 0 {
		return
	}
	t := time.NewTicker(iv / 2)
	defer t.Stop()
	s.watchdogTick()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.watchdogTick()
		}
	}
}

func (s *supervisor) send(state ...string) bool {
	if !s.notify.Enabled() {
		return false
	}
	if err := s.notify.Send(state...); err != nil {
		s.log.Warn("sd_notify failed", "err", err)
		return false
	}
	return true
}

// loopCollector exports each loop's silence so a dashboard can alert on a
// stuck loop before the watchdog restarts the service.
type loopCollector struct {
	sup    *supervisor
	silent *prometheus.Desc
	stale  *prometheus.Desc
}

func newLoopCollector(s *supervisor) *loopCollector {
	return &loopCollector{sup: s,
		silent: prometheus.NewDesc("fan_loop_silent_seconds", "Time since the main loop's last turn.", []string{"loop"}, nil),
		stale:  prometheus.NewDesc("fan_loop_stale", "1 when the main loop has been silent longer than its bound.", []string{"loop"}, nil),
	}
}

func (c *loopCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.silent; ch <- c.stale }

func (c *loopCollector) Collect(ch chan<- prometheus.Metric) {
	for _, l := range c.sup.loopStatus() {
		stale := 0.0
		if l.Stale {
			stale = 1
		}
		ch <- prometheus.MustNewConstMetric(c.silent, prometheus.GaugeValue, l.SilentSeconds, l.Name)
		ch <- prometheus.MustNewConstMetric(c.stale, prometheus.GaugeValue, stale, l.Name)
	}
}
