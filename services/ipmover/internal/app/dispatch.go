package app

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

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/config"
	"github.com/fanpbx/fan/pkg/platform/daemon"
	"github.com/fanpbx/fan/services/ipmover/internal/dispatcher"
)

// DispatcherConfig keeps one Kamailio dispatcher set in step with the
// arbiter's view: a node receives new calls only while the
// arbiter counts it eligible in Group (healthy, heard, not in standby) and
// the registry does not mark it offline.
type DispatcherConfig struct {
	dispatcher.Config `yaml:",inline"`
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
	if err := events.ValidToken("group", d.Group); err != nil {
		return &config.FieldError{Key: "dispatcher.group", Err: err}
	}
	if d.URL == "" {
		return config.Errf("dispatcher.url", "required (Kamailio JSON-RPC, e.g. http://127.0.0.1:5071/RPC)")
	}
	if len(d.Nodes) == 0 {
		return config.Errf("dispatcher.nodes", "at least one node -> uri is required")
	}
	for n, uri := range d.Nodes {
		if err := events.ValidToken("node", n); err != nil {
			return &config.FieldError{Key: "dispatcher.nodes", Err: err}
		}
		if !strings.HasPrefix(uri, "sip:") && !strings.HasPrefix(uri, "sips:") {
			return config.Errf("dispatcher.nodes."+n, "uri %q must be a sip: or sips: URI as Kamailio lists it", uri)
		}
	}
	if d.Set == 0 {
		d.Set = 1
	}
	if d.Set < 0 {
		return config.Errf("dispatcher.set", "must be positive")
	}
	if d.Resync == 0 {
		d.Resync = config.Duration(5 * time.Second)
	}
	if d.Weights && d.ListFile == "" {
		return config.Errf("dispatcher.weights", "needs dispatcher.list_file (Kamailio 5.6 changes weights only by reloading the list)")
	}
	return nil
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

func (s *Service) runDispatcher(ctx context.Context) error {
	x, err := newDispatchExecutor(s.cfg, s.log)
	if err != nil {
		return err
	}
	return daemon.Serve(ctx, s.cfg.Common, "ipmover", s.version, s.log, func(ctx context.Context, rt *daemon.Runtime) error {
		return x.run(ctx, rt.Bus)
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
	kv, err := b.StateKV(ctx)
	if err != nil {
		return err
	}
	statusW, err := kv.Watch(ctx, events.GroupStatusKey(x.cluster, x.cfg.Group))
	if err != nil {
		return fmt.Errorf("watch group status: %w", err)
	}
	defer statusW.Stop()
	regW, err := kv.Watch(ctx, events.AllRegistryKeys(x.cluster))
	if err != nil {
		return fmt.Errorf("watch registry: %w", err)
	}
	defer regW.Stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wg.Go(func() { x.follow(ctx, statusW, regW) })
	// Without the weights watch the executor would keep stale weights for
	// good: its failure ends the service so systemd restarts it.
	weightsErr := make(chan error, 1)
	if x.cfg.Weights {
		wg.Go(func() {
			if err := x.watchWeights(ctx, b); err != nil && ctx.Err() == nil {
				weightsErr <- err
			}
		})
	}
	t := time.NewTicker(x.cfg.Resync.D())
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-weightsErr:
			x.log.Error("cannot follow dispatcher weights; exiting for a restart", "err", err)
			return fmt.Errorf("dispatcher weights: %w", err)
		case <-x.wake:
			x.syncStates(ctx, false)
		case <-x.weightC:
			x.applyWeights(ctx)
		case <-t.C:
			x.syncStates(ctx, true)
		}
	}
}

// follow decodes the bucket's updates into the executor's view.
func (x *dispatchExecutor) follow(ctx context.Context, statusW, regW jetstream.KeyWatcher) {
	for {
		select {
		case <-ctx.Done():
			return
		case e := <-statusW.Updates():
			if e == nil || e.Operation() != jetstream.KeyValuePut {
				continue // nil marks the end of the initial values
			}
			var st events.GroupStatus
			if err := json.Unmarshal(e.Value(), &st); err != nil {
				x.log.Warn("undecodable group status", "key", e.Key(), "err", err)
				continue
			}
			x.mu.Lock()
			x.status = &st
			x.mu.Unlock()
			x.poke(x.wake)
		case e := <-regW.Updates():
			if e == nil || e.Operation() != jetstream.KeyValuePut {
				continue
			}
			var rec events.NodeRecord
			if err := json.Unmarshal(e.Value(), &rec); err != nil {
				x.log.Warn("undecodable registry record", "key", e.Key(), "err", err)
				continue
			}
			if _, ok := x.cfg.Nodes[rec.Node]; !ok {
				continue
			}
			x.mu.Lock()
			changed := x.presence[rec.Node] != rec.Presence
			x.presence[rec.Node] = rec.Presence
			x.mu.Unlock()
			if changed {
				x.poke(x.wake)
			}
		}
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
	if len(changes) > 0 {
		var desc []string
		for _, c := range changes {
			desc = append(desc, fmt.Sprintf("%s %s->%s", c.URI, c.From, c.To))
		}
		x.log.Info("dispatcher set in step with the arbiter", "changes", strings.Join(desc, ", "))
	}
}

// watchWeights follows the group's weight sets, starting from the last one.
// It returns an error only when it cannot follow them.
func (x *dispatchExecutor) watchWeights(ctx context.Context, b *bus.Bus) error {
	cons, err := b.JS.OrderedConsumer(ctx, bus.EventsStream, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{events.WeightsSubject(x.cluster, x.cfg.Group)},
		DeliverPolicy:  jetstream.DeliverLastPerSubjectPolicy,
	})
	if err != nil {
		return fmt.Errorf("weights consumer: %w", err)
	}
	cc, err := cons.Consume(func(m jetstream.Msg) {
		_, p, ok := b.DecodeFrom(m.Subject(), m.Data())
		if !ok {
			return
		}
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
		return fmt.Errorf("consume weights: %w", err)
	}
	<-ctx.Done()
	cc.Stop()
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
