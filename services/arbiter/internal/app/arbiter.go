package app

import (
	"context"
	"fmt"
	"os"
	"sync/atomic"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/daemon"
	"github.com/fanpbx/fan/services/arbiter/internal/lease"
	"github.com/fanpbx/fan/services/arbiter/internal/notify"
	"github.com/fanpbx/fan/services/arbiter/internal/registry"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
)

// arbiter is a Service on the runtime's bus. newArbiter sets every field
// (the decision loop's own state aside) or fails, before anything of its
// own runs; its actors then only read them.
type arbiter struct {
	*Service
	rt     *daemon.Runtime
	bus    *bus.Bus
	ob     *bus.Outbox // what must be recorded even while the audit stream elects
	kv     jetstream.KeyValue
	reg    *registry.Registry
	lease  *lease.Lease
	holder string // this replica's name in the lease

	// Every state in which this replica holds the lease but cannot
	// command is bounded by cfg.RestoreWithin (see README, "How it fails").
	conds   *daemon.Conditions
	metrics *arbiterMetrics
	state   *stateMetrics
	status  *statusWriter
	// notifier runs the notify hooks; nil when none is configured.
	notifier *notify.Notifier
	// sys is the system account's connection (bus.system; nil: none). It
	// serves the steward (the meta leader's step-down) and the usage
	// report (the meta group's peers, the servers' certificates).
	sys *nats.Conn
	// watchInputs reads the audit stream's inputs: the bus's Watch, unless
	// a test gave the Service its own.
	watchInputs func(context.Context, bus.WatchOptions, bus.EventHandler) error
	// hold is the operator's leaders hold as the state bucket keeps it
	// (hold.go); trouble what keeps the leader from storing its state or
	// commands, for the steward.
	hold    *leadersHold
	trouble writeTrouble

	// What the decision loop reads besides the clock: the audit stream's
	// inputs, presence beacons, operator requests and the lease's changes.
	inputs  chan input
	beacons chan events.Beacon
	ops     chan *nats.Msg
	changes chan lease.Change

	// release undoes what newArbiter acquired (close).
	release undo

	// tickedAt is the moment (unix nanoseconds) of the decision loop's
	// last tick of the core, set once what it decided is published: a
	// test that proves nothing was decided waits for a tick past the
	// moment something would have been, not for a time it guesses.
	tickedAt atomic.Int64

	// The rest is the decision loop's, read and written by its goroutine only.
	lastStatus map[string]events.GroupStatus
	statusAt   time.Time
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
}

type input struct {
	env events.Envelope
	p   events.Decoded
	at  time.Time // when it arrived: the registry's clock
}

// undo collects what a constructor acquired, to release it last first
// when a later step fails or its owner closes.
type undo []func()

func (u *undo) add(f func()) { *u = append(*u, f) }

func (u undo) run() {
	for i := len(u) - 1; i >= 0; i-- {
		u[i]()
	}
}

// newArbiter builds the arbiter on rt: it waits for the state bucket,
// makes the lease, and subscribes to what core NATS carries (presence,
// operator requests, beacons). It starts no goroutine of its own: run does.
func (s *Service) newArbiter(ctx context.Context, rt *daemon.Runtime) (_ *arbiter, err error) {
	var rel undo
	defer func() {
		if err != nil {
			rel.run()
		}
	}()
	rt.Conditions.Declare(condRestoreFailed, condStateUnwritable)
	metrics := newArbiterMetrics(rt.Metrics)
	state := newStateMetrics(rt.Metrics, s.cfg.groupNames())
	_ = rt.Metrics.Register(newPinMetrics(state))
	kv, err := rt.Bus.WaitStateKV(ctx)
	if err != nil {
		return nil, err
	}
	host, _ := os.Hostname()
	holder := fmt.Sprintf("%s/%s/%d", s.cfg.Node, host, os.Getpid())
	hold := &leadersHold{}
	l, err := s.newLease(rt.Bus, holder, hold, &rel)
	if err != nil {
		return nil, err
	}
	_ = rt.Metrics.Register(newHoldMetrics(hold))
	if err := s.watchAllReplicas(rt.Bus, rt.Metrics, &rel); err != nil {
		return nil, err
	}
	sys := s.connectSystem()
	if sys != nil {
		rel.add(sys.Close)
	}
	n, err := s.newNotifier(ctx, kv, l, rt.Metrics)
	if err != nil {
		return nil, err
	}
	ops, err := s.subscribeOperators(rt.Bus, &rel)
	if err != nil {
		return nil, err
	}
	beacons, err := s.subscribeBeacons(rt.Bus, &rel)
	if err != nil {
		return nil, err
	}
	watch := s.watch
	if watch == nil {
		watch = rt.Bus.Watch
	}
	within := s.cfg.RestoreWithin.D()
	return &arbiter{
		Service:     s,
		rt:          rt,
		bus:         rt.Bus,
		ob:          rt.Outbox,
		kv:          kv,
		reg:         registry.New(kv, s.cfg.Cluster, s.cfg.Registry.OfflineAfter.D(), rt.Outbox.Emit, s.log),
		lease:       l,
		holder:      holder,
		conds:       rt.Conditions,
		metrics:     metrics,
		state:       state,
		status:      newStatusWriter(kv, s.cfg.Cluster, func(epoch uint64) bool { return l.Leading() && l.Epoch() == epoch }, s.log),
		notifier:    n,
		sys:         sys,
		watchInputs: watch,
		hold:        hold,
		inputs:      make(chan input, 4096),
		beacons:     beacons,
		ops:         ops,
		changes:     make(chan lease.Change, 4),
		release:     rel,
		lastStatus:  map[string]events.GroupStatus{},
		restoring:   bound{within: within},
		unwritable:  bound{within: within},
	}, nil
}

// close releases what newArbiter acquired, once its actors have stopped.
func (a *arbiter) close() { a.release.run() }

// groupNames are the configured groups' names, in order.
func (c *Config) groupNames() []string {
	names := make([]string, len(c.Groups))
	for i, g := range c.Groups {
		names[i] = g.Name
	}
	return names
}

// newLease makes this replica's lease. A standby also follows the other
// replicas' presence, to hand the lease back to a primary that returns.
func (s *Service) newLease(b *bus.Bus, holder string, hold *leadersHold, rel *undo) (*lease.Lease, error) {
	lc := lease.Config{Cluster: s.cfg.Cluster, Holder: holder, TTL: s.cfg.LeaseTTL.D()}
	if s.cfg.Standby {
		p := newPrimaries(time.Now())
		stop, err := s.watchPrimaries(b, p)
		if err != nil {
			return nil, fmt.Errorf("subscribe to arbiter presence: %w", err)
		}
		rel.add(stop)
		// A standby that leads keeps the lease while an operator holds
		// the leaders (fanctl leaders hold), rather than hand it to
		// the witness's replica coming back from its reboot.
		lc.MayHold = func(leading bool) bool {
			now := time.Now()
			return p.mayHoldHeld(now, leading, hold.inForce(now))
		}
	}
	return lease.New(lc, b, s.log)
}

// watchAllReplicas exports which of the configured replicas are heard.
func (s *Service) watchAllReplicas(b *bus.Bus, reg prometheus.Registerer, rel *undo) error {
	replicas := newReplicaPresence(s.cfg.Replicas, time.Now)
	stop, err := s.watchReplicas(b, replicas)
	if err != nil {
		return fmt.Errorf("subscribe to arbiter presence: %w", err)
	}
	rel.add(stop)
	_ = reg.Register(replicas)
	return nil
}

// subscribeOperators takes operator requests for the decision loop: every
// replica listens, only the leader answers (a follower stays silent so
// that it never races the leader's reply).
func (s *Service) subscribeOperators(b *bus.Bus, rel *undo) (chan *nats.Msg, error) {
	ops := make(chan *nats.Msg, 16)
	sub, err := b.NC.Subscribe(events.AllOperatorRequests(s.cfg.Cluster), func(m *nats.Msg) {
		select {
		case ops <- m:
		default:
			s.log.Warn("operator request dropped: too many at once")
		}
	})
	if err != nil {
		return nil, fmt.Errorf("subscribe to operator requests: %w", err)
	}
	rel.add(func() { _ = sub.Unsubscribe() })
	return ops, nil
}

// subscribeBeacons takes presence beacons for the decision loop. They
// arrive on core NATS many times a second per node; a full buffer drops
// one, which only delays "heard" by a beat.
func (s *Service) subscribeBeacons(b *bus.Bus, rel *undo) (chan events.Beacon, error) {
	beacons := make(chan events.Beacon, 4096)
	sub, err := b.NC.Subscribe(events.AllBeacons(s.cfg.Cluster), func(m *nats.Msg) {
		bc, err := events.DecodeBeacon(m.Data)
		if err == nil {
			err = events.VerifyBeacon(s.cfg.Cluster, m.Subject, bc)
		}
		if err != nil {
			b.Refuse(events.RefusalReason(err), m.Subject, err, "type", "beacon")
			return
		}
		select {
		case beacons <- bc:
		default:
		}
	})
	if err != nil {
		return nil, fmt.Errorf("subscribe to presence beacons: %w", err)
	}
	rel.add(func() { _ = sub.Unsubscribe() })
	return beacons, nil
}
