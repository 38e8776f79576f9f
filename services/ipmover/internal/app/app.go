// Package app wires the ipmover, the node executor: it reads this node's
// commands from the bus, applies each at most once and only under a current
// epoch and before its deadline, keeps the interface's floating addresses in
// line with what it was told (a level-triggered reconcile loop), watches the
// LAN for another MAC using them, makes the PBX answer on a claimed address
// and proves it with SIP OPTIONS, and reports every outcome with timings.
package app

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
	"github.com/fanpbx/fan/pkg/platform/config"
	"github.com/fanpbx/fan/pkg/platform/daemon"
	"github.com/fanpbx/fan/services/ipmover/internal/allow"
	"github.com/fanpbx/fan/services/ipmover/internal/announce"
	"github.com/fanpbx/fan/services/ipmover/internal/answer"
	"github.com/fanpbx/fan/services/ipmover/internal/busloss"
	"github.com/fanpbx/fan/services/ipmover/internal/conflict"
	"github.com/fanpbx/fan/services/ipmover/internal/execute"
	"github.com/fanpbx/fan/services/ipmover/internal/fence"
	"github.com/fanpbx/fan/services/ipmover/internal/gateway"
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

	pub      publisher
	watch    func(context.Context, bus.WatchOptions, bus.EventHandler) error // the audit stream, for release results
	kv       conflict.ReadKey
	listKeys func(context.Context) ([]string, error) // group status keys
	bg       sync.WaitGroup                          // event publications in flight
	quiet    atomic.Int32                            // >0 while a command or policy changes addresses: not corrections
	conds    *daemon.Conditions
	// resyncRetry wakes runResyncRetries after an incomplete re-sync.
	resyncRetry chan string

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
	al, err := cfg.allowList()
	if err != nil {
		al = &allow.List{} // Validate refuses such a file; allow nothing
	}
	return &Service{cfg: cfg, log: log.With("node", cfg.Node), version: version, ns: netns.None(), allow: al,
		claims: map[string]conflict.Claim{}, groups: map[string][]netip.Prefix{}}
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
		// (facts/asterisk22.md, point 4). Asterisk must start after this.
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
	switch s.cfg.Executor {
	case ExecutorDNS:
		return s.runDNS(ctx)
	case ExecutorDispatcher:
		return s.runDispatcher(ctx)
	}
	closeAll, err := s.open()
	if err != nil {
		return err
	}
	defer closeAll()
	return daemon.Serve(ctx, s.cfg.Common, "ipmover", s.version, s.log, func(ctx context.Context, rt *daemon.Runtime) error {
		for _, c := range s.m.all {
			if err := rt.Metrics.Register(c); err != nil {
				return fmt.Errorf("ipmover metrics: %w", err)
			}
		}
		// Results and reports go through the outbox: retried until the
		// audit stream stores them, without holding up the next command.
		s.pub = rt.Outbox
		s.watch = rt.Bus.Watch
		s.conds = rt.Conditions
		s.conds.Declare(condResyncIncomplete)
		s.resyncRetry = make(chan string, 1)
		leases, err := rt.Bus.LeaseRecords(ctx, events.ArbiterLease)
		if err != nil {
			return err
		}
		s.contract = s.newContract(execute.NewLeaseTerms(leases))
		// The state bucket is opened on first use and again after a failed
		// open, so a bucket unreachable at start does not leave every
		// later re-sync and confirmation failing.
		var kvMu sync.Mutex
		var kvOpen jetstream.KeyValue
		stateKV := func(ctx context.Context) (jetstream.KeyValue, error) {
			kvMu.Lock()
			defer kvMu.Unlock()
			if kvOpen == nil {
				kv, err := rt.Bus.StateKV(ctx)
				if err != nil {
					return nil, err
				}
				kvOpen = kv
			}
			return kvOpen, nil
		}
		s.kv = readKV(stateKV)
		s.listKeys = func(ctx context.Context) ([]string, error) {
			kv, err := stateKV(ctx)
			if err != nil {
				return nil, err
			}
			l, err := kv.ListKeysFiltered(ctx, events.AllGroupStatusKeys(s.cfg.Cluster))
			if err != nil {
				return nil, err
			}
			var keys []string
			for k := range l.Keys() {
				keys = append(keys, k)
			}
			return keys, nil
		}
		s.resyncOrRetry(ctx, "start")

		// Background work lives until the commands stop, not until ctx
		// ends, so nothing re-adds an address after the release below.
		bgCtx, stopBG := context.WithCancel(context.WithoutCancel(ctx))
		defer stopBG()
		var wg sync.WaitGroup
		// The watchdog counts the reconcile loop alive while it turns (at
		// least once a period).
		alive := rt.Loop("reconcile", 3*s.cfg.ReconcilePeriod.D()+5*time.Second)
		wg.Go(func() {
			defer alive.Done()
			if err := s.loop.RunTurning(bgCtx, alive.Alive); err != nil {
				s.log.Error("reconcile loop stopped", "err", err)
			}
		})
		var resolver *conflict.Resolver
		if s.cfg.Conflict.Watch == nil || *s.cfg.Conflict.Watch {
			resolver = conflict.NewResolver(s, conflict.Config{
				Node: s.cfg.Node, OwnMAC: s.link.HardwareAddr().String(),
				Confirm:     conflict.Confirmer{Cluster: s.cfg.Cluster, Node: s.cfg.Node, Read: s.kv}.Confirm,
				Report:      s.reportConflict,
				Timeout:     s.cfg.Conflict.ConfirmTimeout.D(),
				MinInterval: s.cfg.Conflict.MinInterval.D(),
				Logger:      s.log,
			})
			wg.Go(func() {
				if err := s.link.WatchARP(bgCtx, func(seen announce.Seen) { resolver.Seen(bgCtx, seen) }); err != nil {
					s.log.Error("ARP conflict watch stopped", "err", err)
				}
			})
		}
		wg.Go(func() { s.runResyncRetries(bgCtx) })
		s.m.busContact.Set(1)
		wg.Go(func() {
			busloss.Run(bgCtx, busloss.Config{
				Policy: s.cfg.BusLoss.Policy, ReleaseAfter: s.cfg.BusLoss.ReleaseAfter.D(), CheckEvery: s.cfg.BusLoss.CheckEvery.D(),
				Check: func(ctx context.Context) error {
					err := rt.Bus.NC.FlushWithContext(ctx)
					s.m.busContact.Set(map[bool]float64{true: 1, false: 0}[err == nil])
					return err
				},
				OnRelease:  s.releaseForBusLoss,
				OnRegained: func(time.Duration) { s.regained(bgCtx) },
				Logger:     s.log,
			})
		})

		err = rt.Bus.ConsumeCommands(ctx, s.cfg.Node, s.contract.Handle)

		// Stop order matters: commands are no longer consumed and the loop,
		// watcher and monitor are stopped, so nothing re-adds an address;
		// then every managed address is removed while the bus is still up
		// to report it.
		stopBG()
		wg.Wait()
		if resolver != nil {
			resolver.Wait()
		}
		sctx, cancel := rt.ShutdownContext(ctx)
		defer cancel()
		if rerr := s.releaseAll(sctx); rerr != nil {
			s.log.Error("release on stop failed", "err", rerr)
			err = errors.Join(err, rerr)
		} else {
			s.log.Info("released all floating addresses on stop")
		}
		s.bg.Wait()
		return err
	})
}

// newContract puts this executor under the command contract.
func (s *Service) newContract(terms execute.Terms) *execute.Contract {
	return execute.New(execute.Config{
		Fence: s.fence, Terms: terms, Executor: s, Publisher: s.pub, Node: s.cfg.Node, Logger: s.log,
		Observe: func(step string, el time.Duration) { s.m.steps.WithLabelValues(step).Observe(el.Seconds()) },
		Count:   func(t events.Type, o events.Outcome) { s.m.commands.WithLabelValues(string(t), string(o)).Inc() },
		Refused: func(reason string) { s.m.refused.WithLabelValues(reason).Inc() },
	})
}

// releaseAll gives up every address and the gateway role.
func (s *Service) releaseAll(ctx context.Context) error {
	s.act.Lock()
	defer s.act.Unlock()
	s.quiet.Add(1)
	defer s.quiet.Add(-1)
	err := s.loop.ReleaseAll(ctx)
	if gerr := s.gw.Undo(); gerr != nil {
		err = errors.Join(err, gerr)
	}
	s.mu.Lock()
	for g := range s.claims {
		delete(s.claims, g)
		s.m.holder.WithLabelValues(g).Set(0)
	}
	s.mu.Unlock()
	return err
}

// readKV adapts the state bucket to conflict.ReadKey.
func readKV(open func(context.Context) (jetstream.KeyValue, error)) conflict.ReadKey {
	return func(ctx context.Context, key string) ([]byte, error) {
		kv, err := open(ctx)
		if err != nil {
			return nil, err
		}
		e, err := kv.Get(ctx, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return nil, nil
		}
		if err != nil {
			return nil, err
		}
		return e.Value(), nil
	}
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
