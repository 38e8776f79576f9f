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
//
// # Leaders holds
//
// Before work on a chosen server (a reboot of the witness) an operator
// holds the leaders (fanctl leaders hold, events.LeadersHoldRecord): while
// a hold is in force the steward moves no leader back to the chosen
// servers; it moves them onto the hold's server when it names one, and
// otherwise leaves them where they are. A hold ends at its end, when an
// operator releases it, or when the steward breaks it: only when keeping it
// would cost a failover, in one of two cases it can see (breakWhy):
//   - the arbiter leader cannot store its state or its commands (Trouble
//     says why): a decision could not be carried out, and a leader on a
//     healthy chosen server may be what lets it be;
//   - a raft group fan writes to (a stream, the executors' consumers, the
//     meta group) has had no leader for BreakAfter, longer than any
//     election takes: its leader's server is down and no election happens,
//     so nothing it stores (the lease, a command, a result) is stored.
//
// It then sweeps at once with the chosen servers again.
package steward

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
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
	// DefaultBreakAfter is how long a raft group may go without a leader
	// during a hold before the steward ends the hold: more than
	// nats-server's longest election (its timers run 4 to 9 s).
	DefaultBreakAfter = 10 * time.Second
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
	// Hold reports the leaders hold in force (zero: none).
	Hold func() Hold
	// Trouble says why the arbiter leader cannot store its state or its
	// commands now; "" while it can.
	Trouble func() string
	// Break ends the hold id because keeping it would cost a failover; why
	// says which case. The steward acts as if the hold had ended from then
	// on, whatever Hold still reports.
	Break func(id, why string)
	// BreakAfter is how long a raft group may have no leader during a
	// hold before the steward breaks it (default DefaultBreakAfter).
	BreakAfter time.Duration
}

// Hold is a leaders hold as the steward obeys it.
type Hold struct {
	// ID names the hold (its start's event id); empty: no hold.
	ID string
	// Server is where the leaders are kept meanwhile; empty: where they are.
	Server string
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
	// leaderless: the groups seen without a leader, since when (in an
	// unbroken run of sweeps).
	leaderless map[string]time.Time
	// broken is the hold the steward broke: obeyed no more.
	broken string
	breaks prometheus.Counter
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
	if cfg.Hold == nil {
		cfg.Hold = func() Hold { return Hold{} }
	}
	if cfg.Trouble == nil {
		cfg.Trouble = func() string { return "" }
	}
	if cfg.Break == nil {
		cfg.Break = func(string, string) {}
	}
	if cfg.BreakAfter <= 0 {
		cfg.BreakAfter = DefaultBreakAfter
	}
	return &Steward{cfg: cfg, nc: nc, js: js, sys: sys, log: log.With("component", "steward"), last: map[string]time.Time{},
		leaderless: map[string]time.Time{},
		breaks: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fan_arbiter_leaders_hold_breaks_total",
			Help: "Leaders holds the steward ended early because keeping them would cost a failover.",
		}),
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
	return []prometheus.Collector{s.moves, s.checks, s.breaks}
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
	lastHold := Hold{}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-kick:
		case <-poll.C:
			leading := s.cfg.Leading()
			became := leading && !wasLeading
			wasLeading = leading
			// A hold that begins or ends is obeyed at once: a release must
			// not leave the leaders where they are for another sweep.
			hold := s.hold()
			changed := hold != lastHold
			lastHold = hold
			if leading && hold.ID != "" {
				if why := s.cfg.Trouble(); why != "" {
					s.breakHold(hold, "the arbiter leader cannot store its state or its commands ("+why+")")
					changed = true
				}
			}
			if !became && !changed && time.Since(lastSweep) < s.cfg.SweepEvery {
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

// hold is the hold the steward obeys: the one in force, unless it broke it.
func (s *Steward) hold() Hold {
	h := s.cfg.Hold()
	s.mu.Lock()
	defer s.mu.Unlock()
	if h.ID != "" && h.ID == s.broken {
		return Hold{}
	}
	return h
}

// breakHold ends h, once.
func (s *Steward) breakHold(h Hold, why string) {
	s.mu.Lock()
	if s.broken == h.ID {
		s.mu.Unlock()
		return
	}
	s.broken = h.ID
	s.mu.Unlock()
	s.breaks.Inc()
	s.log.Warn("leaders hold broken", "hold", h.ID, "why", why)
	s.cfg.Break(h.ID, why)
}

// raftGroup is one group as a sweep found it.
type raftGroup struct {
	kind, name, subject string
	ci                  *jetstream.ClusterInfo
	// err says why its leader could not be read; nil with ci.Leader
	// empty is an election under way.
	err error
}

// Sweep checks every group once and asks those led from elsewhere to move
// (during a hold, onto the hold's server only). It reports how many
// step-downs were accepted.
func (s *Steward) Sweep(ctx context.Context) int {
	s.checks.Inc()
	groups := s.groups(ctx)
	now := time.Now()
	s.track(groups, now)
	preferred := s.cfg.LeaderServers
	if h := s.hold(); h.ID != "" {
		if why := s.breakWhy(now); why != "" {
			s.breakHold(h, why)
		} else {
			preferred = nil
			if h.Server != "" {
				preferred = []string{h.Server}
			}
		}
	}
	moved := 0
	for _, g := range groups {
		if g.err == nil && s.check(ctx, g.kind, g.name, g.ci, g.subject, preferred) {
			moved++
		}
	}
	return moved
}

// groups reads the leader of every group: each stream, each replicated
// consumer on it and, with the system account, the meta group.
func (s *Steward) groups(ctx context.Context) []raftGroup {
	var out []raftGroup
	for _, name := range s.cfg.Streams {
		ictx, cancel := context.WithTimeout(ctx, 2*time.Second)
		st, err := s.js.Stream(ictx, name)
		if err != nil {
			cancel()
			switch {
			case errors.Is(err, jetstream.ErrStreamNotFound):
				// Not provisioned on this bus (an object store of a
				// cluster without replicators): nothing to lead.
			case errors.Is(err, context.Canceled):
			default:
				s.log.Debug("stream info unavailable", "stream", name, "err", err)
				out = append(out, raftGroup{kind: "stream", name: name, err: err})
			}
			continue
		}
		out = append(out, raftGroup{kind: "stream", name: name, ci: st.CachedInfo().Cluster, subject: events.JSStreamLeaderStepDownSubject(name)})
		lister := st.ListConsumers(ictx)
		for ci := range lister.Info() {
			out = append(out, raftGroup{kind: "consumer", name: name + "/" + ci.Name, ci: ci.Cluster,
				subject: events.JSConsumerLeaderStepDownSubject(name, ci.Name)})
		}
		if err := lister.Err(); err != nil && !errors.Is(err, context.Canceled) {
			s.log.Debug("consumer list incomplete", "stream", name, "err", err)
		}
		cancel()
	}
	if s.sys != nil {
		ci, err := s.metaCluster(ctx)
		if err != nil {
			s.log.Debug("meta group info unavailable", "err", err)
		}
		out = append(out, raftGroup{kind: "meta", name: metaGroup, ci: ci, subject: events.JSMetaLeaderStepDownSubject, err: err})
	}
	return out
}

// track notes which groups have no leader now, and since when. A group
// whose leader could not be read while this replica's own connection was
// down says nothing about the group.
func (s *Steward) track(groups []raftGroup, now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	seen := map[string]bool{}
	for _, g := range groups {
		key := g.kind + " " + g.name
		seen[key] = true
		switch leaderless := g.err != nil || g.ci == nil || g.ci.Leader == ""; {
		case leaderless && g.err != nil && !s.nc.IsConnected():
		case leaderless:
			if _, ok := s.leaderless[key]; !ok {
				s.leaderless[key] = now
			}
		default:
			delete(s.leaderless, key)
		}
	}
	for key := range s.leaderless {
		if !seen[key] {
			delete(s.leaderless, key)
		}
	}
}

// breakWhy says why the hold in force must end, or "": groups without a
// leader for BreakAfter (the other case, Trouble, is checked on every
// poll). It names the first of them, streams before consumers and the meta
// group, the command stream (the lease, the commands) first of all.
func (s *Steward) breakWhy(now time.Time) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var long []string
	var longest time.Duration
	for key, t := range s.leaderless {
		if d := now.Sub(t); d >= s.cfg.BreakAfter {
			long = append(long, key)
			longest = max(longest, d)
		}
	}
	if len(long) == 0 {
		return ""
	}
	// The groups a server took with it lose their leader one by one, as
	// each notices it has lost its majority: the first to have been without
	// one for BreakAfter ends the hold, and the others without a leader yet
	// are counted with it.
	others := len(s.leaderless) - 1
	rank := func(key string) string {
		switch {
		case key == "stream "+events.CommandsStream:
			return "0"
		case strings.HasPrefix(key, "stream "):
			return "1" + key
		case strings.HasPrefix(key, "consumer "):
			return "2" + key
		}
		return "3" + key
	}
	slices.SortFunc(long, func(a, b string) int { return strings.Compare(rank(a), rank(b)) })
	first := long[0]
	if first == "meta "+metaGroup {
		first = "the meta group"
	}
	more := ""
	switch {
	case others == 1:
		more = " (and 1 other raft group without a leader now)"
	case others > 1:
		more = fmt.Sprintf(" (and %d other raft groups without a leader now)", others)
	}
	return fmt.Sprintf("%s%s has had no leader for %s, longer than an election takes: its leader's server is down and no election happens, "+
		"so what it stores (the lease, commands, results) is not stored", first, more, longest.Round(time.Second))
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

// check asks one group to move onto preferred when Target says so, at
// most once per MinGap.
func (s *Steward) check(ctx context.Context, kind, group string, ci *jetstream.ClusterInfo, subject string, preferred []string) bool {
	to := Target(preferred, ci)
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
