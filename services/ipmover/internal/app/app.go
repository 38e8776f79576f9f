// Package app wires the ipmover, the node executor: it reads this node's
// commands from the bus, applies each at most once and only under a current
// epoch and before its deadline, keeps the interface's floating addresses in
// line with what it was told (a level-triggered reconcile loop), makes the
// PBX answer on a claimed address, and reports every outcome with timings.
package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/fanpbx/fan/pkg/ami"
	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/config"
	"github.com/fanpbx/fan/pkg/platform/daemon"
	"github.com/fanpbx/fan/services/ipmover/internal/announce"
	"github.com/fanpbx/fan/services/ipmover/internal/fence"
	"github.com/fanpbx/fan/services/ipmover/internal/reconcile"
	"github.com/fanpbx/fan/services/ipmover/internal/vip"
	"github.com/nats-io/nats.go/jetstream"
)

// Service is a configured ipmover.
type Service struct {
	cfg     Config
	log     *slog.Logger
	version string

	fence *fence.Store
	loop  *reconcile.Loop
	pbx   *ami.Session
}

// Build loads and validates the configuration; it starts nothing.
func Build(o daemon.Options) (daemon.Service, error) {
	var cfg Config
	if err := config.Load(o.ConfigPath, &cfg); err != nil {
		return nil, err
	}
	return New(cfg, o.Logger, o.Version), nil
}

// New builds an ipmover from a validated configuration.
func New(cfg Config, log *slog.Logger, version string) *Service {
	return &Service{cfg: cfg, log: log.With("node", cfg.Node), version: version}
}

// Run executes commands until ctx ends, then releases every address it
// holds: a stopped ipmover must never leave an address answering.
func (s *Service) Run(ctx context.Context) error {
	st, err := fence.Open(s.cfg.StateFile, fence.DefaultKeep)
	if err != nil {
		// A corrupt state file could re-open old epochs: refuse to start.
		return fmt.Errorf("ipmover state: %w", err)
	}
	s.fence = st
	addrs, err := vip.New(s.cfg.Interface, s.log)
	if err != nil {
		return fmt.Errorf("ipmover interface: %w", err)
	}
	defer addrs.Close()
	link, err := announce.Open(s.cfg.Interface, s.log)
	if err != nil {
		return fmt.Errorf("ipmover announcer: %w", err)
	}
	defer link.Close()
	ann, err := announce.New(link, s.cfg.Announce.schedule(), s.log)
	if err != nil {
		return fmt.Errorf("ipmover announcer: %w", err)
	}
	if s.cfg.Answer.Mode == events.AnswerReload {
		s.pbx = ami.NewSession(ami.Config{Addr: s.cfg.AMI.Address, Username: s.cfg.AMI.Username, Secret: s.cfg.AMI.Secret}, s.log)
		defer s.pbx.Close()
	}

	loopCtx, stopLoop := context.WithCancel(context.WithoutCancel(ctx))
	defer stopLoop()
	changed, err := addrs.Watch(loopCtx)
	if err != nil {
		return fmt.Errorf("ipmover watch: %w", err)
	}
	s.loop = reconcile.New(addrs, ann, reconcile.Config{
		Period: s.cfg.ReconcilePeriod.D(), Changed: changed, Logger: s.log,
		OnChange: func(c reconcile.Change) {
			s.log.Info("address reconciled", "kind", c.Kind, "prefix", c.Prefix.String(), "group", c.Group, "err", c.Err)
		},
	})

	return daemon.Serve(ctx, s.cfg.Common, "ipmover", s.version, s.log, func(ctx context.Context, rt *daemon.Runtime) error {
		s.restore(ctx, rt.Bus)
		loopDone := make(chan error, 1)
		go func() { loopDone <- s.loop.Run(loopCtx) }()

		err := rt.Bus.ConsumeCommands(ctx, s.cfg.Node, func(ctx context.Context, env events.Envelope, cmd events.Command) {
			s.handle(ctx, rt.Bus, env, cmd)
		})

		// Stop order matters: commands are no longer consumed, so nothing
		// re-adds an address; then every managed address is removed while
		// the bus is still up to report it.
		stopLoop()
		<-loopDone
		sctx, cancel := rt.ShutdownContext(ctx)
		defer cancel()
		if rerr := s.loop.ReleaseAll(sctx); rerr != nil {
			s.log.Error("release on stop failed", "err", rerr)
			err = errors.Join(err, rerr)
		} else {
			s.log.Info("released all floating addresses on stop")
		}
		return err
	})
}

// restore learns what this node should hold from the arbiter's last
// published state, so a restarted ipmover keeps (and re-announces) an
// address it legitimately holds and drops one it does not.
func (s *Service) restore(ctx context.Context, b *bus.Bus) {
	kv, err := b.StateKV(ctx)
	if err != nil {
		s.log.Warn("restore: no state bucket", "err", err)
		return
	}
	lister, err := kv.ListKeysFiltered(ctx, events.AllGroupStatusKeys(s.cfg.Cluster))
	if err != nil {
		s.log.Warn("restore: list groups", "err", err)
		return
	}
	maxEpoch := s.fence.Snapshot().MaxEpoch
	for k := range lister.Keys() {
		e, err := kv.Get(ctx, k)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue
		}
		if err != nil {
			s.log.Warn("restore: read group", "key", k, "err", err)
			continue
		}
		var g events.GroupStatus
		if err := json.Unmarshal(e.Value(), &g); err != nil {
			s.log.Warn("restore: decode group", "key", k, "err", err)
			continue
		}
		if g.Epoch < maxEpoch {
			// Older than a command already applied here: not authoritative.
			continue
		}
		hold := g.Holder == s.cfg.Node
		if err := s.loop.SetDesired(g.Group, g.Addresses, hold); err != nil {
			s.log.Warn("restore: desired state", "group", g.Group, "err", err)
			continue
		}
		s.log.Info("restored desired state", "group", g.Group, "hold", hold, "epoch", g.Epoch)
	}
}

// handle applies one command and always reports what happened to it.
func (s *Service) handle(ctx context.Context, b *bus.Bus, env events.Envelope, cmd events.Command) {
	received := time.Now()
	steps := []events.Step{{Name: "received", At: received}}
	step := func(name string) {
		now := time.Now()
		steps = append(steps, events.Step{Name: name, At: now, ElapsedMS: float64(now.Sub(received).Microseconds()) / 1000})
	}
	group := commandGroup(cmd)
	log := s.log.With("event_id", env.ID, "type", env.Type, "epoch", env.Epoch, "group", group)

	outcome, applyErr := events.OutcomeApplied, error(nil)
	switch v := s.fence.Check(env.ID, env.Epoch, cmd.Deadline(), received); v {
	case fence.Apply:
		// Record before acting: at most once, even if we crash half-way.
		if err := s.fence.Record(env.ID, env.Epoch); err != nil {
			outcome, applyErr = events.OutcomeFailed, fmt.Errorf("persist command record: %w", err)
			break
		}
		if err := s.apply(ctx, cmd, step); err != nil {
			outcome, applyErr = events.OutcomeFailed, err
		}
	case fence.StaleEpoch:
		outcome, applyErr = v.Outcome(), fmt.Errorf("epoch %d is older than epoch %d already seen", env.Epoch, s.fence.Snapshot().MaxEpoch)
	case fence.Expired:
		outcome, applyErr = v.Outcome(), fmt.Errorf("deadline %s passed %v ago", cmd.Deadline().Format(time.RFC3339Nano), received.Sub(cmd.Deadline()))
	default:
		outcome = v.Outcome()
	}
	res := events.CommandResult{CommandID: env.ID, CommandType: env.Type, Node: s.cfg.Node, Group: group, Outcome: outcome, Steps: steps}
	if applyErr != nil {
		res.Error = applyErr.Error()
		log.Warn("command not applied", "outcome", outcome, "err", applyErr)
	} else {
		log.Info("command done", "outcome", outcome, "elapsed_ms", steps[len(steps)-1].ElapsedMS)
	}
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if _, err := b.Emit(pctx, res, events.CausedBy(env), events.WithEpoch(env.Epoch)); err != nil {
		log.Error("publish command result failed", "err", err)
	}
}

func (s *Service) apply(ctx context.Context, cmd events.Command, step func(string)) error {
	switch c := cmd.(type) {
	case *events.ClaimIP:
		if err := s.loop.SetDesired(c.Group, c.Addresses, true); err != nil {
			return err
		}
		// The reconcile pass adds the address and sends the first
		// gratuitous ARP before it returns: the failover critical path.
		if err := s.loop.Reconcile(ctx); err != nil {
			return fmt.Errorf("claim %v: %w", c.Addresses, err)
		}
		step("address_added_and_announced")
		if err := s.answer(ctx, s.cfg.Answer.Mode, s.cfg.Answer.Modules); err != nil {
			return err
		}
		step("pbx_answering")
	case *events.ReleaseIP:
		if err := s.loop.SetDesired(c.Group, c.Addresses, false); err != nil {
			return err
		}
		if err := s.loop.Reconcile(ctx); err != nil {
			return fmt.Errorf("release %v: %w", c.Addresses, err)
		}
		step("address_removed")
	case *events.AnswerPBX:
		modules := c.Modules
		if len(modules) == 0 {
			modules = s.cfg.Answer.Modules
		}
		if err := s.answer(ctx, c.Mode, modules); err != nil {
			return err
		}
		step("pbx_answering")
	default:
		return fmt.Errorf("unsupported command %T", cmd)
	}
	return nil
}

// answer makes the PBX answer on the claimed address. In hot mode Asterisk
// is already bound through ip_nonlocal_bind; in reload mode a Reload of a
// transport that never bound creates it (facts/asterisk22.md), and a
// Response: Error is a failure.
func (s *Service) answer(ctx context.Context, mode events.AnswerMode, modules []string) error {
	switch mode {
	case events.AnswerHot:
		return nil
	case events.AnswerReload:
		if s.pbx == nil {
			return errors.New("answer reload: no ami configured on this node")
		}
		actx, cancel := context.WithTimeout(ctx, s.cfg.Answer.Timeout.D())
		defer cancel()
		for _, m := range modules {
			if err := s.pbx.Reload(actx, m); err != nil {
				return fmt.Errorf("answer reload %s: %w", m, err)
			}
		}
		return nil
	}
	return fmt.Errorf("answer mode %q not supported", mode)
}

func commandGroup(cmd events.Command) string {
	switch c := cmd.(type) {
	case *events.ClaimIP:
		return c.Group
	case *events.ReleaseIP:
		return c.Group
	case *events.AnswerPBX:
		return c.Group
	}
	return ""
}
