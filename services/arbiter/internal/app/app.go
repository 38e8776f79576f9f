// Package app wires the arbiter: one goroutine owns the pure decision core
// and feeds it the prober's transitions and heartbeats, the executors'
// results and the clock; while this replica holds the lease it persists the
// core's state, publishes decisions, and publishes commands fenced by the
// lease so that only the current leader's commands reach an executor.
package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"reflect"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/config"
	"github.com/fanpbx/fan/pkg/platform/daemon"
	"github.com/fanpbx/fan/services/arbiter/internal/decide"
	"github.com/fanpbx/fan/services/arbiter/internal/lease"
	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"
)

// tickEvery drives the core's timers (claim timeouts, silence). It bounds
// how late a timer fires, not how fast a health transition is acted on:
// events are handled as they arrive.
const tickEvery = 100 * time.Millisecond

// statusRefresh rewrites group status at least this often so fanctl shows
// fresh heartbeat ages even when nothing changed.
const statusRefresh = 5 * time.Second

// Service is a configured arbiter.
type Service struct {
	cfg     Config
	log     *slog.Logger
	version string

	core  *decide.Core
	lease *lease.Lease
	bus   *bus.Bus
	kv    jetstream.KeyValue

	lastStatus map[string]events.GroupStatus
	statusAt   time.Time
}

// Build loads and validates the configuration; it starts nothing.
func Build(o daemon.Options) (daemon.Service, error) {
	var cfg Config
	if err := config.Load(o.ConfigPath, &cfg); err != nil {
		return nil, err
	}
	s, err := New(cfg, o.Logger, o.Version)
	if err != nil {
		return nil, fmt.Errorf("config %s: %w", o.ConfigPath, err)
	}
	return s, nil
}

// New builds an arbiter from a validated configuration.
func New(cfg Config, log *slog.Logger, version string) (*Service, error) {
	dc := decide.Config{
		Cluster: cfg.Cluster, NewID: func() string { return uuid.Must(uuid.NewV7()).String() },
		SilentAfter: cfg.Policy.SilentAfter.D(), ClaimTimeout: cfg.Policy.ClaimTimeout.D(), CommandTTL: cfg.Policy.CommandTTL.D(),
		HoldDown: cfg.Policy.HoldDown.D(), RetryBackoff: cfg.Policy.RetryBackoff.D(), SettleAfter: cfg.Policy.SettleAfter.D(),
	}
	for _, g := range cfg.Groups {
		dc.Groups = append(dc.Groups, decide.Group{Name: g.Name, Addresses: g.Addresses, Nodes: g.Nodes,
			HealthCheck: g.HealthCheck, PeerChecks: g.PeerChecks})
	}
	core, err := decide.New(dc)
	if err != nil {
		return nil, err
	}
	return &Service{cfg: cfg, log: log.With("node", cfg.Node), version: version, core: core, lastStatus: map[string]events.GroupStatus{}}, nil
}

type input struct {
	env events.Envelope
	p   events.Payload
}

// Run arbitrates until ctx ends.
func (s *Service) Run(ctx context.Context) error {
	return daemon.Serve(ctx, s.cfg.Common, "arbiter", s.version, s.log, func(ctx context.Context, rt *daemon.Runtime) error {
		s.bus = rt.Bus
		kv, err := rt.Bus.StateKV(ctx)
		if err != nil {
			return err
		}
		s.kv = kv
		host, _ := os.Hostname()
		l, err := lease.New(lease.Config{Cluster: s.cfg.Cluster, Holder: fmt.Sprintf("%s/%s/%d", s.cfg.Node, host, os.Getpid()),
			TTL: s.cfg.LeaseTTL.D()}, rt.Bus, s.log)
		if err != nil {
			return err
		}
		s.lease = l

		inputs := make(chan input, 4096)
		changes := make(chan lease.Change, 4)
		watchDone := make(chan error, 1)
		go func() {
			watchDone <- rt.Bus.Watch(ctx, bus.WatchOptions{Subjects: []string{
				events.AllHealth(s.cfg.Cluster), events.AllHeartbeats(s.cfg.Cluster),
				events.AllCommandResults(s.cfg.Cluster), events.AllPermits(s.cfg.Cluster),
			}}, func(env events.Envelope, p events.Payload, _ uint64) {
				select {
				case inputs <- input{env, p}:
				case <-ctx.Done():
				}
			})
		}()
		leaseDone := make(chan struct{})
		go func() { l.Run(ctx, changes); close(leaseDone) }()

		t := time.NewTicker(tickEvery)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				<-leaseDone
				return <-watchDone
			case in := <-inputs:
				s.execute(ctx, s.core.Handle(time.Now(), in.env, in.p))
			case ch, ok := <-changes:
				if ok {
					s.leadership(ctx, ch)
				}
			case now := <-t.C:
				s.execute(ctx, s.core.Tick(now))
				s.writeStatus(ctx, now)
			}
		}
	})
}

// leadership switches the core. A new leader first restores what the
// previous one persisted, so it continues from the same holder and claim.
func (s *Service) leadership(ctx context.Context, ch lease.Change) {
	if ch.Leading {
		if err := s.restore(ctx); err != nil {
			// Without the previous state this replica could command a
			// second holder: keep following until the next attempt.
			s.log.Error("cannot restore arbiter state; not commanding", "err", err)
			return
		}
	}
	if err := s.core.SetLeadership(ch.Epoch, ch.Leading); err != nil {
		s.log.Error("leadership change refused by the core", "epoch", ch.Epoch, "err", err)
		return
	}
	s.log.Info("leadership", "leading", ch.Leading, "epoch", ch.Epoch)
}

func (s *Service) restore(ctx context.Context) error {
	e, err := s.kv.Get(ctx, events.ArbiterStateKey(s.cfg.Cluster))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read arbiter state: %w", err)
	}
	var st decide.State
	if err := json.Unmarshal(e.Value(), &st); err != nil {
		return fmt.Errorf("decode arbiter state: %w", err)
	}
	return s.core.Restore(st)
}

// execute persists, then publishes, what the core decided. State goes to
// the bucket before any command leaves, so a successor never forgets a
// claim that may already be executing.
func (s *Service) execute(ctx context.Context, out decide.Output) {
	if len(out.Emits) == 0 {
		return
	}
	for _, e := range out.Emits {
		if _, ok := e.Payload.(events.Command); ok {
			if err := s.persist(ctx); err != nil {
				s.log.Error("persist arbiter state failed; commands withheld", "err", err)
				return
			}
			break
		}
	}
	src := s.bus.Source()
	for _, e := range out.Emits {
		env, err := events.New(src, s.cfg.Cluster, e.Payload, e.Options...)
		if err != nil {
			s.log.Error("core produced an invalid event", "type", e.Payload.EventType(), "err", err)
			continue
		}
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		if cmd, ok := e.Payload.(events.Command); ok {
			err = s.lease.PublishCommand(pctx, env, cmd)
		} else {
			err = s.bus.Publish(pctx, env, e.Payload)
		}
		cancel()
		if err != nil {
			// An unpublished command is caught by the core's claim timeout.
			s.log.Error("publish failed", "type", env.Type, "event_id", env.ID, "err", err)
			continue
		}
		if d, ok := e.Payload.(events.ArbiterDecision); ok {
			s.log.Info("decision", "group", d.Group, "action", d.Action, "from", d.From, "to", d.To, "reason", d.Reason, "event_id", env.ID)
		}
	}
	s.writeStatus(ctx, time.Now())
}

func (s *Service) persist(ctx context.Context) error {
	b, err := json.Marshal(s.core.Snapshot())
	if err != nil {
		return err
	}
	pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	_, err = s.kv.Put(pctx, events.ArbiterStateKey(s.cfg.Cluster), b)
	return err
}

// writeStatus publishes each group's status for fanctl and for executors
// restarting, when it changed or has grown stale. Only the leader writes.
func (s *Service) writeStatus(ctx context.Context, now time.Time) {
	if !s.lease.Leading() {
		return
	}
	snap := s.core.Snapshot()
	refresh := now.Sub(s.statusAt) >= statusRefresh
	for i, g := range snap.Groups {
		st := events.GroupStatus{Group: g.Name, Addresses: s.cfg.Groups[i].Addresses, Holder: g.Holder, Epoch: snap.Epoch,
			Since: g.LastMove, Nodes: map[string]events.NodeStatus{}}
		for prio, n := range g.Nodes {
			st.Nodes[n.Node] = events.NodeStatus{Health: n.Health, LastHeartbeat: n.LastHeartbeat, Silent: n.Silent, Priority: prio}
		}
		if !refresh && sameStatus(s.lastStatus[g.Name], st) {
			continue
		}
		st.UpdatedAt = now
		b, err := json.Marshal(st)
		if err != nil {
			continue
		}
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		_, err = s.kv.Put(pctx, events.GroupStatusKey(s.cfg.Cluster, g.Name), b)
		cancel()
		if err != nil {
			s.log.Warn("write group status failed", "group", g.Name, "err", err)
			continue
		}
		s.lastStatus[g.Name] = st
	}
	if refresh {
		s.statusAt = now
	}
}

// sameStatus ignores heartbeat times, which change every second.
func sameStatus(a, b events.GroupStatus) bool {
	strip := func(g events.GroupStatus) events.GroupStatus {
		g.UpdatedAt = time.Time{}
		nodes := make(map[string]events.NodeStatus, len(g.Nodes))
		for k, v := range g.Nodes {
			v.LastHeartbeat = time.Time{}
			nodes[k] = v
		}
		g.Nodes = nodes
		return g
	}
	return reflect.DeepEqual(strip(a), strip(b))
}
