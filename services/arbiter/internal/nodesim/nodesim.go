// Package nodesim simulates PBX nodes on a real bus so that the arbiter can
// be measured at a thousand nodes without a thousand hosts. Each simulated
// node has its own bus connection and outbox and speaks the prober's wire
// protocol as the prober does: a heartbeat carrying its check's state every
// second and a health transition when the check crosses over, both posted
// to its outbox (JetStream, Nats-Msg-Id), and a presence beacon every
// 100 ms on core NATS. Its executor's side is one consumer of the command
// stream that answers every command at once with a command result posted
// from the target node, caused by the command, as an executor does.
//
// Every subject and event is built by pkg/events, so what the arbiter
// reads is exactly what it reads from real nodes. What the nodes do not
// simulate: probe results (live state the arbiter does not read), peer
// checks (no node falls silent here), the time an executor takes.
package nodesim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/nats-io/nats.go/jetstream"
)

// Config says which nodes to simulate and how often they speak.
type Config struct {
	Cluster string
	// URL is the bus (bus.url).
	URL   string
	Nodes []string
	// Check is the self-role health check every node reports (the groups'
	// health_check).
	Check string
	// HeartbeatEvery and BeaconEvery are the prober's heartbeat_interval
	// and presence_interval (defaults 1 s and 100 ms, the prober's).
	HeartbeatEvery time.Duration
	BeaconEvery    time.Duration
	Log            *slog.Logger
}

// Sim is a running set of simulated nodes.
type Sim struct {
	cfg   Config
	ctrl  *bus.Bus
	nodes map[string]*node
	order []*node
	stop  context.CancelFunc
	wg    sync.WaitGroup
	cc    jetstream.ConsumeContext

	mu    sync.Mutex
	stats Stats
	// holder is, per group, the node that last applied a claim for it.
	holder map[string]string
	// sent maps a transition's id (the correlation id of what it causes)
	// to when it was posted; answered ones are removed.
	sent map[string]time.Time
}

// Stats counts what happened since the last Reset.
type Stats struct {
	Transitions int
	Commands    int
	Claims      int
	// Latencies are, for each transition that caused a command, the time
	// from posting the transition to its first command being stored in
	// the command stream (the server's timestamp), in arrival order.
	Latencies []time.Duration
}

type node struct {
	name string
	b    *bus.Bus
	ob   *bus.Outbox

	mu         sync.Mutex
	health     events.Health
	since      time.Time
	sinceEvent string
}

// Start connects every node, provisions the streams if missing, starts the
// nodes' heartbeats and beacons (their check unknown until SetHealth) and
// the command watch. Close stops it all.
func Start(ctx context.Context, cfg Config) (*Sim, error) {
	if cfg.HeartbeatEvery <= 0 {
		cfg.HeartbeatEvery = time.Second
	}
	if cfg.BeaconEvery <= 0 {
		cfg.BeaconEvery = 100 * time.Millisecond
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	s := &Sim{cfg: cfg, nodes: map[string]*node{}, holder: map[string]string{}, sent: map[string]time.Time{}}
	run, stop := context.WithCancel(context.Background())
	s.stop = stop
	ok := false
	defer func() {
		if !ok {
			s.Close()
		}
	}()
	ctrl, err := bus.Connect(ctx, bus.Config{URL: cfg.URL}, bus.Identity{Cluster: cfg.Cluster, Service: "nodesim", Node: "nodesim"}, cfg.Log)
	if err != nil {
		return nil, fmt.Errorf("nodesim: %w", err)
	}
	s.ctrl = ctrl
	if err := ctrl.Provision(ctx); err != nil {
		return nil, fmt.Errorf("nodesim: %w", err)
	}
	for _, name := range cfg.Nodes {
		b, err := bus.Connect(ctx, bus.Config{URL: cfg.URL}, bus.Identity{Cluster: cfg.Cluster, Service: "prober", Node: name}, cfg.Log)
		if err != nil {
			return nil, fmt.Errorf("nodesim: node %s: %w", name, err)
		}
		n := &node{name: name, b: b, ob: bus.NewOutbox(b, bus.OutboxConfig{}, cfg.Log), health: events.HealthUnknown, since: time.Now()}
		s.nodes[name] = n
		s.order = append(s.order, n)
	}
	if err := s.watchCommands(ctx); err != nil {
		return nil, err
	}
	for _, n := range s.order {
		s.wg.Add(2)
		go func() { defer s.wg.Done(); s.heartbeats(run, n) }()
		go func() { defer s.wg.Done(); s.beacons(run, n) }()
	}
	ok = true
	return s, nil
}

// Close stops the nodes, stores what their outboxes still hold (for up to
// a second) and closes every connection.
func (s *Sim) Close() {
	s.stop()
	s.wg.Wait()
	if s.cc != nil {
		s.cc.Stop()
		<-s.cc.Closed()
	}
	var wg sync.WaitGroup
	for _, n := range s.order {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_ = n.ob.Close(ctx)
			cancel()
			n.b.Close()
		}()
	}
	wg.Wait()
	if s.ctrl != nil {
		s.ctrl.Close()
	}
}

// beacons is the prober's presence beacon loop: core NATS, no reconnect
// buffer, so a node cut off goes quiet. The first beacon waits a random
// part of the interval, as probers started at different times do.
func (s *Sim) beacons(ctx context.Context, n *node) {
	every := s.cfg.BeaconEvery
	subject := events.BeaconSubject(s.cfg.Cluster, n.name)
	if !sleep(ctx, rand.N(every)) {
		return
	}
	t := time.NewTicker(every)
	defer t.Stop()
	var seq uint64
	for {
		seq++
		data, err := events.Beacon{Node: n.name, Seq: seq, IntervalMS: every.Milliseconds(), At: time.Now().UTC()}.Encode()
		if err == nil {
			err = n.b.NC.Publish(subject, data)
		}
		if err != nil && seq%100 == 1 {
			s.cfg.Log.Debug("presence beacon not sent", "node", n.name, "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// heartbeats is the prober's heartbeat loop: every interval the node's
// check states, posted under one outbox key so a heartbeat still waiting
// is superseded by the next.
func (s *Sim) heartbeats(ctx context.Context, n *node) {
	every := s.cfg.HeartbeatEvery
	if !sleep(ctx, rand.N(every)) {
		return
	}
	t := time.NewTicker(every)
	defer t.Stop()
	var seq uint64
	for {
		seq++
		n.mu.Lock()
		hb := events.NodeHeartbeat{Node: n.name, Seq: seq, IntervalMS: every.Milliseconds(), Version: "nodesim",
			Checks: map[string]events.CheckState{s.cfg.Check: {TargetNode: n.name, Role: events.RoleSelf, Health: n.health, Since: n.since, SinceEvent: n.sinceEvent}}}
		n.mu.Unlock()
		if _, err := n.ob.Post("heartbeat", hb); err != nil && ctx.Err() == nil {
			s.cfg.Log.Warn("publish heartbeat failed", "node", n.name, "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// ErrNoChange is returned by SetHealth when the node's check already has
// that health: the prober publishes a transition only on a change.
var ErrNoChange = errors.New("check already has that health")

// SetHealth moves a node's check to h and posts the health transition as
// the prober does (under the check's outbox key, one evidence per
// consecutive result); the node's next heartbeats carry the new state. It
// returns the transition's envelope.
func (s *Sim) SetHealth(name string, h events.Health) (events.Envelope, error) {
	n := s.nodes[name]
	if n == nil {
		return events.Envelope{}, fmt.Errorf("nodesim: no node %s", name)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.health == h {
		return events.Envelope{}, fmt.Errorf("nodesim: node %s: %w", name, ErrNoChange)
	}
	const rise, fall = 2, 3
	now := time.Now()
	count, reason := rise, fmt.Sprintf("%d consecutive successes (rise %d)", rise, rise)
	ev := events.Evidence{At: now.UTC(), OK: true, DurationMS: 1}
	if h == events.HealthDown {
		count, reason = fall, fmt.Sprintf("%d consecutive failures (fall %d): simulated failure", fall, fall)
		ev.OK, ev.Error, ev.ErrorClass = false, "simulated failure", events.ErrorOther
	}
	evidence := make([]events.Evidence, count)
	for i := range evidence {
		evidence[i] = ev
	}
	ht := events.HealthTransition{Check: s.cfg.Check, TargetNode: name, Role: events.RoleSelf, From: n.health, To: h,
		Reason: reason, Consecutive: count, Rise: rise, Fall: fall, Evidence: evidence}
	// Taken before the post: the latency counts the outbox's store too,
	// as a real transition's does.
	posted := time.Now()
	env, err := n.ob.Post("health/"+s.cfg.Check, ht)
	if err != nil {
		return env, fmt.Errorf("nodesim: node %s: %w", name, err)
	}
	n.health, n.since, n.sinceEvent = h, now, env.ID
	s.mu.Lock()
	s.stats.Transitions++
	s.sent[env.ID] = posted
	s.mu.Unlock()
	return env, nil
}

// Health is a node's check as it reports it now.
func (s *Sim) Health(name string) events.Health {
	n := s.nodes[name]
	if n == nil {
		return ""
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.health
}

// watchCommands reads the command stream from now on through one
// consumer: it is the executors of every simulated node, and the
// benchmark's clock of when each command was stored.
func (s *Sim) watchCommands(ctx context.Context) error {
	cons, err := s.ctrl.JS.CreateConsumer(ctx, bus.CommandsStream, jetstream.ConsumerConfig{
		Description:       "nodesim executors",
		FilterSubject:     events.ClusterCommands(s.cfg.Cluster),
		DeliverPolicy:     jetstream.DeliverNewPolicy,
		AckPolicy:         jetstream.AckNonePolicy,
		InactiveThreshold: time.Minute,
	})
	if err != nil {
		return fmt.Errorf("nodesim: command consumer: %w", err)
	}
	cc, err := cons.Consume(s.command, jetstream.PullHeartbeat(time.Second), jetstream.PullExpiry(5*time.Second))
	if err != nil {
		return fmt.Errorf("nodesim: consume commands: %w", err)
	}
	s.cc = cc
	return nil
}

// command answers one command from its target node, as the executor
// contract says: a result caused by the command, always.
func (s *Sim) command(m jetstream.Msg) {
	env, p, ok := s.ctrl.DecodeFrom(m.Subject(), m.Data())
	if !ok {
		return
	}
	cmd, ok := p.(events.Command)
	if !ok {
		return
	}
	var stored time.Time
	if md, err := m.Metadata(); err == nil {
		stored = md.Timestamp
	}
	group, target := cmd.Target()
	s.mu.Lock()
	s.stats.Commands++
	if env.Type == events.TypeClaimIP {
		s.stats.Claims++
		s.holder[group] = target
	}
	if posted, ok := s.sent[env.CorrelationID]; ok && !stored.IsZero() {
		s.stats.Latencies = append(s.stats.Latencies, stored.Sub(posted))
		delete(s.sent, env.CorrelationID)
	}
	s.mu.Unlock()
	n := s.nodes[target]
	if n == nil {
		return // another cluster's node: not ours to answer
	}
	res := events.CommandResult{CommandID: env.ID, CommandType: env.Type, Node: target, Group: group, Outcome: events.OutcomeApplied}
	renv, err := events.New(events.Source{Service: "ipmover", Node: target}, s.cfg.Cluster, res, events.CausedBy(env))
	if err == nil {
		err = n.ob.PostEnvelope("", renv, res)
	}
	if err != nil {
		s.cfg.Log.Warn("command result not posted", "node", target, "command_id", env.ID, "err", err)
	}
}

// Holder is the node that last applied a claim for group ("" before any).
func (s *Sim) Holder(group string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.holder[group]
}

// Stats returns a copy of the counts since the last Reset.
func (s *Sim) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.stats
	st.Latencies = slices.Clone(st.Latencies)
	return st
}

// Reset starts the counts again (the measured window begins).
func (s *Sim) Reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stats = Stats{}
	clear(s.sent)
}
