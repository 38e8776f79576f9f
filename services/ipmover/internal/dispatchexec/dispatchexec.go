// Package dispatchexec is the dispatcher executor (executor: dispatcher):
// it steers one Kamailio dispatcher set for an arbiter group, in one of two
// modes. eligible (the default) keeps every node the arbiter counts
// eligible active, level-triggered from the state bucket, and takes no
// commands; holder takes the group's commands under the command contract
// (package execute) and keeps only the holder active.
package dispatchexec

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/config"
	"github.com/fanpbx/fan/pkg/platform/daemon"
	"github.com/fanpbx/fan/services/ipmover/internal/dispatcher"
)

// Config is the dispatcher executor's configuration: the keys of the
// ipmover's file that belong to it, and no other.
type Config struct {
	daemon.Common `yaml:",inline"`
	// StateFile persists the highest epoch seen and the applied command
	// ids (mode holder only: the only mode that takes commands).
	StateFile  string           `yaml:"state_file"`
	Dispatcher DispatcherConfig `yaml:"dispatcher"`
}

// Modes of the dispatcher executor (dispatcher.mode).
const (
	// ModeEligible keeps every eligible node active, from the state bucket.
	ModeEligible = "eligible"
	// ModeHolder keeps the group's holder active, by the arbiter's commands.
	ModeHolder = "holder"
)

// Validate checks the file after loading and fills defaults, reporting
// every key that is wrong.
func (c *Config) Validate() error {
	errs := []error{c.Common.Validate(), c.Dispatcher.validateBounds(), c.Dispatcher.validate(c.Cluster)}
	switch {
	case c.Dispatcher.Mode == ModeHolder && c.StateFile == "":
		errs = append(errs, config.Errf("state_file", "required with dispatcher.mode: holder (it keeps commands at most once across restarts)"))
	case c.Dispatcher.Mode == ModeEligible && c.StateFile != "":
		// A key that does nothing is refused, not ignored: its writer
		// believes commands are fenced by it.
		errs = append(errs, config.Errf("state_file", "only with dispatcher.mode: holder (mode eligible takes no commands)"))
	}
	return config.Join(errs...)
}

// CheckHost checks what the file names on this host (config.HostChecker):
// the bus's files and http_listen (daemon.Common), the directory the state
// file is written in (mode holder) and the directory of list_file.
func (c *Config) CheckHost() error {
	return config.Join(c.Common.CheckHost(),
		config.ParentDirExists("state_file", c.StateFile),
		config.ParentDirExists("dispatcher.list_file", c.Dispatcher.ListFile))
}

// DispatcherConfig keeps one Kamailio dispatcher set in step with the
// arbiter's view: a node receives new calls only while the
// arbiter counts it eligible in Group (healthy, heard, not in standby) and
// the registry does not mark it offline.
type DispatcherConfig struct {
	dispatcher.Config `yaml:",inline"`
	// Mode is eligible (every eligible node active, from the state
	// bucket; the default) or holder (the arbiter's claims and releases
	// for the group's nodes: only the holder active).
	Mode string `yaml:"mode"`
	// Group is the arbiter group whose node status steers the set.
	Group string `yaml:"group"`
	// Set is the dispatcher set id (default 1).
	Set int `yaml:"set"`
	// Nodes maps each arbiter node to its destination URI in the set,
	// exactly as Kamailio lists it (sip:192.0.2.11:5060).
	Nodes map[string]string `yaml:"nodes"`
	// Resync re-applies the desired states this often even without a
	// change, so a state set by hand or lost in a Kamailio restart is put
	// back (default 5s).
	Resync config.Duration `yaml:"resync"`
	// Weights applies the arbiter's dispatcher.weights sets for Group by
	// rewriting list_file and reloading (needs list_file).
	Weights bool `yaml:"weights"`
}

func (d *DispatcherConfig) validate(cluster string) error {
	var errs []error
	if err := events.ValidToken("group", d.Group); err != nil {
		errs = append(errs, &config.FieldError{Key: "dispatcher.group", Err: err})
	}
	switch d.Mode {
	case "":
		d.Mode = ModeEligible
	case ModeEligible, ModeHolder:
	default:
		errs = append(errs, config.Errf("dispatcher.mode", "unknown mode %q (eligible, holder)", d.Mode))
	}
	if d.URL == "" {
		errs = append(errs, config.Errf("dispatcher.url", "required (Kamailio JSON-RPC, e.g. http://127.0.0.1:5071/RPC)"))
	}
	if len(d.Nodes) == 0 {
		errs = append(errs, config.Errf("dispatcher.nodes", "at least one node -> uri is required"))
	}
	for _, n := range slices.Sorted(maps.Keys(d.Nodes)) {
		if err := events.ValidToken("node", n); err != nil {
			errs = append(errs, &config.FieldError{Key: "dispatcher.nodes", Err: err})
		}
		if uri := d.Nodes[n]; !strings.HasPrefix(uri, "sip:") && !strings.HasPrefix(uri, "sips:") {
			errs = append(errs, config.Errf("dispatcher.nodes."+n, "uri %q must be a sip: or sips: URI as Kamailio lists it", uri))
		}
	}
	if d.Set == 0 {
		d.Set = 1 // a negative one is out of the bounds
	}
	if d.Resync == 0 {
		d.Resync = config.Duration(5 * time.Second)
	}
	if d.Weights && d.Mode == ModeHolder {
		// Weights share calls among the eligible nodes; a holder takes
		// them all.
		errs = append(errs, config.Errf("dispatcher.weights", "only with dispatcher.mode: eligible (mode holder sends every call to the holder)"))
	}
	if d.Weights && d.ListFile == "" {
		errs = append(errs, config.Errf("dispatcher.weights", "needs dispatcher.list_file (Kamailio 5.6 changes weights only by reloading the list)"))
	}
	return config.Join(errs...)
}

// Desired computes the dispatcher state of every configured node from the
// group's status and the registry: active only when the arbiter counts the
// node eligible and the registry does not say offline. A node the status
// does not know is disabled: fan sends calls only where it has evidence.
func Desired(nodes map[string]string, st events.GroupStatus, presence map[string]events.Presence) map[string]dispatcher.State {
	out := make(map[string]dispatcher.State, len(nodes))
	for n, uri := range nodes {
		s := dispatcher.Disabled
		if ns, ok := st.Nodes[n]; ok && ns.Eligible && presence[n] != events.PresenceOffline {
			s = dispatcher.Active
		}
		out[uri] = s
	}
	return out
}

// dispatchExecutor follows the state bucket and drives Kamailio.
type dispatchExecutor struct {
	cfg     DispatcherConfig
	cluster string
	log     *slog.Logger
	kam     *dispatcher.Client

	mu       sync.Mutex
	status   *events.GroupStatus
	presence map[string]events.Presence
	weights  map[string]int
	applied  map[string]dispatcher.State // last desired states confirmed in Kamailio
	appliedW map[string]int              // last weights confirmed in Kamailio
	wake     chan struct{}
	weightC  chan struct{}
}

func newDispatchExecutor(cfg Config, log *slog.Logger) (*dispatchExecutor, error) {
	kam, err := dispatcher.New(cfg.Dispatcher.Config, log)
	if err != nil {
		return nil, err
	}
	return &dispatchExecutor{cfg: cfg.Dispatcher, cluster: cfg.Cluster, log: log.With("group", cfg.Dispatcher.Group), kam: kam,
		presence: map[string]events.Presence{}, wake: make(chan struct{}, 1), weightC: make(chan struct{}, 1)}, nil
}

// Service is a configured dispatcher executor.
type Service struct {
	cfg     Config
	log     *slog.Logger
	version string
}

// New builds a dispatcher executor from a validated configuration.
func New(cfg Config, log *slog.Logger, version string) *Service {
	return &Service{cfg: cfg, log: daemon.ServiceLogger(log, cfg.Node), version: version}
}

// Run keeps the set in step until ctx ends; the set stays as last set.
func (s *Service) Run(ctx context.Context) error {
	if s.cfg.Dispatcher.Mode == ModeHolder {
		return s.runHolder(ctx)
	}
	x, err := newDispatchExecutor(s.cfg, s.log)
	if err != nil {
		return err
	}
	return daemon.Serve(ctx, s.cfg.Common, "ipmover", s.version, s.log, func(ctx context.Context, rt *daemon.Runtime) error {
		g, _ := daemon.NewGroup(ctx)
		g.Go("dispatcher", func(ctx context.Context) error { return x.run(ctx, rt.Bus) })
		return g.Wait()
	})
}

func (x *dispatchExecutor) poke(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// run watches the group status and the registry keys, and the weight sets
// when enabled, and syncs Kamailio on every change and every Resync.
func (x *dispatchExecutor) run(ctx context.Context, b *bus.Bus) error {
	// Both watches go through bus.WatchKV, which makes its consumer again
	// when its server is lost. One that fails ends the service (systemd
	// restarts it): an executor that no longer hears the arbiter must not
	// keep steering calls by a stale view.
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	watchErr := make(chan error, 3)
	wg.Go(func() {
		if err := b.WatchKV(ctx, []string{events.GroupStatusKey(x.cluster, x.cfg.Group)}, x.followStatus); err != nil && ctx.Err() == nil {
			watchErr <- fmt.Errorf("watch group status: %w", err)
		}
	})
	wg.Go(func() {
		if err := b.WatchKV(ctx, []string{events.AllRegistryKeys(x.cluster)}, x.followRegistry); err != nil && ctx.Err() == nil {
			watchErr <- fmt.Errorf("watch registry: %w", err)
		}
	})
	// Without the weights watch the executor would keep stale weights for
	// good: its failure ends the service so systemd restarts it.
	if x.cfg.Weights {
		wg.Go(func() {
			if err := x.watchWeights(ctx, b); err != nil && ctx.Err() == nil {
				watchErr <- fmt.Errorf("dispatcher weights: %w", err)
			}
		})
	}
	t := time.NewTicker(x.cfg.Resync.D())
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-watchErr:
			x.log.Error("cannot follow the arbiter; exiting for a restart", "err", err)
			return err
		case <-x.wake:
			x.syncStates(ctx, false)
		case <-x.weightC:
			x.applyWeights(ctx)
		case <-t.C:
			x.syncStates(ctx, true)
		}
	}
}

// followStatus takes the arbiter's group status into the executor's view.
func (x *dispatchExecutor) followStatus(key string, value []byte, deleted bool, _ uint64) {
	if deleted {
		return
	}
	var st events.GroupStatus
	if err := json.Unmarshal(value, &st); err != nil {
		x.log.Warn("undecodable group status", "key", key, "err", err)
		return
	}
	x.mu.Lock()
	x.status = &st
	x.mu.Unlock()
	x.poke(x.wake)
}

// followRegistry takes the nodes' presence from the registry records.
func (x *dispatchExecutor) followRegistry(key string, value []byte, deleted bool, _ uint64) {
	if deleted {
		return
	}
	var rec events.NodeRecord
	if err := json.Unmarshal(value, &rec); err != nil {
		x.log.Warn("undecodable registry record", "key", key, "err", err)
		return
	}
	if _, ok := x.cfg.Nodes[rec.Node]; !ok {
		return
	}
	x.mu.Lock()
	changed := x.presence[rec.Node] != rec.Presence
	x.presence[rec.Node] = rec.Presence
	x.mu.Unlock()
	if changed {
		x.poke(x.wake)
	}
}

// syncStates brings Kamailio to the desired states when they changed since
// the last confirmed sync, or always when force (the periodic re-sync).
// Nothing is done before the arbiter has published a status: without
// evidence the set stays as Kamailio has it.
func (x *dispatchExecutor) syncStates(ctx context.Context, force bool) {
	x.mu.Lock()
	if x.status == nil {
		x.mu.Unlock()
		return
	}
	want := Desired(x.cfg.Nodes, *x.status, x.presence)
	same := maps.Equal(want, x.applied)
	x.mu.Unlock()
	if same && !force {
		return
	}
	sctx, cancel := context.WithTimeout(ctx, 2*x.cfg.Resync.D())
	defer cancel()
	changes, err := x.kam.Sync(sctx, want)
	if err != nil {
		x.log.Warn("dispatcher sync failed; retrying at the next change or resync", "err", err)
		x.mu.Lock()
		x.applied = nil
		x.mu.Unlock()
		return
	}
	x.mu.Lock()
	x.applied = want
	x.mu.Unlock()
	logChanges(x.log, "dispatcher set in step with the arbiter", changes)
}

// watchWeights follows the group's weight sets, starting from the last one,
// through bus.Watch (which makes its consumer again when its server is lost).
// It returns an error only when it cannot follow them.
func (x *dispatchExecutor) watchWeights(ctx context.Context, b *bus.Bus) error {
	err := b.Watch(ctx, bus.WatchOptions{Subjects: []string{events.WeightsSubject(x.cluster, x.cfg.Group)}, LastPerSubject: true},
		func(_ events.Envelope, p events.Decoded, _ uint64) {
			w, ok := p.(*events.DispatcherWeights)
			if !ok {
				return
			}
			x.mu.Lock()
			if x.weights == nil {
				x.weights = map[string]int{}
			}
			maps.Copy(x.weights, w.Weights)
			x.mu.Unlock()
			x.poke(x.weightC)
		})
	if err != nil {
		return fmt.Errorf("weights: %w", err)
	}
	return nil
}

// applyWeights rewrites the list with the current desired states and
// weights and reloads it (the only way Kamailio 5.6 changes weights).
func (x *dispatchExecutor) applyWeights(ctx context.Context) {
	x.mu.Lock()
	if maps.Equal(x.weights, x.appliedW) {
		x.mu.Unlock()
		return
	}
	var want map[string]dispatcher.State
	if x.status != nil {
		want = Desired(x.cfg.Nodes, *x.status, x.presence)
	}
	weights := maps.Clone(x.weights)
	x.mu.Unlock()
	var entries []dispatcher.Entry
	for _, n := range slices.Sorted(maps.Keys(x.cfg.Nodes)) {
		uri := x.cfg.Nodes[n]
		st, ok := want[uri]
		if !ok {
			// No status yet: keep what Kamailio has rather than guess.
			st = dispatcher.Disabled
			if cur, err := x.kam.List(ctx); err == nil {
				for _, d := range cur {
					if d.URI == uri && !d.Disabled() {
						st = dispatcher.Active
					}
				}
			}
		}
		entries = append(entries, dispatcher.Entry{Set: x.cfg.Set, URI: uri, State: st, Weight: weights[n], Attrs: "duid=" + n})
	}
	actx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := x.kam.ApplyList(actx, entries); err != nil {
		x.log.Warn("dispatcher weights not applied; retrying at the next set or resync", "err", err)
		if !errors.Is(err, context.Canceled) {
			time.AfterFunc(x.cfg.Resync.D(), func() { x.poke(x.weightC) })
		}
		return
	}
	x.mu.Lock()
	x.appliedW = weights
	if want != nil {
		x.applied = want
	}
	x.mu.Unlock()
	x.log.Info("dispatcher weights applied", "weights", fmt.Sprint(weights))
}
