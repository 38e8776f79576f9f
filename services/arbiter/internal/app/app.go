// Package app wires the arbiter: one goroutine owns the pure decision core
// and feeds it the prober's transitions and heartbeats, the executors'
// results, the scheduler's permits, the replicator's reports, operator
// requests and the clock; while this replica holds the lease it persists
// the core's state, publishes decisions, and publishes commands fenced by
// the lease so that only the current leader's commands reach an executor.
// Beside it, and never in its way, the leader keeps the node registry.
package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"os"
	"reflect"
	"slices"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/daemon"
	"github.com/fanpbx/fan/services/arbiter/internal/decide"
	"github.com/fanpbx/fan/services/arbiter/internal/lease"
	"github.com/fanpbx/fan/services/arbiter/internal/registry"
	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// registryWorkers write heartbeats to the registry in parallel; a node
// always goes to the same worker, so its own heartbeats never race.
const registryWorkers = 4

// defaultTickEvery drives the core's timers that no input announces
// (stability, settle, backoff expiry). A holder's silence and a claim's
// deadline do not wait for it: the loop also ticks at the instant the core
// names (Core.Wake). It does not delay a health transition, which is
// handled as it arrives. A tick costs microseconds per group.
const defaultTickEvery = 25 * time.Millisecond

// statusRefresh rewrites group status at least this often so fanctl shows
// fresh heartbeat ages even when nothing changed.
const statusRefresh = 5 * time.Second

// Service is a configured arbiter.
type Service struct {
	cfg     Config
	log     *slog.Logger
	version string

	core   *decide.Core
	lease  *lease.Lease
	bus    *bus.Bus
	ob     *bus.Outbox // what must be recorded even while the audit stream elects
	kv     jetstream.KeyValue
	reg    *registry.Registry
	holder string // this replica's name in the lease

	lastStatus map[string]events.GroupStatus
	statusAt   time.Time
	status     *statusWriter

	// Every state in which this replica holds the lease but cannot
	// command is bounded by cfg.RestoreWithin (see README, "How it fails").
	conds *daemon.Conditions
	// restoring is set from taking the lease until its state is restored;
	// restoreEpoch is the term being restored.
	restoring    bound
	restoreEpoch uint64
	// commandEpoch is the term the core was made leader for; zero while
	// it follows. The lease flips before the main loop hears of it, so
	// the lease alone does not say the core is ready to command.
	commandEpoch uint64
	// unwritable is set while decisions cannot be persisted.
	unwritable bound
	// releasedUntil: the conditions raised before a release stay up until
	// this replica may campaign again.
	releasedUntil time.Time
	metrics       *arbiterMetrics
	state         *stateMetrics
	// watch reads the audit stream's inputs (nil: the bus's Watch); a
	// test replaces it to end it early.
	watch func(context.Context, bus.WatchOptions, bus.EventHandler) error
	// hold is the operator's leaders hold as the state bucket keeps it
	// (hold.go); trouble what keeps the leader from storing its state or
	// commands, for the steward.
	hold    *leadersHold
	trouble writeTrouble
}

// Build loads and validates the configuration; it starts nothing.
func Build(o daemon.Options) (daemon.Service, error) {
	var cfg Config
	if err := daemon.LoadConfig(o, &cfg); err != nil {
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
	core, err := decide.New(cfg.decideConfig())
	if err != nil {
		return nil, err
	}
	return &Service{cfg: cfg, log: daemon.ServiceLogger(log, cfg.Node), version: version, core: core, lastStatus: map[string]events.GroupStatus{},
		hold: &leadersHold{}}, nil
}

type input struct {
	env events.Envelope
	p   events.Decoded
	at  time.Time // when it arrived: the registry's clock
}

// Run arbitrates until ctx ends.
func (s *Service) Run(ctx context.Context) error {
	return daemon.Serve(ctx, s.cfg.Common, "arbiter", s.version, s.log, func(ctx context.Context, rt *daemon.Runtime) error {
		s.bus, s.ob = rt.Bus, rt.Outbox
		s.conds = rt.Conditions
		s.conds.Declare(condRestoreFailed, condStateUnwritable)
		s.metrics = newArbiterMetrics(rt.Metrics)
		groups := make([]string, len(s.cfg.Groups))
		for i, g := range s.cfg.Groups {
			groups[i] = g.Name
		}
		s.state = newStateMetrics(rt.Metrics, groups)
		_ = rt.Metrics.Register(newPinMetrics(s.state))
		s.restoring.within, s.unwritable.within = s.cfg.RestoreWithin.D(), s.cfg.RestoreWithin.D()
		kv, err := rt.Bus.WaitStateKV(ctx)
		if err != nil {
			return err
		}
		s.kv = kv
		host, _ := os.Hostname()
		s.holder = fmt.Sprintf("%s/%s/%d", s.cfg.Node, host, os.Getpid())
		lc := lease.Config{Cluster: s.cfg.Cluster, Holder: s.holder, TTL: s.cfg.LeaseTTL.D()}
		if s.cfg.Standby {
			p := newPrimaries(time.Now())
			stop, err := s.watchPrimaries(rt.Bus, p)
			if err != nil {
				return fmt.Errorf("subscribe to arbiter presence: %w", err)
			}
			defer stop()
			// A standby that leads keeps the lease while an operator holds
			// the leaders (fanctl leaders hold), rather than hand it to
			// the witness's replica coming back from its reboot.
			lc.MayHold = func(leading bool) bool {
				now := time.Now()
				return p.mayHoldHeld(now, leading, s.hold.inForce(now))
			}
		}
		l, err := lease.New(lc, rt.Bus, s.log)
		if err != nil {
			return err
		}
		// Every actor below is essential: an arbiter whose watch ended would
		// hold the lease deciding on nothing, so any of them ending ends the
		// service, and systemd restarts it. They are added in the order they
		// stop (daemon.Group): the decision loop below ends first, then the
		// inputs (watches, registry, weights), and the lease last, so nothing
		// is decided under a lease already given up. The presence announcer
		// and the leader steward run until the group begins to stop.
		_ = rt.Metrics.Register(newHoldMetrics(s.hold))
		g, ctx := daemon.NewGroup(ctx)
		presenceDone := make(chan struct{})
		go func(ctx context.Context) { s.announcePresence(ctx, rt.Bus); close(presenceDone) }(ctx)
		defer func() { <-presenceDone }()
		s.lease = l
		replicas := newReplicaPresence(s.cfg.Replicas, time.Now)
		stopReplicas, err := s.watchReplicas(rt.Bus, replicas)
		if err != nil {
			return fmt.Errorf("subscribe to arbiter presence: %w", err)
		}
		defer stopReplicas()
		_ = rt.Metrics.Register(replicas)
		// The system account (bus.system) serves the steward (the meta
		// leader's step-down) and the usage report (the meta group's
		// peers, the servers' certificates); closed after both stopped.
		sys := s.connectSystem()
		if sys != nil {
			defer sys.Close()
		}
		defer s.runSteward(ctx, rt, sys)()
		defer s.runUsage(ctx, rt, sys)()
		s.reg = registry.New(kv, s.cfg.Cluster, s.cfg.Registry.OfflineAfter.D(), rt.Outbox.Emit, s.log)
		if hh := s.cfg.HTTPHeartbeat; hh.Listen != "" {
			rt.Certs.Add(daemon.CertFile{Role: "http_heartbeat", Path: hh.TLS.Cert})
			stop, err := s.serveHeartbeats(hh, rt.Bus.Emit, rt.Metrics)
			if err != nil {
				return err
			}
			defer stop()
		}
		// Operator requests: every replica listens, only the leader answers
		// (a follower stays silent so that it never races the leader's reply).
		ops := make(chan *nats.Msg, 16)
		sub, err := rt.Bus.NC.Subscribe(events.AllOperatorRequests(s.cfg.Cluster), func(m *nats.Msg) {
			select {
			case ops <- m:
			default:
				s.log.Warn("operator request dropped: too many at once")
			}
		})
		if err != nil {
			return fmt.Errorf("subscribe to operator requests: %w", err)
		}
		defer func() { _ = sub.Unsubscribe() }()

		// Presence beacons arrive on core NATS many times a second per
		// node; a full buffer drops one, which only delays "heard" by a beat.
		beacons := make(chan events.Beacon, 4096)
		bsub, err := rt.Bus.NC.Subscribe(events.AllBeacons(s.cfg.Cluster), func(m *nats.Msg) {
			b, err := events.DecodeBeacon(m.Data)
			if err == nil {
				err = events.VerifyBeacon(s.cfg.Cluster, m.Subject, b)
			}
			if err != nil {
				rt.Bus.Refuse(events.RefusalReason(err), m.Subject, err, "type", "beacon")
				return
			}
			select {
			case beacons <- b:
			default:
			}
		})
		if err != nil {
			return fmt.Errorf("subscribe to presence beacons: %w", err)
		}
		defer func() { _ = bsub.Unsubscribe() }()

		inputs := make(chan input, 4096)
		changes := make(chan lease.Change, 4)
		toCore := func(env events.Envelope, p events.Decoded, _ uint64) {
			select {
			case inputs <- input{env: env, p: p}:
			case <-ctx.Done():
			}
		}
		watch := s.watch
		if watch == nil {
			watch = rt.Bus.Watch
		}
		// The inputs are read from the start announcement on, not from when
		// the watch's consumers happen to exist (on a loaded host, a second
		// later): nothing published meanwhile is missed, and a replay that
		// begins at the announcement (fanctl replay) feeds exactly what
		// this replica read.
		g.Go("watch", func(ctx context.Context) error {
			return watch(ctx, bus.WatchOptions{Since: rt.Announced(), Subjects: []string{
				events.AllHealth(s.cfg.Cluster), events.AllHeartbeats(s.cfg.Cluster),
				events.AllCommandResults(s.cfg.Cluster), events.AllReplication(s.cfg.Cluster),
				// The replicators' calls summaries: what a planned move
				// waits for, and what a move away from a holder records.
				events.AllCallsSummaries(s.cfg.Cluster),
			}}, toCore)
		})
		// A permit in force was published up to the scheduler's tick_every
		// ago: start from each group's last one, or a restarted arbiter would
		// not fail back inside an open window until the next tick.
		g.Go("watch_permits", func(ctx context.Context) error {
			return rt.Bus.Watch(ctx, bus.WatchOptions{Subjects: []string{events.AllPermits(s.cfg.Cluster)}, LastPerSubject: true}, toCore)
		})
		g.Go("registry", s.runRegistry)
		// Every replica follows the leaders hold (a standby that leads
		// keeps the lease while it holds); the leader ends it at its end.
		g.Go("watch_hold", func(ctx context.Context) error {
			return rt.Bus.WatchKV(ctx, []string{events.LeadersHoldKey(s.cfg.Cluster)}, s.hold.onKey)
		})
		g.Go("hold_keeper", func(ctx context.Context) error { s.runHoldKeeper(ctx); return nil })
		s.status = newStatusWriter(kv, s.cfg.Cluster, func(epoch uint64) bool { return l.Leading() && l.Epoch() == epoch }, s.log)
		g.Go("status", func(ctx context.Context) error { s.status.run(ctx); return nil })
		g.Go("weights", func(ctx context.Context) error {
			if !slices.ContainsFunc(s.cfg.Groups, func(g GroupConfig) bool { return g.Weights.Enabled }) {
				<-ctx.Done() // nothing to track: runWeights returns at once
				return nil
			}
			s.runWeights(ctx)
			return nil
		})
		if err := s.runNotify(ctx, g, rt, l); err != nil {
			return err
		}
		g.Go("lease", func(ctx context.Context) error { l.Run(ctx, changes); return nil })

		t := time.NewTicker(s.cfg.Policy.TickEvery.D())
		defer t.Stop()
		// wake ticks the core once more at the moment it named (Core.Wake):
		// the end of a holder's silence limit, a claim's deadline. Re-armed
		// after every input, since a beacon moves the holder's.
		wake := time.NewTimer(time.Hour)
		defer wake.Stop()
		var armed time.Time
		// heard gives the core every beacon already received before a tick
		// judges silence: select picks among ready cases at random, and on a
		// busy host a beacon that came in time can sit in the channel while
		// the timer fires; judged without it, a live holder looks silent.
		heard := func() {
			for {
				select {
				case b := <-beacons:
					s.execute(ctx, s.core.Beacon(time.Now(), b))
				default:
					return
				}
			}
		}
		rearm := func(now time.Time) {
			w := s.core.Wake(now)
			if w.Equal(armed) {
				return
			}
			armed = w
			if w.IsZero() {
				wake.Stop()
				return
			}
			wake.Reset(w.Sub(now))
		}
		// The watchdog counts the decision loop alive while it ticks; a
		// loop stuck in a publish for seconds is worth a restart.
		alive := rt.Loop("decide", 10*time.Second)
		defer alive.Done()
		for {
			select {
			case <-ctx.Done():
				// The lease's last change (stepping down) may still be
				// queued; nobody needs it now.
				go func() {
					for range changes {
					}
				}()
				return g.Wait()
			case in := <-inputs:
				// Group commit: the inputs already waiting are decided
				// with this one, and their state is persisted once before
				// any of their commands leaves. Persisting and publishing
				// the status walk every group, so one round per input made
				// a burst (a thousand nodes starting) cost groups squared.
				s.state.observed(in.p, s.commanding())
				now := time.Now()
				out := s.core.Handle(now, in.env, in.p)
				for range maxBatch - 1 {
					select {
					case in = <-inputs:
						s.state.observed(in.p, s.commanding())
						out.Emits = append(out.Emits, s.core.Handle(now, in.env, in.p).Emits...)
						continue
					default:
					}
					break
				}
				s.execute(ctx, out)
				rearm(now)
			case b := <-beacons:
				now := time.Now()
				out := s.core.Beacon(now, b)
				s.execute(ctx, out)
				// A beacon moves only its node's silence limit, and later:
				// an armed timer then fires early at worst and re-arms.
				// Re-arming walks every group, which at ten beacons a
				// second per node is the loop's largest cost; a beacon
				// that decided something, or no timer armed, re-arms.
				if armed.IsZero() || len(out.Emits) > 0 {
					rearm(now)
				}
			case m := <-ops:
				s.operate(ctx, m)
				rearm(time.Now())
			case ch, ok := <-changes:
				if ok {
					s.leadership(ctx, ch)
					rearm(time.Now())
				}
			case <-wake.C:
				armed = time.Time{}
				heard()
				now := time.Now()
				s.execute(ctx, s.core.Tick(now))
				rearm(now)
			case now := <-t.C:
				alive.Alive()
				s.retryStuck(ctx, now)
				heard()
				s.execute(ctx, s.core.Tick(now))
				s.publishStatus(now)
				rearm(now)
			}
		}
	})
}

// leadership switches the core. A new leader first restores what the
// previous one persisted, so it continues from the same holder and claim.
func (s *Service) leadership(ctx context.Context, ch lease.Change) {
	// What kept the last term from storing is not this term's.
	s.trouble.set(&s.trouble.persist, "")
	s.trouble.set(&s.trouble.command, "")
	if ch.Leading {
		s.restoring.reset()
		s.restoreEpoch = ch.Epoch
		s.tryRestore(ctx, time.Now())
		return
	}
	s.restoring.reset()
	s.unwritable.reset()
	s.commandEpoch = 0
	if err := s.core.SetLeadership(ch.Epoch, false); err != nil {
		s.log.Error("leadership change refused by the core", "epoch", ch.Epoch, "err", err)
		return
	}
	s.log.Info("leadership", "leading", false, "epoch", ch.Epoch)
}

// tryRestore is one attempt to restore the state of the term just taken
// and, if it works, to start commanding. Without the previous state this
// replica could command a second holder, so it does not command; but it
// holds the lease, so every other replica is kept from commanding too:
// after restore_within it gives the lease up (see giveUp).
func (s *Service) tryRestore(ctx context.Context, now time.Time) {
	epoch := s.restoreEpoch
	// An attempt never runs past the bound: a read that hangs (no raft
	// leader) must not stretch the time the lease is held for nothing.
	budget := s.cfg.RestoreWithin.D()
	if s.restoring.failing() {
		budget -= now.Sub(s.restoring.since)
	}
	rctx, cancel := context.WithTimeout(ctx, max(min(retryMax, budget), 50*time.Millisecond))
	st, err := s.restore(rctx)
	cancel()
	if err == nil && (!s.lease.Leading() || s.lease.Epoch() != epoch) {
		s.restoring.reset()
		s.conds.Clear(condRestoreFailed)
		s.log.Warn("restore finished after the lease was lost; not commanding", "epoch", epoch)
		return
	}
	if err != nil {
		over := s.restoring.failed(now)
		s.conds.Raise(condRestoreFailed, fmt.Sprintf("holding the lease (epoch %d) without commanding since %s: %v",
			epoch, s.restoring.since.UTC().Format(time.RFC3339Nano), err))
		s.metrics.restoreFailures.Inc()
		if over {
			s.log.Error("cannot restore arbiter state within restore_within; releasing the lease", "epoch", epoch,
				"restore_within", s.cfg.RestoreWithin.D().String(), "err", err)
			s.giveUp(ctx, now, "restore_failed")
			return
		}
		s.log.Warn("cannot restore arbiter state; not commanding, retrying", "epoch", epoch,
			"retry_in", s.restoring.next.Sub(now).String(), "err", err)
		return
	}
	s.restoring.reset()
	s.conds.Clear(condRestoreFailed)
	if err := s.core.SetLeadership(epoch, true); err != nil {
		s.log.Error("leadership change refused by the core", "epoch", epoch, "err", err)
		return
	}
	s.commandEpoch = epoch
	s.log.Info("leadership", "leading", true, "epoch", epoch)
	s.recordTerm(epoch)
	s.reissueUnsentClaims(ctx, st)
}

// retryStuck runs the retries that are due, and clears the conditions of a
// release once this replica may campaign again.
func (s *Service) retryStuck(ctx context.Context, now time.Time) {
	if s.restoring.due(now) {
		s.tryRestore(ctx, now)
	}
	if s.unwritable.due(now) {
		if err := s.persist(ctx); err != nil {
			s.persistFailed(ctx, now, err)
		} else {
			s.persisted()
		}
	}
	if !s.releasedUntil.IsZero() && !now.Before(s.releasedUntil) {
		s.releasedUntil = time.Time{}
		if !s.restoring.failing() {
			s.conds.Clear(condRestoreFailed)
		}
		if !s.unwritable.failing() {
			s.conds.Clear(condStateUnwritable)
		}
	}
}

// giveUp releases the lease so that another replica can take over, and
// keeps this one from campaigning for a lease TTL (long enough for every
// other replica to campaign at least twice).
func (s *Service) giveUp(ctx context.Context, now time.Time, reason string) {
	epoch := s.lease.Epoch()
	s.restoring.reset()
	s.unwritable.reset()
	holdOff := s.cfg.LeaseTTL.D()
	// Counted first: once the lease is gone another replica, or an
	// operator reading /metrics, may look, and the count must be there.
	s.metrics.releases.WithLabelValues(reason).Inc()
	s.lease.Release(ctx, holdOff, reason)
	s.releasedUntil = now.Add(holdOff)
	s.commandEpoch = 0
	if err := s.core.SetLeadership(epoch, false); err != nil {
		s.log.Error("leadership change refused by the core", "epoch", epoch, "err", err)
	}
}

// commanding reports whether this replica leads and has restored its term:
// only then does it answer operators and write group status (a follower's
// view written there would overwrite the holder a successor may need).
func (s *Service) commanding() bool {
	return s.commandEpoch != 0 && s.lease.Leading() && s.lease.Epoch() == s.commandEpoch
}

func (s *Service) restore(ctx context.Context) (decide.State, error) {
	var st decide.State
	// Through the bucket's raft leader, not a direct get: any replica may
	// answer one, and a replica on a host just back from a partition
	// answers with the state from before it, the holder the last term
	// moved the group away from. A new leader that restored that would
	// write it back as the group's status and take the address from the
	// node that holds it.
	raw, err := s.bus.LeaderGetKV(ctx, events.StateBucket, events.ArbiterStateKey(s.cfg.Cluster))
	if err != nil {
		return st, fmt.Errorf("read arbiter state: %w", err)
	}
	if raw == nil {
		return st, nil
	}
	// A record that cannot be decoded or restored is corrupt: it will not
	// get better by reading it again, and a leader that refuses to command
	// until it does is stuck for good. Start from a view rebuilt from the
	// group status instead (see rebuild).
	if err := json.Unmarshal(raw, &st); err != nil {
		return s.rebuild(ctx, fmt.Errorf("decode arbiter state (%d bytes): %w", len(raw), err))
	}
	// Not knowing whether the outstanding claim was answered, this replica
	// does not command: the restore is tried again (within restore_within).
	if err := s.replayClaimResults(ctx, st); err != nil {
		return st, err
	}
	if err := s.core.Restore(st); err != nil {
		return s.rebuild(ctx, fmt.Errorf("restore arbiter state: %w", err))
	}
	return st, nil
}

// reissueUnsentClaims looks for each restored outstanding claim in the
// command stream. The previous leader persists before it publishes, so a
// claim it recorded may never have been sent; and since this replica's
// lease is now the last word on the lease subject, the server's fence
// refuses anything the previous leader might still try. A claim that is
// not in the stream now never will be: the core issues the move again
// instead of waiting out the claim timeout with nobody holding. When the
// stream cannot be read the claim is left to the timeout, which is slow
// but safe.
func (s *Service) reissueUnsentClaims(ctx context.Context, st decide.State) {
	for _, g := range st.Groups {
		cl := g.Claim
		if cl == nil || !time.Now().Before(cl.Deadline) {
			continue
		}
		sent, err := s.claimInStream(ctx, *cl)
		if err != nil {
			s.log.Warn("restore: cannot tell whether the outstanding claim was sent; waiting for its deadline",
				"group", g.Name, "node", cl.Node, "command_id", cl.CommandID, "err", err)
			continue
		}
		if sent {
			continue
		}
		s.log.Warn("restore: the previous leader's claim never reached the bus; issuing the move again",
			"group", g.Name, "node", cl.Node, "command_id", cl.CommandID)
		s.execute(ctx, s.core.ClaimUnsent(time.Now(), cl.CommandID))
	}
}

// claimInStream reports whether the claim is stored in the command stream.
// Commands leave the stream at their deadline (message TTL), so only the
// few live claims for that node are walked.
func (s *Service) claimInStream(ctx context.Context, cl decide.Claim) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	st, err := s.bus.JS.Stream(ctx, bus.CommandsStream)
	if err != nil {
		return false, fmt.Errorf("open the command stream: %w", err)
	}
	subject := events.CommandSubject(s.cfg.Cluster, cl.Node, events.VerbClaim)
	for seq := uint64(1); ; {
		m, err := st.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(subject))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return false, nil
		}
		if err != nil {
			return false, fmt.Errorf("read claims on %s from sequence %d: %w", subject, seq, err)
		}
		if m.Header.Get(jetstream.MsgIDHeader) == cl.CommandID {
			return true, nil
		}
		seq = m.Sequence + 1
	}
}

// replayClaimResults feeds the core, still following, the results already
// in the trail for claims the previous leader left outstanding. A replica
// that starts after the previous leader died never saw them (it reads new
// events only), and would otherwise time out a claim that was in fact
// applied, releasing a healthy holder: a needless outage and move.
func (s *Service) replayClaimResults(ctx context.Context, st decide.State) error {
	for _, g := range st.Groups {
		if g.Claim == nil {
			continue
		}
		// Any result to this claim comes after it was issued, which is
		// at most the command TTL before its deadline. Every result stored
		// since then is read, as many as the consumer says are pending when
		// it is made (none: nothing to wait for): a result missed here
		// would make the claim look unanswered, and the core would move a
		// group its claimant holds.
		since := g.Claim.Deadline.Add(-2 * time.Minute)
		cons, err := s.bus.JS.OrderedConsumer(ctx, bus.EventsStream, jetstream.OrderedConsumerConfig{
			FilterSubjects: []string{events.CommandResultSubject(s.cfg.Cluster, g.Claim.Node)},
			DeliverPolicy:  jetstream.DeliverByStartTimePolicy, OptStartTime: &since,
		})
		if err != nil {
			return fmt.Errorf("read the results of group %s's outstanding claim on %s: %w", g.Name, g.Claim.Node, err)
		}
		info, err := cons.Info(ctx)
		if err != nil {
			return fmt.Errorf("read the results of group %s's outstanding claim on %s: %w", g.Name, g.Claim.Node, err)
		}
		for left := info.NumPending; left > 0; {
			batch, err := cons.Fetch(int(min(left, 256)), jetstream.FetchMaxWait(time.Second))
			if err != nil {
				return fmt.Errorf("read the results of group %s's outstanding claim on %s: %w", g.Name, g.Claim.Node, err)
			}
			n := uint64(0)
			for m := range batch.Messages() {
				n++
				env, p, _ := s.bus.DecodeFrom(m.Subject(), m.Data())
				if r, ok := p.(*events.CommandResult); ok && r.CommandID == g.Claim.CommandID {
					s.core.Handle(time.Now(), env, p)
					s.log.Info("restore: outstanding claim already answered", "group", g.Name, "node", r.Node, "outcome", r.Outcome)
				}
			}
			if err := batch.Error(); err != nil {
				return fmt.Errorf("read the results of group %s's outstanding claim on %s: %w", g.Name, g.Claim.Node, err)
			}
			if n == 0 && ctx.Err() != nil {
				return fmt.Errorf("read the results of group %s's outstanding claim on %s: %w", g.Name, g.Claim.Node, ctx.Err())
			}
			left -= min(n, left)
		}
	}
	return nil
}

// operate answers an operator request if this replica leads. Who asked is
// the operator whose subject the request arrived on (the bus lets each
// operator's credentials publish only their own), never a name the request
// gives itself. The request is recorded (an OperatorAction, stage
// requested) before anything is done, and refused if that record cannot be
// stored: nothing an operator asks is ever applied without a trace. The
// outcome, accepted or refused, is recorded again, citing the request, and
// the decisions it causes cite that.
func (s *Service) operate(ctx context.Context, m *nats.Msg) {
	if !s.commanding() {
		return // the leader answers; a follower's "not me" would race it
	}
	reply := func(r events.OperatorReply) {
		r.Leader, r.Epoch = s.holder, s.lease.Epoch()
		b, _ := json.Marshal(r)
		if err := m.Respond(b); err != nil {
			s.log.Warn("operator reply failed", "err", err)
		}
	}
	refuse := func(op string, err error) {
		s.log.Warn("operator request refused", "operator", op, "subject", m.Subject, "err", err)
		reply(events.OperatorReply{Message: "refused: " + err.Error()})
	}
	op, err := events.OperatorFromSubject(s.cfg.Cluster, m.Subject)
	if err != nil {
		s.bus.Refuse(events.RefusedSubject, m.Subject, err, "type", "operator_request")
		reply(events.OperatorReply{Message: "refused: " + err.Error()})
		return
	}
	if len(m.Data) > events.MaxRequestBytes {
		refuse(op, fmt.Errorf("request is %d bytes, at most %d (a reason is at most %d characters)", len(m.Data), events.MaxRequestBytes, events.MaxReasonChars))
		return
	}
	var req events.OperatorRequest
	if err := json.Unmarshal(m.Data, &req); err != nil {
		refuse(op, fmt.Errorf("malformed request: %w", err))
		return
	}
	if req.Operator != op {
		// Not an error: the name a request gives itself is only what the
		// client believed; the subject is who it is.
		s.log.Info("operator request names someone else; recorded as its subject's operator", "operator", op, "claimed_operator", req.Operator)
	}
	req.Operator = op
	if req.Cancel && req.Node == "" {
		// The record names the move being cancelled, so that a reader
		// that requires a switchover's node still takes it.
		req.Node = s.core.PlannedTarget(req.Group)
	}
	if err := req.Validate(); err != nil {
		refuse(op, err)
		return
	}
	requested := events.OperatorAction{Verb: req.Verb, Group: req.Group, Node: req.Node, Reason: req.Reason, Operator: op,
		Comment: req.Comment, Outcome: "requested; not yet decided", Stage: events.StageRequested,
		Drain: req.Drain, WithinMS: req.WithinMS, Cancel: req.Cancel, ForMS: req.ForMS, Until: req.Until, Server: req.Server}
	rctx, cancel := context.WithTimeout(ctx, operatorRecordTimeout)
	renv, err := s.bus.Emit(rctx, requested, events.WithEpoch(s.lease.Epoch()))
	cancel()
	if err != nil {
		refuse(op, fmt.Errorf("the request could not be recorded in the audit trail, so nothing was done: %w", err))
		return
	}
	if req.Verb.ForLeaders() {
		// The leaders hold is the steward's, not the decision core's.
		r := s.operateLeaders(ctx, req, renv)
		reply(r)
		return
	}
	id := uuid.Must(uuid.NewV7()).String()
	rep, out := s.core.Operate(time.Now(), decide.Request{ID: id, RequestedID: renv.ID, OperatorRequest: req})
	if len(out.Emits) == 0 {
		reply(events.OperatorReply{Message: rep.Message, EventID: renv.ID})
		return
	}
	published := s.execute(ctx, out)
	r := events.OperatorReply{Accepted: rep.Accepted, Message: rep.Message, EventID: id, Decisions: rep.Decisions}
	if !published {
		r.Message += " (warning: not everything could be published; see the arbiter's log)"
	}
	s.log.Info("operator action", "verb", req.Verb, "group", req.Group, "node", req.Node, "operator", op,
		"comment", req.Comment, "accepted", rep.Accepted, "outcome", rep.Message, "event_id", id, "requested_id", renv.ID)
	reply(r)
}

// maxBatch bounds the inputs decided in one round before their state is
// persisted and their commands published, so a flood of inputs cannot hold
// the first one's commands back for long.
const maxBatch = 256

// operatorRecordTimeout bounds the wait for the request's record to be
// stored; the operator's client waits a few seconds for the answer.
const operatorRecordTimeout = 2 * time.Second

// runRegistry keeps the node registry while this replica leads: its own
// watch on heartbeats (so registry writes never delay a decision), sharded
// writers, and the sweeper. It returns only when ctx ends or the heartbeat
// watch ends (with the watch's error): a replica leading without that watch
// would sweep every node offline, so it belongs to the run group.
func (s *Service) runRegistry(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var shards [registryWorkers]chan input
	done := make(chan struct{}, registryWorkers)
	for i := range shards {
		shards[i] = make(chan input, 1024)
		go func(in <-chan input) {
			defer func() { done <- struct{}{} }()
			for {
				select {
				case <-ctx.Done():
					return
				case hb := <-in:
					if !s.lease.Leading() {
						continue
					}
					wctx, cancel := context.WithTimeout(ctx, 2*time.Second)
					err := s.reg.Heartbeat(wctx, hb.env, hb.p.(*events.NodeHeartbeat), hb.at)
					cancel()
					if err != nil && ctx.Err() == nil {
						s.log.Warn("registry heartbeat write failed", "node", hb.env.Source.Node, "err", err)
					}
				}
			}
		}(shards[i])
	}
	watchEnded := make(chan error, 1)
	go func() {
		watchEnded <- s.bus.Watch(ctx, bus.WatchOptions{Subjects: []string{events.AllHeartbeats(s.cfg.Cluster)}},
			func(env events.Envelope, p events.Decoded, _ uint64) {
				hb, ok := p.(*events.NodeHeartbeat)
				if !ok {
					return
				}
				h := fnv.New32a()
				h.Write([]byte(hb.Node))
				select {
				case shards[h.Sum32()%registryWorkers] <- input{env: env, p: hb, at: time.Now()}:
				default:
					// Behind by a thousand heartbeats: the next one carries
					// the same facts, so dropping this one loses only a count.
					s.log.Warn("registry behind: heartbeat dropped", "node", hb.Node)
				}
			})
	}()
	t := time.NewTicker(s.cfg.Registry.SweepEvery.D())
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			for range registryWorkers {
				<-done
			}
			<-watchEnded
			return nil
		case err := <-watchEnded:
			cancel()
			for range registryWorkers {
				<-done
			}
			if err == nil {
				err = daemon.ErrEssentialExited
			}
			return fmt.Errorf("registry heartbeat watch: %w", err)
		case now := <-t.C:
			if !s.lease.Leading() {
				continue
			}
			sctx, cancel := context.WithTimeout(ctx, s.cfg.Registry.SweepEvery.D())
			if _, err := s.reg.Sweep(sctx, now); err != nil && ctx.Err() == nil {
				s.log.Warn("registry sweep incomplete", "err", err)
			}
			cancel()
		}
	}
}

// execute persists, then publishes, what the core decided, and reports
// whether everything was published. State goes to the bucket before
// anything leaves, so a successor never forgets a claim that may already
// be executing, nor an operator's freeze or standby. Commands are published
// here, fenced by the lease, and their failure is the core's to handle
// (claim timeout); decisions and every other record go to the outbox, which
// stores them in order once the audit stream can, without holding up the
// next decision while it elects a leader.
func (s *Service) execute(ctx context.Context, out decide.Output) bool {
	if len(out.Emits) == 0 {
		return true
	}
	if err := s.persist(ctx); err != nil {
		s.log.Error("persist arbiter state failed; nothing published", "err", err)
		s.persistFailed(ctx, time.Now(), err)
		return false
	}
	s.persisted()
	ok := true
	src := s.bus.Source()
	for _, e := range out.Emits {
		env, err := events.New(src, s.cfg.Cluster, e.Payload, e.Options...)
		if err != nil {
			s.log.Error("core produced an invalid event", "type", e.Payload.EventType(), "err", err)
			continue
		}
		if cmd, ok := e.Payload.(events.Command); ok {
			pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			err = s.lease.PublishCommand(pctx, env, cmd)
			cancel()
		} else {
			err = s.ob.PostEnvelope("", env, e.Payload)
		}
		if _, isCmd := e.Payload.(events.Command); isCmd && s.lease.Leading() {
			// While it still leads, a command the bus would not store is
			// the steward's business too (a leaders hold may have to end).
			why := ""
			if err != nil {
				why = fmt.Sprintf("a command could not be stored at %s: %v", time.Now().UTC().Format(time.RFC3339), err)
			}
			s.trouble.set(&s.trouble.command, why)
		}
		if err != nil {
			// An unpublished command is caught by the core's claim timeout.
			s.log.Error("publish failed", "type", env.Type, "event_id", env.ID, "err", err)
			ok = false
			continue
		}
		if d, ok := e.Payload.(events.ArbiterDecision); ok {
			s.state.decided(d)
			s.log.Info("decision", "group", d.Group, "action", d.Action, "from", d.From, "to", d.To, "reason", d.Reason, "event_id", env.ID)
		}
	}
	s.publishStatus(time.Now())
	return ok
}

func (s *Service) persist(ctx context.Context) error {
	b, err := stateRecord(s.core.Snapshot())
	if err != nil {
		return err
	}
	pctx, cancel := context.WithTimeout(ctx, min(2*time.Second, s.cfg.RestoreWithin.D()))
	defer cancel()
	_, err = s.kv.Put(pctx, events.ArbiterStateKey(s.cfg.Cluster), b)
	return err
}

// stateRecord encodes the state as it is persisted (before every command)
// and recorded at a term's start: without the per-node view, which restore
// ignores and the group status carries. With it, a thousand nodes made the
// record about 2.5 times larger, and re-encoding and storing it on every
// decision outlasted restore_within on a loaded host.
func stateRecord(st decide.State) ([]byte, error) {
	for i := range st.Groups {
		st.Groups[i].Nodes = nil
	}
	return json.Marshal(st)
}

// persistFailed bounds a leader that cannot persist: it publishes nothing
// (a command never leaves without its state), so it retries the write;
// past restore_within it gives the lease up.
func (s *Service) persistFailed(ctx context.Context, now time.Time, err error) {
	if !s.lease.Leading() {
		s.unwritable.reset()
		return
	}
	over := s.unwritable.failed(now)
	why := fmt.Sprintf("cannot persist decisions since %s: %v", s.unwritable.since.UTC().Format(time.RFC3339Nano), err)
	s.conds.Raise(condStateUnwritable, why)
	s.trouble.set(&s.trouble.persist, why)
	if over {
		s.log.Error("cannot persist arbiter state within restore_within; releasing the lease",
			"restore_within", s.cfg.RestoreWithin.D().String(), "err", err)
		s.giveUp(ctx, now, "state_unwritable")
	}
}

func (s *Service) persisted() {
	if s.unwritable.failing() {
		s.log.Info("arbiter state persisted again")
	}
	s.trouble.set(&s.trouble.persist, "")
	s.unwritable.reset()
	if s.releasedUntil.IsZero() {
		s.conds.Clear(condStateUnwritable)
	}
}

// publishStatus hands the core's view to the metrics and, on the leader,
// to the group status: one snapshot for both.
func (s *Service) publishStatus(now time.Time) {
	snap := s.core.Snapshot()
	s.writeStatus(snap, now)
	s.state.publish(snap, s.commanding())
}

// writeStatus publishes each group's status for fanctl and for executors
// restarting, when it changed or has grown stale. Only the leader writes,
// through the status writer (the loop never waits for the bucket).
func (s *Service) writeStatus(snap decide.State, now time.Time) {
	if !s.commanding() {
		return
	}
	refresh := now.Sub(s.statusAt) >= statusRefresh
	for i, g := range snap.Groups {
		st := events.GroupStatus{Group: g.Name, Addresses: s.cfg.Groups[i].Addresses, Holder: g.Holder, Epoch: snap.Epoch,
			Since: g.LastMove, Nodes: map[string]events.NodeStatus{}, Frozen: g.Frozen, Situation: g.Situation, NeedsHuman: g.NeedsHuman, MovesLastHour: movesWithin(g.Moves, now)}
		if g.Permit != nil && now.Before(g.Permit.ValidUntil) && !now.Before(g.Permit.ValidFrom) {
			st.PermitUntil = g.Permit.ValidUntil
		}
		if p := g.Planned; p != nil {
			st.Planned = &events.PlannedStatus{PlannedFacts: p.PlannedFacts, GaveUp: p.GaveUp}
		}
		st.Pin = decide.PinStatus(g)
		for prio, n := range g.Nodes {
			st.Nodes[n.Node] = events.NodeStatus{Health: n.Health, HealthSince: n.HealthSince, LastHeartbeat: n.LastHeartbeat, Silent: n.Silent, Priority: prio,
				Standby: n.Standby, Eligible: n.Eligible}
		}
		if !refresh && sameStatus(s.lastStatus[g.Name], st) {
			continue
		}
		st.UpdatedAt = now
		s.status.post(st)
		s.lastStatus[g.Name] = st
	}
	if refresh {
		s.statusAt = now
	}
}

func movesWithin(moves []time.Time, now time.Time) int {
	n := 0
	for _, m := range moves {
		if now.Sub(m) < time.Hour {
			n++
		}
	}
	return n
}

// sameStatus ignores heartbeat times, which change every second. It runs
// for every group at every tick, so it compares the nodes in place rather
// than comparing copies (which was most of what the arbiter allocated).
func sameStatus(a, b events.GroupStatus) bool {
	if len(a.Nodes) != len(b.Nodes) {
		return false
	}
	for n, x := range a.Nodes {
		y, ok := b.Nodes[n]
		x.LastHeartbeat, y.LastHeartbeat = time.Time{}, time.Time{}
		if !ok || x != y {
			return false
		}
	}
	a.UpdatedAt, b.UpdatedAt = time.Time{}, time.Time{}
	a.Nodes, b.Nodes = nil, nil
	return reflect.DeepEqual(a, b)
}

// recordTerm stores, ahead of this term's first decision, the state the
// term began from (as restored: an outstanding claim the trail had already
// answered is confirmed), so that a replay of the decisions can begin here
// (fanctl replay) and not only at an arbiter's start. The per-node view is
// left out: it is informational, and the replay rebuilds it from the trail.
func (s *Service) recordTerm(epoch uint64) {
	b, err := stateRecord(s.core.Snapshot())
	if err == nil {
		_, err = s.ob.Post("", events.ArbiterTerm{State: b, Input: s.core.Input(), InputAudit: s.core.InputAudit(),
			InputLive: s.core.InputLive(), Since: s.core.FirstInput(), Policy: s.core.ConfigDigest()}, events.WithEpoch(epoch))
	}
	if err != nil {
		s.log.Warn("term start not recorded: a replay cannot begin at this term", "epoch", epoch, "err", err)
	}
}
