// Package steward keeps JetStream's raft leaders on the servers an operator
// chose (bus.leader_servers): the leader of each of fan's streams, of every
// durable consumer on them and, with system-account rights, of the meta
// group.
//
// nats-server elects a new raft leader 4 to 9 s after its leader dies (the
// election timeouts are constants), and it cannot pin a leader by
// configuration: placement.preferred is refused in stream and consumer
// configs, and a server that returns never takes its leadership back. What
// it does offer (2.11+) is a leader step-down request that names the server
// to hand over to. The steward sends that request for every group whose
// leader is not one of the chosen servers while a chosen server is a current
// peer of the group: on each leader-elected advisory, on a periodic sweep,
// and as soon as this replica starts leading. A handover to a healthy peer
// takes milliseconds; it is the crash of a leader that costs the election.
//
// Only the arbiter replica holding the lease runs it, so that two replicas
// never argue about a group, and each group is asked at most once per
// MinGap so that a server that keeps refusing is not flooded.
package steward

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
)

// Defaults.
const (
	DefaultSweepEvery = 3 * time.Second
	DefaultMinGap     = 5 * time.Second
	// liveWithin: a peer heard from longer ago than this is not asked to
	// lead. nats-server hands a step-down to another peer when the named one
	// was not heard within three raft heartbeats (3 s), which would move a
	// leader between two servers that are both not chosen.
	liveWithin = 2 * time.Second
)

// metaGroup names the meta group in logs, metrics and rate limits.
const metaGroup = "$meta"

// Config says which groups to keep where.
type Config struct {
	// LeaderServers are the nats-server names that may lead, most
	// preferred first. Empty disables the steward.
	LeaderServers []string
	// Streams are the streams whose raft groups are kept, with every
	// replicated consumer on them.
	Streams []string
	// SweepEvery checks every group this often, in case an advisory was
	// missed (default 3s).
	SweepEvery time.Duration
	// MinGap is the shortest time between two requests for one group
	// (default 5s).
	MinGap time.Duration
	// Leading reports whether this replica may act now (it holds the lease).
	Leading func() bool
}

// Steward moves raft leaders onto the chosen servers.
type Steward struct {
	cfg Config
	nc  *nats.Conn
	js  jetstream.JetStream
	sys *nats.Conn
	log *slog.Logger

	mu     sync.Mutex
	last   map[string]time.Time // group -> last request
	moves  *prometheus.CounterVec
	checks prometheus.Counter
}

// New prepares a steward on the application account's connection nc and,
// when sys is not nil, a system-account connection for the meta group.
func New(cfg Config, nc *nats.Conn, js jetstream.JetStream, sys *nats.Conn, log *slog.Logger) *Steward {
	if cfg.SweepEvery <= 0 {
		cfg.SweepEvery = DefaultSweepEvery
	}
	if cfg.MinGap <= 0 {
		cfg.MinGap = DefaultMinGap
	}
	if cfg.Leading == nil {
		cfg.Leading = func() bool { return true }
	}
	return &Steward{cfg: cfg, nc: nc, js: js, sys: sys, log: log.With("component", "steward"), last: map[string]time.Time{},
		moves: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fan_arbiter_leader_stepdowns_total",
			Help: "Raft leader step-downs the arbiter asked for, by kind (stream, consumer, meta) and outcome (moved, refused).",
		}, []string{"kind", "outcome"}),
		checks: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fan_arbiter_leader_checks_total", Help: "Passes over every raft group's leader.",
		}),
	}
}

// Collectors are the steward's metrics, for the service's registry.
func (s *Steward) Collectors() []prometheus.Collector {
	return []prometheus.Collector{s.moves, s.checks}
}

// Run keeps leaders in place until ctx ends. It does nothing without
// leader servers.
func (s *Steward) Run(ctx context.Context) error {
	if len(s.cfg.LeaderServers) == 0 {
		<-ctx.Done()
		return nil
	}
	// Advisories name the group that just elected; the sweep that follows
	// is cheap (a few info requests), so every advisory triggers one.
	kick := make(chan struct{}, 1)
	poke := func(*nats.Msg) {
		select {
		case kick <- struct{}{}:
		default:
		}
	}
	var subs []*nats.Subscription
	defer func() {
		for _, sub := range subs {
			_ = sub.Unsubscribe()
		}
	}()
	for _, st := range s.cfg.Streams {
		for _, subj := range []string{events.JSStreamLeaderElectedAdvisory(st), events.JSConsumerLeaderElectedAdvisory(st, "*")} {
			sub, err := s.nc.Subscribe(subj, poke)
			if err != nil {
				return fmt.Errorf("steward: subscribe to %s: %w", subj, err)
			}
			subs = append(subs, sub)
		}
	}
	if s.sys != nil {
		sub, err := s.sys.Subscribe(events.JSMetaLeaderElectedAdvisory, poke)
		if err != nil {
			return fmt.Errorf("steward: subscribe to %s: %w", events.JSMetaLeaderElectedAdvisory, err)
		}
		subs = append(subs, sub)
	}
	// Leadership is polled, not pushed, so the steward needs nothing from
	// the lease but its answer; a new leader sweeps within a poll.
	poll := time.NewTicker(250 * time.Millisecond)
	defer poll.Stop()
	var lastSweep time.Time
	wasLeading := false
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-kick:
		case <-poll.C:
			leading := s.cfg.Leading()
			became := leading && !wasLeading
			wasLeading = leading
			if !became && time.Since(lastSweep) < s.cfg.SweepEvery {
				continue
			}
		}
		if !s.cfg.Leading() {
			continue
		}
		s.Sweep(ctx)
		lastSweep = time.Now()
	}
}

// Sweep checks every group once and asks those led from elsewhere to move.
// It reports how many step-downs were accepted.
func (s *Steward) Sweep(ctx context.Context) int {
	s.checks.Inc()
	moved := 0
	for _, name := range s.cfg.Streams {
		ictx, cancel := context.WithTimeout(ctx, 2*time.Second)
		st, err := s.js.Stream(ictx, name)
		if err != nil {
			cancel()
			if !errors.Is(err, context.Canceled) {
				s.log.Debug("stream info unavailable", "stream", name, "err", err)
			}
			continue
		}
		if s.check(ctx, "stream", name, st.CachedInfo().Cluster, events.JSStreamLeaderStepDownSubject(name)) {
			moved++
		}
		lister := st.ListConsumers(ictx)
		for ci := range lister.Info() {
			group := name + "/" + ci.Name
			if s.check(ctx, "consumer", group, ci.Cluster, events.JSConsumerLeaderStepDownSubject(name, ci.Name)) {
				moved++
			}
		}
		if err := lister.Err(); err != nil && !errors.Is(err, context.Canceled) {
			s.log.Debug("consumer list incomplete", "stream", name, "err", err)
		}
		cancel()
	}
	if s.sys != nil {
		if ci, err := s.metaCluster(ctx); err != nil {
			s.log.Debug("meta group info unavailable", "err", err)
		} else if s.check(ctx, "meta", metaGroup, ci, events.JSMetaLeaderStepDownSubject) {
			moved++
		}
	}
	return moved
}

// Target picks the server a group led by leader should move to: the most
// preferred chosen server that is a live, current peer. It returns "" when
// the group should stay: its leader is already a chosen server, it has no
// leader (an election is under way), or no chosen server could take over.
func Target(preferred []string, ci *jetstream.ClusterInfo) string {
	if ci == nil || ci.Leader == "" || slices.Contains(preferred, ci.Leader) {
		return ""
	}
	for _, want := range preferred {
		for _, p := range ci.Replicas {
			if p != nil && p.Name == want && p.Current && !p.Offline && p.Active <= liveWithin {
				return want
			}
		}
	}
	return ""
}

// check asks one group to move when Target says so, at most once per MinGap.
func (s *Steward) check(ctx context.Context, kind, group string, ci *jetstream.ClusterInfo, subject string) bool {
	to := Target(s.cfg.LeaderServers, ci)
	if to == "" {
		return false
	}
	s.mu.Lock()
	if at, ok := s.last[group]; ok && time.Since(at) < s.cfg.MinGap {
		s.mu.Unlock()
		return false
	}
	s.last[group] = time.Now()
	s.mu.Unlock()

	conn := s.nc
	if kind == "meta" {
		conn = s.sys
	}
	err := stepDown(ctx, conn, subject, to)
	if err != nil {
		s.moves.WithLabelValues(kind, "refused").Inc()
		s.log.Warn("leader step-down refused", "kind", kind, "group", group, "from", ci.Leader, "to", to, "err", err)
		return false
	}
	s.moves.WithLabelValues(kind, "moved").Inc()
	s.log.Info("leader step-down", "kind", kind, "group", group, "from", ci.Leader, "to", to)
	return true
}

type stepDownRequest struct {
	Placement struct {
		Preferred string `json:"preferred"`
	} `json:"placement"`
}

type apiResponse struct {
	Success bool `json:"success"`
	Error   *struct {
		Code        int    `json:"code"`
		ErrCode     int    `json:"err_code"`
		Description string `json:"description"`
	} `json:"error"`
}

func stepDown(ctx context.Context, nc *nats.Conn, subject, preferred string) error {
	var req stepDownRequest
	req.Placement.Preferred = preferred
	body, _ := json.Marshal(req)
	rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	m, err := nc.RequestWithContext(rctx, subject, body)
	if err != nil {
		return fmt.Errorf("request %s: %w", subject, err)
	}
	var r apiResponse
	if err := json.Unmarshal(m.Data, &r); err != nil {
		return fmt.Errorf("answer to %s: %w", subject, err)
	}
	if r.Error != nil {
		return fmt.Errorf("%s: %s (err_code %d)", subject, r.Error.Description, r.Error.ErrCode)
	}
	if !r.Success {
		return fmt.Errorf("%s: not successful", subject)
	}
	return nil
}

// metaCluster is the meta group as its leader sees it (only the leader
// knows how recently it heard each peer).
func (s *Steward) metaCluster(ctx context.Context) (*jetstream.ClusterInfo, error) {
	m, err := bus.MetaCluster(ctx, s.sys)
	if err != nil {
		return nil, err
	}
	return m.Cluster, nil
}
