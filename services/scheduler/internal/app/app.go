// Package app wires the scheduler: it turns each group's failback windows
// into FailbackPermit ticks while a window is open, arming one exact timer
// for the next edge (window opening, next tick, window end) instead of
// polling. Permits carry a deterministic id, so several instances publish
// each tick once between them. No scheduler, no permit: the arbiter never
// fails back on its own.
package app

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync"
	"time"
	_ "time/tzdata" // named zones must resolve in a FROM scratch image too

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/config"
	"github.com/fanpbx/fan/pkg/platform/daemon"
	"github.com/fanpbx/fan/services/scheduler/internal/permit"
	"github.com/fanpbx/fan/services/scheduler/internal/window"
)

// maxSleep re-arms the timer at least this often: timers run on the
// monotonic clock, and a wall-clock step (NTP, a resumed VM) must not
// delay a window's opening by more than this.
const maxSleep = time.Hour

// Service is a configured scheduler.
type Service struct {
	cfg     Config
	log     *slog.Logger
	version string
	now     func() time.Time
	path    string // for SIGHUP reloads

	// mu guards what a reload replaces: the windows, tick and plan settings.
	mu        sync.Mutex
	schedules map[string]window.Schedule
	// wake re-arms the loop's timer after a reload.
	wake chan struct{}

	conds   *daemon.Conditions
	metrics *windowMetrics // set by Run
}

// condPlanUnwritten: the plan could not be written (retried after 1 s,
// doubling to 30 s). Not a reason to exit: a restart would not write it any
// sooner. Permits need no condition of their own: the outbox retries them
// and raises outbox_full if its backlog reaches the cap.
const condPlanUnwritten = "plan_unwritten"

// Build loads the configuration; it starts nothing.
func Build(o daemon.Options) (daemon.Service, error) {
	var cfg Config
	if err := daemon.LoadConfig(o, &cfg); err != nil {
		return nil, err
	}
	s, err := New(cfg, o.Logger, o.Version)
	if err != nil {
		return nil, err
	}
	s.path = o.ConfigPath
	return s, nil
}

// New builds a scheduler from a validated configuration.
func New(cfg Config, log *slog.Logger, version string) (*Service, error) {
	sch, err := cfg.schedules()
	if err != nil {
		return nil, err
	}
	return &Service{cfg: cfg, log: daemon.ServiceLogger(log, cfg.Node), version: version, schedules: sch, now: time.Now,
		wake: make(chan struct{}, 1)}, nil
}

// Run joins the bus and emits permits until ctx ends.
func (s *Service) Run(ctx context.Context) error {
	return daemon.Serve(ctx, s.cfg.Common, "scheduler", s.version, s.log, func(ctx context.Context, rt *daemon.Runtime) error {
		s.conds = rt.Conditions
		s.conds.Declare(condPlanUnwritten)
		s.metrics = newWindowMetrics(s, rt.Metrics)
		// One actor, the window loop: it stops at its turn (daemon.Group),
		// then Serve stores the last permits (the outbox) and closes the bus.
		g, _ := daemon.NewGroup(ctx)
		g.Go("windows", func(ctx context.Context) error { return s.loop(ctx, rt.Bus, rt.Outbox) })
		return g.Wait()
	})
}

func (s *Service) loop(ctx context.Context, b *bus.Bus, ob *bus.Outbox) error {
	kv, err := b.WaitStateKV(ctx)
	if err != nil {
		return err
	}
	timer := time.NewTimer(0)
	defer timer.Stop()
	var planRetry time.Duration
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-timer.C:
		case <-s.wake:
		}
		now := s.now()
		wake := now.Add(maxSleep)
		s.mu.Lock()
		groups, schedules, tickEvery := s.cfg.Groups, s.schedules, s.cfg.TickEvery.D()
		s.mu.Unlock()
		for _, g := range groups {
			tick, next := schedules[g.Name].At(now, tickEvery)
			if next.Before(wake) {
				wake = next
			}
			if tick != nil {
				s.publish(ob, g.Name, tick)
			}
		}
		if err := s.writePlan(ctx, kv, b.Source().Node, now); err != nil {
			s.conds.Raise(condPlanUnwritten, err.Error())
			planRetry = min(max(2*planRetry, time.Second), 30*time.Second)
			if r := now.Add(planRetry); r.Before(wake) {
				wake = r
			}
		} else {
			s.conds.Clear(condPlanUnwritten)
			planRetry = 0
		}
		timer.Reset(max(wake.Sub(s.now()), time.Millisecond))
	}
}

// publish posts one tick. Every instance builds the same envelope id for
// the same tick, so the stream keeps one copy. The outbox retries it until
// stored; the group's next tick supersedes one still waiting.
func (s *Service) publish(ob *bus.Outbox, group string, t *window.Tick) {
	p := events.FailbackPermit{Group: group, Window: t.Range.Name, ValidFrom: t.Start, ValidUntil: t.Range.End}
	id := permit.ID(s.cfg.Cluster, group, t.Range.Name, t.Start)
	if _, err := ob.Post("permit/"+group, p, events.WithID(id), events.At(t.Start)); err != nil {
		s.log.Warn("failback permit not published", "group", group, "window", t.Range.Name, "tick", t.Start, "err", err)
		return
	}
	s.metrics.permitted(group)
	s.log.Debug("failback permit", "group", group, "window", t.Range.Name, "valid_until", t.Range.End, "event_id", id)
}

// Plan computes what `fanctl windows` shows: each group's open window and next ones.
func (s *Service) Plan(now time.Time, node string) events.SchedulePlan {
	s.mu.Lock()
	defer s.mu.Unlock()
	plan := events.SchedulePlan{Cluster: s.cfg.Cluster, UpdatedAt: now.UTC(), UpdatedBy: node}
	for _, g := range s.cfg.Groups {
		gs := events.GroupSchedule{Group: g.Name, Windows: []events.PlannedWindow{}}
		for _, r := range s.schedules[g.Name].Next(now, s.cfg.PlanAhead) {
			pw := events.PlannedWindow{Window: r.Name, Start: r.Start, End: r.End, TimeZone: r.Start.Location().String(), Kind: r.Kind}
			if !now.Before(r.Start) {
				open := pw
				gs.Open = &open
				continue
			}
			gs.Windows = append(gs.Windows, pw)
		}
		plan.Groups = append(plan.Groups, gs)
	}
	return plan
}

func (s *Service) writePlan(ctx context.Context, kv interface {
	Put(context.Context, string, []byte) (uint64, error)
}, node string, now time.Time) error {
	b, err := json.Marshal(s.Plan(now, node))
	if err != nil {
		s.log.Error("encode plan", "err", err)
		return fmt.Errorf("encode plan: %w", err)
	}
	pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if _, err := kv.Put(pctx, events.ScheduleKey(s.cfg.Cluster), b); err != nil {
		err = fmt.Errorf("put %s: %w", events.ScheduleKey(s.cfg.Cluster), err)
		s.log.Warn("plan not written", "err", err)
		return err
	}
	return nil
}

// Reload applies a changed configuration file on SIGHUP. Windows, blackout
// dates, tick and plan settings apply at once (the timer is re-armed, so a
// window opened by the edit starts ticking now); the cluster, node, bus and
// HTTP keys need a restart and are reported as such.
func (s *Service) Reload(ctx context.Context) error {
	var next Config
	if err := config.Load(s.path, &next); err != nil {
		return err
	}
	sch, err := next.schedules()
	if err != nil {
		return fmt.Errorf("config %s: %w", s.path, err)
	}
	s.mu.Lock()
	// Only what the loop reads under the lock is replaced: the common keys
	// are read without it, and need a restart anyway.
	restart := daemon.CommonRestartKeys(s.cfg.Common, next.Common)
	s.cfg.Groups, s.cfg.TickEvery, s.cfg.PlanAhead = next.Groups, next.TickEvery, next.PlanAhead
	s.schedules = sch
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
	s.log.Info("windows reloaded", "groups", len(next.Groups))
	if len(restart) > 0 {
		return &daemon.RestartRequired{Keys: restart}
	}
	return nil
}
