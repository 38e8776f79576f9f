// Package ipexec is the IP executor (executor: ip), the ipmover's default:
// under the command contract (package execute, which reads this node's
// commands and applies each at most once, only under a current epoch and
// before its deadline) it claims and releases floating addresses, keeps the interface's floating addresses in
// line with what it was told (a level-triggered reconcile loop), watches the
// LAN for another MAC using them, makes the PBX answer on a claimed address
// and proves it with SIP OPTIONS, and reports every outcome with timings.
package ipexec

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/vishvananda/netns"

	"github.com/fanpbx/fan/pkg/ami"
	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/daemon"
	"github.com/fanpbx/fan/services/ipmover/internal/allow"
	"github.com/fanpbx/fan/services/ipmover/internal/announce"
	"github.com/fanpbx/fan/services/ipmover/internal/answer"
	"github.com/fanpbx/fan/services/ipmover/internal/busloss"
	"github.com/fanpbx/fan/services/ipmover/internal/conflict"
	"github.com/fanpbx/fan/services/ipmover/internal/execute"
	"github.com/fanpbx/fan/services/ipmover/internal/fence"
	"github.com/fanpbx/fan/services/ipmover/internal/gateway"
	"github.com/fanpbx/fan/services/ipmover/internal/keeper"
	"github.com/fanpbx/fan/services/ipmover/internal/reconcile"
	"github.com/fanpbx/fan/services/ipmover/internal/sysctl"
	"github.com/fanpbx/fan/services/ipmover/internal/vip"
)

// Service is a configured ipmover.
type Service struct {
	cfg     Config
	log     *slog.Logger
	version string
	// ns, when open, is the network namespace the interface lives in (labs
	// and tests run several executors in one process); otherwise the
	// process's own.
	ns netns.NsHandle

	fence    *fence.Store
	allow    *allow.List
	contract *execute.Contract
	addrs    *vip.Manager
	link     *announce.Link
	loop     *reconcile.Loop
	gw       *gateway.Gateway
	answerer answer.Answerer
	m        *metrics

	// keeper keeps the dialogs of the calls adopted at claims (calls.keep);
	// nil when calls are not kept. The calls bucket is opened on first use.
	keeper      *keeper.Keeper
	callsMu     sync.Mutex
	callsBucket jetstream.KeyValue
	openCalls   func(context.Context) (jetstream.KeyValue, error)
	// callsReadGate, when set (tests), holds every read of call records
	// until it is closed: a bus slower than the claim.
	callsReadGate <-chan struct{}
	// left names the groups where this node left kept records at a
	// release, since when; leftSwept when each was last looked at.
	leftMu    sync.Mutex
	left      map[string]time.Time
	leftSwept map[string]time.Time

	pub      publisher
	watch    func(context.Context, bus.WatchOptions, bus.EventHandler) error // the audit stream, for release results
	kv       conflict.ReadKey
	listKeys func(context.Context) ([]string, error) // group status keys
	bg       sync.WaitGroup                          // event publications and adoptions in flight
	conds    *daemon.Conditions
	// busChecksFailed counts the bus-loss policy's failed checks: how long
	// the policy has seen the bus gone, in checks rather than in time, for
	// a test that proves it held on.
	busChecksFailed atomic.Int64
	// resyncRetry wakes runResyncRetries after an incomplete re-sync.
	resyncRetry chan string
	// bgCtx ends the background work (reads of call records) at stop.
	bgCtx          context.Context
	stopBackground context.CancelFunc

	// act serialises changes of what is held (commands, conflict yields,
	// bus-loss release, re-sync); mu guards the maps.
	act    sync.Mutex
	mu     sync.Mutex
	claims map[string]conflict.Claim
	groups map[string][]netip.Prefix // every group ever seen, to its prefixes
	queued []events.AddressCorrection
}

// publisher is what the service needs from the bus to report (*bus.Bus).
type publisher interface {
	Emit(ctx context.Context, p events.Payload, opts ...events.Option) (events.Envelope, error)
}

// New builds an ipmover from a validated configuration.
func New(cfg Config, log *slog.Logger, version string) *Service {
	al, err := cfg.allowList()
	if err != nil {
		al = &allow.List{} // Validate refuses such a file; allow nothing
	}
	bgCtx, stop := context.WithCancel(context.Background())
	return &Service{cfg: cfg, log: daemon.ServiceLogger(log, cfg.Node), version: version, ns: netns.None(), allow: al,
		claims: map[string]conflict.Claim{}, groups: map[string][]netip.Prefix{}, bgCtx: bgCtx, stopBackground: stop}
}

// open prepares everything that touches the node, before the bus: a
// misconfigured interface or an unreadable state file fails at start-up,
// not at the first failover.
func (s *Service) open() (_ func(), err error) {
	var closers []func()
	closeAll := func() {
		for _, c := range slices.Backward(closers) {
			c()
		}
	}
	// closeAll is a local, not the named result: an error return sets the
	// result to nil before this deferred clean-up runs.
	defer func() {
		if err != nil {
			closeAll()
		}
	}()
	if s.fence, err = fence.Open(s.cfg.StateFile, fence.DefaultKeep); err != nil {
		// A corrupt state file could re-open old epochs: refuse to start.
		return nil, fmt.Errorf("ipmover state: %w", err)
	}
	if s.addrs, err = vip.New(s.cfg.Interface, s.log, vip.WithNamespace(s.ns)); err != nil {
		return nil, fmt.Errorf("ipmover interface: %w", err)
	}
	closers = append(closers, s.addrs.Close)
	if s.link, err = announce.Open(s.cfg.Interface, s.log, announce.WithNamespace(s.ns)); err != nil {
		return nil, fmt.Errorf("ipmover announcer: %w", err)
	}
	closers = append(closers, func() { s.link.Close() })
	ann, err := announce.New(s.link, s.cfg.Announce.schedule(), s.log)
	if err != nil {
		return nil, fmt.Errorf("ipmover announcer: %w", err)
	}
	gwCfg, err := s.cfg.Gateway.build()
	if err != nil {
		return nil, err
	}
	if s.gw, err = gateway.New(gwCfg, s.cfg.Interface, s.ns, s.log); err != nil {
		return nil, err
	}
	closers = append(closers, s.gw.Close)
	switch s.cfg.Answer.Mode {
	case events.AnswerHot:
		// Hot standby: Asterisk binds the floating address at start-up
		// although it is absent, so claiming it is all it takes
		// (docs/asterisk22.md, point 4). Asterisk must start after this.
		// Write only what differs: in a container /proc/sys is read-only,
		// and the operator sets these with the container's sysctls instead.
		sys := sysctl.Namespace{NS: s.ns}
		for _, k := range []string{"net.ipv4.ip_nonlocal_bind", "net.ipv6.ip_nonlocal_bind"} {
			if v, err := sys.Get(k); err == nil && strings.TrimSpace(v) == "1" {
				continue
			}
			if err := sys.Set(k, "1"); err != nil {
				return nil, fmt.Errorf("answer mode hot: %w", err)
			}
		}
	case events.AnswerReload:
		pbx := ami.NewSession(ami.Config{Addr: s.cfg.AMI.Address, Username: s.cfg.AMI.Username, Secret: s.cfg.AMI.Secret}, s.log)
		closers = append(closers, func() { pbx.Close() })
		s.answerer.Reload = pbx
	case events.AnswerRestart:
		s.answerer.Restart = &answer.Systemctl{Path: s.cfg.Answer.Systemctl, Unit: s.cfg.Answer.Unit}
	}
	closeKeeper, err := s.openKeeper()
	if err != nil {
		return nil, err
	}
	closers = append(closers, closeKeeper)
	s.m = newMetrics(s.link)
	watchCtx, stopWatch := context.WithCancel(context.Background())
	closers = append(closers, stopWatch)
	changed, err := s.addrs.Watch(watchCtx)
	if err != nil {
		return nil, fmt.Errorf("ipmover watch: %w", err)
	}
	s.loop = reconcile.New(s.addrs, ann, reconcile.Config{
		Period: s.cfg.ReconcilePeriod.D(), Changed: changed, Logger: s.log, OnChange: s.onChange,
	})
	return closeAll, nil
}

// Run executes commands until ctx ends, then releases every address it
// holds: a stopped ipmover must never leave an address answering.
func (s *Service) Run(ctx context.Context) error {
	closeAll, err := s.open()
	if err != nil {
		return err
	}
	defer closeAll()
	return daemon.Serve(ctx, s.cfg.Common, "ipmover", s.version, s.log, func(ctx context.Context, rt *daemon.Runtime) error {
		if err := s.attach(ctx, rt); err != nil {
			return err
		}
		s.resyncOrRetry(ctx, "start")
		g, _ := daemon.NewGroup(ctx)
		releaseErr := s.addActors(g, rt)
		err := g.Wait()
		return errors.Join(err, *releaseErr)
	})
}

// attach connects the service to the runtime: its metrics, the outbox it
// reports through, the command contract, and its reads of the state bucket.
func (s *Service) attach(ctx context.Context, rt *daemon.Runtime) error {
	collectors := s.m.all
	if s.keeper != nil {
		collectors = append(collectors, s.keeper.Metrics().Collectors()...)
	}
	for _, c := range collectors {
		if err := rt.Metrics.Register(c); err != nil {
			return fmt.Errorf("ipmover metrics: %w", err)
		}
	}
	// Results and reports go through the outbox: retried until the
	// audit stream stores them, without holding up the next command.
	s.pub = rt.Outbox
	s.watch = rt.Bus.Watch
	s.openCalls = rt.Bus.CallsKV
	s.conds = rt.Conditions
	s.conds.Declare(condResyncIncomplete)
	s.resyncRetry = make(chan string, 1)
	contract, err := execute.Open(ctx, rt, s.contractConfig())
	if err != nil {
		return err
	}
	s.contract = contract
	// Whether this node still holds an address is read through the
	// bucket's raft leader: a direct get may be answered by a replica
	// just back from a partition, with the holder of before it (seen in
	// the colocated chaos run: both nodes kept the address, each
	// reading itself named holder).
	s.kv = func(ctx context.Context, key string) ([]byte, error) {
		return rt.Bus.LeaderGetKV(ctx, events.StateBucket, key)
	}
	s.listKeys = groupStatusKeys(rt.Bus, s.cfg.Cluster)
	return nil
}

// groupStatusKeys lists the cluster's group status keys. The state bucket
// is opened on first use and again after a failed open, so a bucket
// unreachable at start does not leave every later re-sync and
// confirmation failing.
func groupStatusKeys(b *bus.Bus, cluster string) func(context.Context) ([]string, error) {
	var kvMu sync.Mutex
	var kvOpen jetstream.KeyValue
	stateKV := func(ctx context.Context) (jetstream.KeyValue, error) {
		kvMu.Lock()
		defer kvMu.Unlock()
		if kvOpen == nil {
			kv, err := b.StateKV(ctx)
			if err != nil {
				return nil, err
			}
			kvOpen = kv
		}
		return kvOpen, nil
	}
	return func(ctx context.Context) ([]string, error) {
		kv, err := stateKV(ctx)
		if err != nil {
			return nil, err
		}
		l, err := kv.ListKeysFiltered(ctx, events.AllGroupStatusKeys(cluster))
		if err != nil {
			return nil, err
		}
		var keys []string
		for k := range l.Keys() {
			keys = append(keys, k)
		}
		return keys, nil
	}
}

// addActors hands the actors to the run group, in the order they stop
// (daemon.Group):
//  1. commands: no command is taken any more; the one in hand is
//     finished and its result posted;
//  2. the loops that change addresses on their own (reconcile,
//     conflict watch, re-sync retries, bus-loss policy), so nothing
//     re-adds an address after the release;
//  3. release: every managed address is removed while the bus is
//     still up to report it.
//
// Serve then stores the last results (the outbox) and closes the bus. The
// release's failure is read once the group has stopped.
func (s *Service) addActors(g *daemon.Group, rt *daemon.Runtime) (releaseErr *error) {
	g.Go("commands", func(ctx context.Context) error { return s.contract.Consume(ctx, rt.Bus, s.cfg.Node) })
	// The watchdog counts the reconcile loop alive while it turns (at
	// least once a period).
	alive := rt.Loop("reconcile", 3*s.cfg.ReconcilePeriod.D()+5*time.Second)
	g.Go("reconcile", func(ctx context.Context) error {
		defer alive.Done()
		if err := s.loop.RunTurning(ctx, alive.Alive); err != nil {
			s.log.Error("reconcile loop stopped", "err", err)
		}
		<-ctx.Done() // a loop that stopped early is logged, not fatal
		return nil
	})
	if s.cfg.Conflict.Watch == nil || *s.cfg.Conflict.Watch {
		g.Go("conflict_watch", s.watchConflicts)
	}
	g.Go("resync_retries", func(ctx context.Context) error { s.runResyncRetries(ctx); return nil })
	if s.keeper != nil {
		g.Go("calls_handover", func(ctx context.Context) error { s.runHandover(ctx); return nil })
	}
	s.m.busContact.Set(1)
	g.Go("bus_loss", func(ctx context.Context) error { s.runBusLoss(ctx, rt.Bus); return nil })
	releaseErr = new(error)
	g.Go("release", func(ctx context.Context) error {
		<-ctx.Done()
		*releaseErr = s.releaseOnStop(ctx, rt)
		return nil
	})
	return releaseErr
}

// watchConflicts answers another host's ARP for an address this node
// holds until ctx ends.
func (s *Service) watchConflicts(ctx context.Context) error {
	resolver := conflict.NewResolver(s, conflict.Config{
		Node: s.cfg.Node, OwnMAC: s.link.HardwareAddr().String(),
		Confirm:     conflict.Confirmer{Cluster: s.cfg.Cluster, Node: s.cfg.Node, Read: s.kv}.Confirm,
		Report:      s.reportConflict,
		Timeout:     s.cfg.Conflict.ConfirmTimeout.D(),
		MinInterval: s.cfg.Conflict.MinInterval.D(),
		Logger:      s.log,
	})
	if err := s.link.WatchARP(ctx, func(seen announce.Seen) { resolver.Seen(ctx, seen) }); err != nil {
		s.log.Error("ARP conflict watch stopped", "err", err)
	}
	<-ctx.Done()
	resolver.Wait()
	return nil
}

// runBusLoss applies the bus-loss policy until ctx ends.
func (s *Service) runBusLoss(ctx context.Context, b *bus.Bus) {
	busloss.Run(ctx, busloss.Config{
		Policy: s.cfg.BusLoss.Policy, ReleaseAfter: s.cfg.BusLoss.ReleaseAfter.D(), CheckEvery: s.cfg.BusLoss.CheckEvery.D(),
		Check: func(ctx context.Context) error {
			err := b.NC.FlushWithContext(ctx)
			s.m.busContact.Set(map[bool]float64{true: 1, false: 0}[err == nil])
			if err != nil {
				s.busChecksFailed.Add(1)
			}
			return err
		},
		// The state bucket's raft leader answers its info; a server
		// cut off from the others stays silent or, once it has
		// given its leader up, answers itself naming none.
		ClusterCheck: func(ctx context.Context) error {
			st, err := b.JS.Stream(ctx, events.KVStreamName(events.StateBucket))
			if err != nil {
				return err
			}
			if c := st.CachedInfo().Cluster; c != nil && c.Leader == "" {
				return errors.New("the state bucket has no raft leader")
			}
			return nil
		},
		OnRelease:  s.releaseForBusLoss,
		OnRegained: func(time.Duration) { s.regained(ctx) },
		Logger:     s.log,
	})
}

// releaseOnStop removes every managed address, ends the background work
// and waits for it, and returns the release's failure.
func (s *Service) releaseOnStop(ctx context.Context, rt *daemon.Runtime) error {
	sctx, cancel := rt.ShutdownContext(ctx)
	defer cancel()
	var releaseErr error
	if err := s.releaseAll(sctx); err != nil {
		s.log.Error("release on stop failed", "err", err)
		releaseErr = err
	} else {
		s.log.Info("released all floating addresses on stop")
	}
	s.stopBackground()
	if s.keeper != nil {
		// The kept records stay for the next holder; the deletes of
		// calls that ended are written while the bus is up.
		s.keeper.Close(sctx)
	}
	s.bg.Wait()
	return releaseErr
}

// contractConfig puts this executor under the command contract.
func (s *Service) contractConfig() execute.Config {
	return execute.Config{
		Fence: s.fence, Executor: s, Node: s.cfg.Node, Logger: s.log,
		Observe: func(step string, el time.Duration) { s.m.steps.WithLabelValues(step).Observe(el.Seconds()) },
		Count:   func(t events.Type, o events.Outcome) { s.m.commands.WithLabelValues(string(t), string(o)).Inc() },
		Refused: func(reason string) { s.m.refused.WithLabelValues(reason).Inc() },
	}
}

// releaseAll gives up every address and the gateway role.
func (s *Service) releaseAll(ctx context.Context) error {
	s.act.Lock()
	defer s.act.Unlock()
	err := s.loop.ReleaseAll(ctx)
	if gerr := s.gw.Undo(); gerr != nil {
		err = errors.Join(err, gerr)
	}
	s.mu.Lock()
	for g := range s.claims {
		delete(s.claims, g)
		s.m.holder.WithLabelValues(g).Set(0)
		if s.keeper != nil && s.keeper.Release(g) > 0 {
			s.noteLeft(g)
		}
	}
	s.mu.Unlock()
	return err
}

// inNS runs fn on a thread inside the service's namespace (sockets opened
// there belong to it); the thread is discarded afterwards.
func (s *Service) inNS(fn func() error) error {
	if !s.ns.IsOpen() {
		return fn()
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := netns.Set(s.ns); err != nil {
			errc <- fmt.Errorf("enter namespace: %w", err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}
