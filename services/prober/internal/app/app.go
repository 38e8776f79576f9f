// Package app wires the prober: it runs each configured check on its own
// schedule, turns results into health transitions with rise/fall
// hysteresis, and publishes transitions (with their evidence), rate-limited
// raw results and the node's heartbeat.
package app

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/fanpbx/fan/pkg/ami"
	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/daemon"
	"github.com/fanpbx/fan/pkg/sipoptions"
	"github.com/fanpbx/fan/services/prober/internal/check"
	"github.com/fanpbx/fan/services/prober/internal/health"
	"github.com/fanpbx/fan/services/prober/internal/quorum"
	"github.com/fanpbx/fan/services/prober/internal/telemetry"
)

// Service is a configured prober.
type Service struct {
	cfg     Config
	log     *slog.Logger
	version string

	mu     sync.Mutex
	states map[string]events.CheckState
	// figures are the latest numbers the PBX checks reported.
	figures map[string]float64
	// systemName is this node's Asterisk systemname as its AMI check last
	// read it (nil until then).
	systemName *string

	// gmu orders group transitions: member transitions from concurrent
	// check loops are folded in and published one at a time.
	gmu    sync.Mutex
	quorum *quorum.Tracker
	// last is each check's latest result, the evidence a group carries.
	last map[string]events.Evidence
	// red removes every configured credential from what leaves the
	// prober: results, transitions, logs.
	red *check.Redactor
	// metrics is set by Run.
	metrics *checkMetrics
}

// Build loads and validates the configuration; it starts nothing.
func Build(o daemon.Options) (daemon.Service, error) {
	var cfg Config
	if err := daemon.LoadConfig(o, &cfg); err != nil {
		return nil, err
	}
	return New(cfg, o.Logger, o.Version), nil
}

// New builds a prober from a validated configuration.
func New(cfg Config, log *slog.Logger, version string) *Service {
	groups := make([]quorum.Group, len(cfg.Groups))
	for i, g := range cfg.Groups {
		groups[i] = quorum.Group{Name: g.Name, MinUp: g.MinUp, Members: g.Checks}
	}
	return &Service{cfg: cfg, log: daemon.ServiceLogger(log, cfg.Node), version: version,
		states: map[string]events.CheckState{}, figures: map[string]float64{},
		quorum: quorum.New(groups), last: map[string]events.Evidence{}, red: check.NewRedactor(cfg.secrets())}
}

// Run probes until ctx ends.
func (s *Service) Run(ctx context.Context) error {
	return daemon.Serve(ctx, s.cfg.Common, "prober", s.version, s.log, func(ctx context.Context, rt *daemon.Runtime) error {
		s.metrics = newCheckMetrics(s, rt.Metrics)
		checkers := make([]check.Checker, 0, len(s.cfg.Checks))
		for _, cc := range s.cfg.Checks {
			c, err := s.newChecker(cc)
			if err != nil {
				for _, c := range checkers {
					_ = c.Close()
				}
				return err
			}
			checkers = append(checkers, c)
		}
		for _, g := range s.cfg.Groups {
			s.setStateNamed(g.Name, events.CheckState{TargetNode: g.TargetNode, Role: g.Role, Health: events.HealthUnknown, Since: time.Now()})
		}
		// The run group's actors, in the order they stop (daemon.Group):
		// the checks first, so no result is judged after the stop began;
		// then the heartbeat and the presence beacons. Serve then stores
		// the last results and transitions (the outbox) and closes the bus.
		// A loop that ends on its own ends the run, for systemd to restart.
		g, _ := daemon.NewGroup(ctx)
		for i, cc := range s.cfg.Checks {
			c := checkers[i]
			s.setState(cc, events.CheckState{TargetNode: cc.TargetNode, Role: cc.Role, Health: events.HealthUnknown, Since: time.Now()})
			// The watchdog counts the loop alive while it turns: a run takes
			// at most the timeout, so three intervals without a turn mean
			// it is stuck.
			alive := rt.Loop("check-"+cc.Name, 3*cc.Interval.D()+cc.Timeout.D()+time.Second)
			g.Go("check-"+cc.Name, func(ctx context.Context) error {
				defer c.Close()
				defer alive.Done()
				s.loop(ctx, rt.Outbox, cc, c, alive.Alive)
				return nil
			})
		}
		hbAlive := rt.Loop("heartbeat", 3*s.cfg.HeartbeatInterval.D()+time.Second)
		g.Go("heartbeat", func(ctx context.Context) error {
			defer hbAlive.Done()
			s.heartbeats(ctx, rt.Outbox, hbAlive.Alive)
			return nil
		})
		g.Go("beacons", func(ctx context.Context) error { s.beacons(ctx, rt.Bus); return nil })
		return g.Wait()
	})
}

func (s *Service) newChecker(cc CheckConfig) (check.Checker, error) {
	switch cc.Kind {
	case "ami":
		// The connect is bounded by the probe timeout (a connect slower than
		// that is a failure anyway); the login gets its own, longer deadline.
		return check.NewAMI(ami.Config{Addr: cc.Address, Username: cc.Username, Secret: cc.Secret,
			DialTimeout: cc.Timeout.D(), LoginTimeout: cc.LoginTimeout.D()},
			s.log.With("check", cc.Name)), nil
	case "sip":
		// FailFast: a dead SIP stack (port closed, ICMP unreachable) fails
		// the run at once instead of at its timeout; rise/fall absorbs the
		// rare stale ICMP error after the port came back.
		c, err := check.NewSIP(cc.Address, sipoptions.Options{Transport: sipoptions.Transport(cc.Transport), T1: cc.Retransmit.D(), FailFast: true}, cc.codes)
		if err != nil {
			return nil, fmt.Errorf("check %s: %w", cc.Name, err)
		}
		return c, nil
	case "tcp":
		return check.NewTCP(cc.Address), nil
	case "http":
		return check.NewHTTP(cc.Address, cc.codes, cc.body, cc.InsecureSkipVerify), nil
	case "dns":
		c, err := check.NewDNS(cc.Address, cc.Query, cc.QueryType, cc.Recursion)
		if err != nil {
			return nil, fmt.Errorf("check %s: %w", cc.Name, err)
		}
		return c, nil
	case "icmp":
		c, err := check.NewICMP(cc.Address, cc.ICMPMode)
		if err != nil {
			return nil, fmt.Errorf("check %s: %w", cc.Name, err)
		}
		return c, nil
	case "exec":
		return check.NewExec(cc.Command, cc.SecretArgs), nil
	}
	return nil, fmt.Errorf("check %s: unknown kind %q", cc.Name, cc.Kind)
}

// loop runs one check on its interval. Runs never overlap: the timeout is
// below the interval (validated), so a hung PBX costs one timeout per
// interval, never a pile of goroutines.
func (s *Service) loop(ctx context.Context, b *bus.Outbox, cc CheckConfig, c check.Checker, turned func()) {
	log := s.log.With("check", cc.Name, "target_node", cc.TargetNode)
	tr := health.New(cc.Rise, cc.Fall)
	var rtt health.RoundTrips
	var lastPublished time.Time
	lastOK := false
	obs := s.metrics.forCheck(cc)
	sched := newSchedule(cc.Interval.D(), cc.Jitter.D())
	defer sched.stop()
	for ; ; sched.next() {
		turned()
		if !sched.wait(ctx) {
			return
		}
		wait := cc.Timeout.D()
		if cc.DecisiveMargin > 0 && tr.Decisive() {
			wait = rtt.Wait(cc.DecisiveMargin.D(), wait)
		}
		rctx, cancel := context.WithTimeout(ctx, wait)
		r := c.Run(rctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		if r.NoVerdict {
			if log.Enabled(ctx, slog.LevelDebug) {
				log.Debug("no verdict yet", "duration", r.Duration)
			}
			continue
		}
		if r.OK {
			rtt.Observe(r.Duration)
		}
		r.Err = s.red.Error(r.Err)
		obs.observe(r)
		ev := evidence(r)
		if r.OK {
			s.setFigures(r.Figures)
			if r.SystemName != nil && cc.Role == events.RoleSelf {
				s.setSystemName(*r.SystemName)
			}
		}

		var resultID string
		if r.OK != lastOK || r.At.Sub(lastPublished) >= s.cfg.ResultsEvery.D() {
			// Keyed by check: a newer result supersedes one still waiting
			// for the bus, so an outage queues one result per check.
			env, err := b.Post(resultKey(cc.Name), s.result(cc, c, r, ev))
			if err != nil {
				log.Warn("publish result failed", "err", err)
			} else {
				resultID, lastPublished = env.ID, r.At
			}
		}
		lastOK = r.OK

		s.gmu.Lock()
		s.last[cc.Name] = ev
		s.gmu.Unlock()
		if trn, ok := tr.Observe(ev); ok {
			id := s.publishTransition(ctx, b, log, cc, trn, r, resultID, wait)
			s.publishGroups(ctx, b, cc.Name, trn.To, id)
		}
	}
}

// publishTransition stores trn; waited is how long its last run was given.
func (s *Service) publishTransition(ctx context.Context, b *bus.Outbox, log *slog.Logger, cc CheckConfig, trn health.Transition, r check.Result, resultID string, waited time.Duration) string {
	reason := fmt.Sprintf("%d consecutive successes (rise %d)", trn.Consecutive, cc.Rise)
	if trn.To == events.HealthDown {
		reason = fmt.Sprintf("%d consecutive failures (fall %d): %v", trn.Consecutive, cc.Fall, r.Err)
		if waited < cc.Timeout.D() {
			// Whoever explains a move must see that the last run was not
			// given the whole timeout, and why.
			reason += fmt.Sprintf("; the deciding run waited %v (the answers' round trip + decisive_margin), not the %v timeout",
				waited.Round(100*time.Microsecond), cc.Timeout.D())
		}
	}
	ht := events.HealthTransition{Check: cc.Name, TargetNode: cc.TargetNode, Role: cc.Role, From: trn.From, To: trn.To,
		Reason: reason, Consecutive: trn.Consecutive, Rise: cc.Rise, Fall: cc.Fall, Evidence: trn.Evidence}
	var opts []events.Option
	if resultID != "" {
		opts = append(opts, events.CausedByID(resultID, ""))
	}
	// The outbox retries it until stored; a newer transition of the same
	// check supersedes it. The heartbeat carries the state too.
	env, err := b.Post(healthKey(cc.Name), ht, opts...)
	if err != nil {
		log.Error("publish health transition failed", "to", trn.To, "err", err)
	}
	log.Info("health transition", "from", trn.From, "to", trn.To, "reason", reason, "event_id", env.ID)
	s.setState(cc, events.CheckState{TargetNode: cc.TargetNode, Role: cc.Role, Health: trn.To, Since: r.At, SinceEvent: env.ID})
	return env.ID
}

// publishGroups folds a member's transition into its quorum groups and
// publishes each group that crossed its threshold. A group's evidence is
// every member's latest result, in configured order, so the transition shows
// which members were up and which were failing, and why.
func (s *Service) publishGroups(ctx context.Context, b *bus.Outbox, member string, to events.Health, causeID string) {
	s.gmu.Lock()
	defer s.gmu.Unlock()
	for _, ch := range s.quorum.Observe(member, to) {
		g := s.group(ch.Group)
		ev := make([]events.Evidence, 0, len(ch.Members))
		for _, m := range ch.Members {
			e, ok := s.last[m.Check]
			if !ok {
				e = events.Evidence{At: time.Now(), Error: "no result yet", ErrorClass: events.ErrorOther}
			}
			// OK says whether the member counts as up, which after hysteresis
			// may differ from its latest single result.
			e.OK = m.Health == events.HealthUp
			if e.Error != "" || !e.OK {
				e.Error = fmt.Sprintf("%s is %s: %s", m.Check, m.Health, e.Error)
			}
			ev = append(ev, e)
		}
		ht := events.HealthTransition{Check: g.Name, TargetNode: g.TargetNode, Role: g.Role, From: ch.From, To: ch.To,
			Reason: ch.Reason(), Consecutive: 1, Rise: 1, Fall: 1, Evidence: ev}
		var opts []events.Option
		if causeID != "" {
			opts = append(opts, events.CausedByID(causeID, ""))
		}
		env, err := b.Post(healthKey(g.Name), ht, opts...)
		if err != nil {
			s.log.Error("publish group transition failed", "group", g.Name, "to", ch.To, "err", err)
		}
		s.log.Info("group transition", "group", g.Name, "from", ch.From, "to", ch.To, "reason", ht.Reason, "event_id", env.ID)
		s.setStateNamed(g.Name, events.CheckState{TargetNode: g.TargetNode, Role: g.Role, Health: ch.To, Since: time.Now(), SinceEvent: env.ID})
	}
}

// Outbox keys: at most one event of each waits for the bus. Checks and
// groups share one namespace of names, as they do in the heartbeat.
const heartbeatKey = "heartbeat"

func healthKey(name string) string { return "health/" + name }
func resultKey(name string) string { return "result/" + name }

func (s *Service) group(name string) GroupConfig {
	for _, g := range s.cfg.Groups {
		if g.Name == name {
			return g
		}
	}
	return GroupConfig{Name: name}
}

func (s *Service) result(cc CheckConfig, c check.Checker, r check.Result, ev events.Evidence) events.ProbeResult {
	return events.ProbeResult{Check: cc.Name, Kind: c.Kind(), Target: s.red.String(c.Target()), TargetNode: cc.TargetNode, Role: cc.Role,
		OK: r.OK, DurationMS: ev.DurationMS, Error: ev.Error, ErrorClass: ev.ErrorClass, Figures: r.Figures, At: r.At}
}

func evidence(r check.Result) events.Evidence {
	e := events.Evidence{At: r.At, OK: r.OK, DurationMS: float64(r.Duration.Microseconds()) / 1000}
	if !r.OK {
		e.ErrorClass = r.Class
		e.Error = "failed"
		if r.Err != nil {
			e.Error = r.Err.Error()
		}
	}
	return e
}

func (s *Service) setState(cc CheckConfig, st events.CheckState) { s.setStateNamed(cc.Name, st) }

func (s *Service) setStateNamed(name string, st events.CheckState) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.states[name] = st
}

// setSystemName keeps this node's Asterisk systemname for the heartbeat.
func (s *Service) setSystemName(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.systemName = &name
}

func (s *Service) setFigures(f map[string]float64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, v := range f {
		s.figures[k] = v
	}
}

// heartbeats publishes the node's telemetry and every check's current state,
// so consumers converge even after missing a transition.
// beacons says "alive and on the bus" often, on core NATS. A publish while
// disconnected fails at once (no reconnect buffer), so a node cut off from
// the bus goes quiet instead of flooding stale beacons on reconnect.
func (s *Service) beacons(ctx context.Context, b *bus.Bus) {
	every := s.cfg.PresenceInterval.D()
	subject := events.BeaconSubject(s.cfg.Cluster, s.cfg.Node)
	t := time.NewTicker(every)
	defer t.Stop()
	var seq uint64
	for {
		seq++
		data, err := events.Beacon{Node: s.cfg.Node, Seq: seq, IntervalMS: every.Milliseconds(), At: time.Now().UTC()}.Encode()
		if err == nil {
			err = b.NC.Publish(subject, data)
		}
		if err != nil && seq%100 == 1 {
			s.log.Debug("presence beacon not sent", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (s *Service) heartbeats(ctx context.Context, b *bus.Outbox, turned func()) {
	sampler := telemetry.NewSampler()
	t := time.NewTicker(s.cfg.HeartbeatInterval.D())
	defer t.Stop()
	var seq uint64
	for {
		turned()
		seq++
		hb := events.NodeHeartbeat{Node: s.cfg.Node, Seq: seq, IntervalMS: s.cfg.HeartbeatInterval.D().Milliseconds(), Version: s.version}
		if smp, err := sampler.Read(); err != nil {
			s.log.Warn("telemetry", "err", err)
		} else {
			hb.CPUPercent, hb.MemAvailableBytes, hb.MemTotalBytes = smp.CPUPercent, smp.MemAvailableBytes, smp.MemTotalBytes
			hb.Load1, hb.UptimeSeconds = smp.Load1, smp.UptimeSeconds
		}
		s.mu.Lock()
		hb.Checks = make(map[string]events.CheckState, len(s.states))
		for k, v := range s.states {
			hb.Checks[k] = v
		}
		if v, ok := s.figures["active_channels"]; ok {
			n := int(v)
			hb.ActiveChannels = &n
		}
		if v, ok := s.figures["active_calls"]; ok {
			n := int(v)
			hb.ActiveCalls = &n
		}
		hb.PBXSystemName = s.systemName
		s.mu.Unlock()
		// A heartbeat still waiting for the bus is superseded by this one:
		// after an outage the newest state goes out first thing.
		if _, err := b.Post(heartbeatKey, hb); err != nil && ctx.Err() == nil {
			s.log.Warn("publish heartbeat failed", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
