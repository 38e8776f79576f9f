// Package replicate runs the replicator's trees. A tree's direction follows
// the group's holder and epoch in the arbiter's state bucket: the holder
// scans and publishes manifests (driven by file-system notifications, with a
// periodic full scan behind them); every other node applies the holder's
// manifest of the current epoch and confirms with a ReplicationApplied
// event, which the holder turns into ReplicationStatus (CaughtUp) reports.
package replicate

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/daemon"
	"github.com/fanpbx/fan/services/replicator/internal/astdb"
	"github.com/fanpbx/fan/services/replicator/internal/direct"
	"github.com/fanpbx/fan/services/replicator/internal/fstree"
	"github.com/fanpbx/fan/services/replicator/internal/store"
	"github.com/prometheus/client_golang/prometheus"
)

// Tree is one replicated tree: a directory, or AstDB families over AMI.
type Tree struct {
	Name string
	// Files: Root and Exclude (Root is created on a target when missing;
	// on a source a missing root raises an alarm).
	Root    string
	Exclude *fstree.Excluder
	// Policy says what a manifest may ask of this tree on a target
	// (symlinks leaving it, owners, special mode bits); the zero value is
	// the safe default.
	Policy Policy
	// AstDB: AMI reaches this node's Asterisk; Families are carried.
	AMI      astdb.Actioner
	Families []string
	// Watch follows this node's Asterisk's events: with it the registrar
	// family's changes are published as Asterisk reports them (nil: no
	// family is reported, every one is polled).
	Watch astdb.EventSource
	// Poll is how often an AstDB source reads the families Asterisk
	// reports no changes of (all but registrar; every one without Watch).
	Poll time.Duration
	// Reconcile is how often an AstDB source reads every family whole and
	// publishes it as a manifest; 0 means a minute.
	Reconcile time.Duration
}

func (t Tree) isAstDB() bool { return t.AMI != nil }

// Policy is a files tree's safety policy (see fstree.ApplyOptions).
type Policy struct {
	AllowOutsideSymlinks, PreserveOwner, PreserveSpecialBits bool
}

// Config is what the engine needs; the app fills it from the file.
type Config struct {
	Cluster, Group, Node string
	Trees                []Tree
	// StateDir keeps, per tree, what this node last had confirmed, and the
	// conflicts directory.
	StateDir string
	// Debounce groups notifications into one pass.
	Debounce time.Duration
	// ScanInterval is the full scan (and target re-check) period.
	ScanInterval   time.Duration
	MaxDeleteShare float64
	AllowDeletes   int
	Workers        int
	Owner          bool
	// GCInterval is how often the holder deletes unreferenced contents
	// older than GCGrace; 0 disables.
	GCInterval, GCGrace time.Duration
	// Conditions receives source_unconfirmed and holder_unconfirmed (nil:
	// none reported).
	Conditions *daemon.Conditions
	// ConfirmWithin bounds how long a tree may go without being able to
	// read the group status it must check before applying (target) or
	// publishing (source); past it Run returns an error so the service
	// exits and systemd restarts it. 0 means DefaultConfirmWithin.
	ConfirmWithin time.Duration
	// Outbox, when set, carries every report (retried until the audit
	// stream stores it); without it reports are published directly.
	Outbox *bus.Outbox
	// StorePassBytes turns on direct transfer: a source stores at most
	// this many bytes of new contents of one pass in the object store and
	// serves the rest to its peers itself (package direct); a target asks
	// the holder for what the store lacks. 0 stores everything and serves
	// nothing.
	StorePassBytes int64
}

// The conditions the engine raises while it cannot read the group status
// (the state bucket has no leader, or the bus is gone): a target that
// cannot confirm its source still holds does not apply, and a source that
// cannot confirm it still holds does not publish. Both retry with backoff
// (250 ms doubling to 5 s) and are bounded by Config.ConfirmWithin.
const (
	CondSourceUnconfirmed = "source_unconfirmed"
	CondHolderUnconfirmed = "holder_unconfirmed"
)

// DefaultConfirmWithin is well past a JetStream leader election (4 to 9 s)
// and a server restart, and short enough that a replicator wedged on a
// dead connection is restarted before an operator has to.
const DefaultConfirmWithin = time.Minute

// Engine runs every tree of one node.
type Engine struct {
	cfg   Config
	bus   *bus.Bus
	store *store.Store
	log   *slog.Logger
	m     *metrics
	trees map[string]*worker
	// serve and fetch are the two ends of direct transfer (nil when off).
	serve *direct.Server
	fetch *direct.Client

	roleMu sync.Mutex
	role   role

	// unconf is, per condition, since when each tree has been unable to
	// confirm the holder.
	unconfMu sync.Mutex
	unconf   map[string]map[string]time.Time
}

type role struct {
	Holder string
	Epoch  uint64
}

// New builds an engine; Run starts it.
func New(cfg Config, b *bus.Bus, st *store.Store, reg prometheus.Registerer, log *slog.Logger) (*Engine, error) {
	if cfg.Debounce <= 0 {
		cfg.Debounce = 20 * time.Millisecond
	}
	if cfg.ScanInterval <= 0 {
		cfg.ScanInterval = 30 * time.Second
	}
	if cfg.ConfirmWithin <= 0 {
		cfg.ConfirmWithin = DefaultConfirmWithin
	}
	cfg.Conditions.Declare(CondSourceUnconfirmed, CondHolderUnconfirmed)
	e := &Engine{cfg: cfg, bus: b, store: st, log: log, m: newMetrics(reg), trees: map[string]*worker{},
		unconf: map[string]map[string]time.Time{}}
	if cfg.StorePassBytes > 0 && b != nil && b.NC != nil {
		e.serve = direct.NewServer(b.NC, cfg.Cluster, cfg.Group, cfg.Node, log, func(subject string, err error) {
			b.Refuse(events.RefusalReason(err), subject, err)
		}, e.m.direct.WithLabelValues("served"))
		e.fetch = direct.NewClient(b.NC, cfg.Cluster, cfg.Group, e.m.direct.WithLabelValues("fetched"))
	}
	for _, t := range cfg.Trees {
		if _, dup := e.trees[t.Name]; dup {
			return nil, fmt.Errorf("tree %q configured twice", t.Name)
		}
		w, err := newWorker(e, t)
		if err != nil {
			return nil, err
		}
		e.trees[t.Name] = w
	}
	return e, nil
}

// Run replicates until ctx ends.
func (e *Engine) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// The state bucket must be there before its group status is watched: a
	// missing one is a provisioning fault, not something to wait out.
	if _, err := e.bus.WaitStateKV(ctx); err != nil {
		return fmt.Errorf("replicator: %w", err)
	}
	if err := e.store.LoadIndex(ctx); err != nil {
		return fmt.Errorf("replicator: %w", err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	goRun := func(f func(context.Context) error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f(ctx); err != nil && ctx.Err() == nil {
				errs <- err
				cancel()
			}
		}()
	}
	// Confirmations are read from the engine's start, so one sent before
	// the consumer exists is not missed.
	since := time.Now()
	goRun(func(ctx context.Context) error {
		return e.bus.Watch(ctx, bus.WatchOptions{Subjects: []string{events.AllReplicationApplied(e.cfg.Cluster)}, Since: since},
			func(env events.Envelope, p events.Decoded, _ uint64) {
				a, ok := p.(*events.ReplicationApplied)
				if !ok || a.Group != e.cfg.Group || a.Source != e.cfg.Node {
					return
				}
				if w := e.trees[a.Tree]; w != nil {
					w.ack(ackMsg{env: env, a: *a, at: time.Now()})
				}
			})
	})
	goRun(func(ctx context.Context) error {
		prefix := events.ReplManifestName(e.cfg.Cluster, e.cfg.Group, "", "")
		prefix = strings.TrimSuffix(prefix, ".")
		return e.bus.WatchObjects(ctx, events.ReplManifestBucket, func(name string, deleted bool, _ uint64) {
			if deleted {
				return
			}
			rest, ok := strings.CutPrefix(name, prefix)
			if !ok {
				return
			}
			tree, _, _ := strings.Cut(rest, ".")
			if w := e.trees[tree]; w != nil {
				nudge(w.manifestCh)
			}
		})
	})
	goRun(e.watchRole)
	if e.serve != nil {
		goRun(e.serve.Run)
	}
	if e.cfg.GCInterval > 0 {
		goRun(e.gcLoop)
	}
	if e.hasAstDB() {
		goRun(e.answerResyncs)
	}
	for _, w := range e.trees {
		goRun(w.run)
	}
	<-ctx.Done()
	wg.Wait()
	select {
	case err := <-errs:
		return err
	default:
		return nil
	}
}

// watchRole follows the group's status. Every source re-reads the status
// right before publishing anyway; this only turns a worker's direction
// soon after a move.
func (e *Engine) watchRole(ctx context.Context) error {
	key := events.GroupStatusKey(e.cfg.Cluster, e.cfg.Group)
	return e.bus.WatchKV(ctx, []string{key}, func(_ string, value []byte, deleted bool, _ uint64) {
		if !deleted {
			e.setRole(value)
		}
	})
}

func (e *Engine) setRole(v []byte) {
	var gs events.GroupStatus
	if err := json.Unmarshal(v, &gs); err != nil {
		e.log.Warn("undecodable group status", "err", err)
		return
	}
	r := role{Holder: gs.Holder, Epoch: gs.Epoch}
	e.roleMu.Lock()
	old := e.role
	// Epochs only grow: a late, older value never turns direction back.
	if r.Epoch < old.Epoch || r == old {
		e.roleMu.Unlock()
		return
	}
	e.role = r
	e.roleMu.Unlock()
	e.log.Info("group holder", "holder", r.Holder, "epoch", r.Epoch)
	for _, w := range e.trees {
		nudge(w.roleCh)
	}
}

func (e *Engine) currentRole() role {
	e.roleMu.Lock()
	defer e.roleMu.Unlock()
	return e.role
}

// confirmHolder reads the status afresh: a source publishes only while the
// bucket still names it holder in the epoch it acts under.
func (e *Engine) confirmHolder(ctx context.Context, epoch uint64) error {
	return e.confirmTenure(ctx, e.cfg.Node, epoch)
}

// confirmTenure reads the status afresh and checks that it still names
// holder in epoch. A target asks it before applying a manifest: right after
// a failover the new holder's replicator may not have seen the new epoch
// yet, and applying the old holder's last pass then would move aside the
// first messages left on the new holder.
func (e *Engine) confirmTenure(ctx context.Context, holder string, epoch uint64) error {
	kv, err := e.bus.StateKV(ctx)
	if err != nil {
		return err
	}
	kve, err := kv.Get(ctx, events.GroupStatusKey(e.cfg.Cluster, e.cfg.Group))
	if err != nil {
		return fmt.Errorf("read group status: %w", err)
	}
	e.setRole(kve.Value())
	r := e.currentRole()
	if r.Holder != holder || r.Epoch != epoch {
		return fmt.Errorf("%w: holder %q epoch %d, not %q in epoch %d", errNotHolder, r.Holder, r.Epoch, holder, epoch)
	}
	return nil
}

var errNotHolder = errors.New("no longer the holder")

// unconfirmed records that tree could not confirm the holder (cond says in
// which role) and raises cond. It returns an error once the tree has been
// unable to for longer than ConfirmWithin: the caller ends the engine.
func (e *Engine) unconfirmed(cond, tree string, err error) error {
	now := time.Now()
	e.unconfMu.Lock()
	defer e.unconfMu.Unlock()
	m := e.unconf[cond]
	if m == nil {
		m = map[string]time.Time{}
		e.unconf[cond] = m
	}
	since, ok := m[tree]
	if !ok {
		since = now
		m[tree] = since
	}
	what := "not applying the source's manifest"
	if cond == CondHolderUnconfirmed {
		what = "not publishing this node's manifest"
	}
	e.cfg.Conditions.Raise(cond, fmt.Sprintf("tree %s: cannot read the group status since %s, %s: %v",
		tree, since.UTC().Format(time.RFC3339), what, err))
	if d := now.Sub(since); d > e.cfg.ConfirmWithin {
		return fmt.Errorf("%s: tree %s could not read the group status for %s (longer than %s): %w",
			cond, tree, d.Round(time.Millisecond), e.cfg.ConfirmWithin, err)
	}
	return nil
}

// confirmed ends tree's unconfirmed state for cond; the condition clears
// when no tree is left in it.
func (e *Engine) confirmed(cond, tree string) {
	e.unconfMu.Lock()
	defer e.unconfMu.Unlock()
	m := e.unconf[cond]
	if _, ok := m[tree]; !ok {
		return
	}
	delete(m, tree)
	if len(m) == 0 {
		e.cfg.Conditions.Clear(cond)
	}
}

func (e *Engine) gcLoop(ctx context.Context) error {
	t := time.NewTicker(e.cfg.GCInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		if e.currentRole().Holder != e.cfg.Node {
			continue
		}
		n, err := e.store.GC(ctx, e.cfg.GCGrace)
		if err != nil {
			e.log.Warn("content gc failed", "err", err)
			continue
		}
		if n > 0 {
			e.log.Info("content gc", "deleted", n)
		}
	}
}

func (e *Engine) emit(ctx context.Context, p events.Payload, opts ...events.Option) {
	if e.cfg.Outbox != nil {
		// A peer's newer status supersedes one still waiting: the arbiter
		// wants the latest word on whether a target caught up.
		key := ""
		if st, ok := p.(events.ReplicationStatus); ok {
			key = "status/" + st.Peer + "/" + st.Tree
		}
		if _, err := e.cfg.Outbox.Post(key, p, opts...); err != nil {
			e.log.Warn("publish failed", "type", p.EventType(), "err", err)
		}
		return
	}
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if _, err := e.bus.Emit(pctx, p, opts...); err != nil {
		e.log.Warn("publish failed", "type", p.EventType(), "err", err)
	}
}

// nudge wakes a worker without blocking; one pending wake is enough.
func nudge(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}
