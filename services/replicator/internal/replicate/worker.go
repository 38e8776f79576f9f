package replicate

import (
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/fanpbx/fan/pkg/ami"
	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/durablefile"
	"github.com/fanpbx/fan/services/replicator/internal/astdb"
	"github.com/fanpbx/fan/services/replicator/internal/fstree"
	"github.com/fsnotify/fsnotify"
	"github.com/nats-io/nats.go"
)

type ackMsg struct {
	env events.Envelope
	a   events.ReplicationApplied
	at  time.Time
}

// A tree's worker is two halves and what they share. The source half
// scans the tree, uploads contents and publishes manifests, and turns
// targets' confirmations into status reports; the target half fetches the
// holder's manifests, validates and applies them, and confirms. They share
// only the contract between them (the manifest and the confirmation, in
// pkg/events and fstree), the tree itself, and what this node last had
// confirmed (known): that survives a change of direction, because a node
// that stops being the source needs it to tell replicated files from local
// changes once it is a target. The worker's run goroutine owns all three
// and calls one half or the other as the group status says.

// shared is what both halves use: the engine's plumbing, the tree, the
// role acted on, what this node last had confirmed, and the state of a
// group status that cannot be read.
type shared struct {
	e   *Engine
	t   Tree
	log *slog.Logger
	sc  *fstree.Scanner

	roleCh chan struct{}
	fsCh   chan time.Time
	// pend is what notifications named since the source last looked.
	pend pendingPaths
	// rebaseCh brings a full manifest published beside the worker.
	rebaseCh chan rebaseOutcome

	role role // as last acted on

	// known maps each path to what this node last had confirmed (as
	// source) or applied (as target); persisted in state_dir.
	known     map[string]string
	lastAlarm string
	// knownSaved is when known was last written; knownDirty says a delta
	// changed it since (delta.go: saveKnownSoon).
	knownSaved time.Time
	knownDirty bool

	// backoff is the next retry's delay while the group status cannot be
	// read (0 otherwise); giveUp is set once that has lasted longer than
	// ConfirmWithin, and ends run.
	backoff time.Duration
	giveUp  error
}

// worker replicates one tree; all its state is owned by its run goroutine.
type worker struct {
	*shared
	src *source
	tgt *target

	manifestCh chan struct{}
	ackMu      sync.Mutex
	acks       []ackMsg
	ackCh      chan struct{}

	// AstDB trees: the deltas of the holder followed (deltaFrom, through
	// deltaSub), and standbys' requests for a reconcile.
	deltaMsgs chan *nats.Msg
	deltaSub  *nats.Subscription
	deltaFrom string
	resyncCh  chan struct{}

	// scanCh brings a periodic scan run in the background (delta.go).
	scanCh chan scanOutcome
}

func newWorker(e *Engine, t Tree) (*worker, error) {
	if err := events.ValidToken("tree name", t.Name); err != nil {
		return nil, err
	}
	sh := &shared{e: e, t: t, log: e.log.With("tree", t.Name),
		roleCh: make(chan struct{}, 1), fsCh: make(chan time.Time, 1), rebaseCh: make(chan rebaseOutcome, 1)}
	if !t.isAstDB() {
		sh.sc = &fstree.Scanner{Root: t.Root, Exclude: t.Exclude, Workers: e.cfg.Workers}
	}
	k, err := sh.loadKnown()
	if err != nil {
		return nil, err
	}
	sh.known = k
	w := &worker{
		shared: sh, src: newSource(sh), tgt: &target{shared: sh},
		manifestCh: make(chan struct{}, 1), ackCh: make(chan struct{}, 1),
		scanCh: make(chan scanOutcome, 1),
	}
	if t.isAstDB() {
		w.src.reg.mirror = astdb.NewMirror(t.Families)
		w.tgt.reg.reset()
		w.deltaMsgs = make(chan *nats.Msg, 1024)
		w.resyncCh = make(chan struct{}, 1)
	}
	return w, nil
}

func (w *worker) ack(a ackMsg) {
	w.ackMu.Lock()
	w.acks = append(w.acks, a)
	w.ackMu.Unlock()
	nudge(w.ackCh)
}

func (w *worker) run(ctx context.Context) error {
	if w.sc != nil {
		if err := w.sc.RemoveTemps(); err != nil {
			w.log.Warn("removing crash leftovers", "err", err)
		}
		go w.notify(ctx)
	}
	scan := time.NewTimer(w.e.cfg.ScanInterval)
	defer scan.Stop()
	var (
		poll, reconcile <-chan time.Time
		astdbEvents     <-chan ami.Event
		astdbGaps       <-chan struct{}
	)
	resyncLater := time.NewTimer(time.Hour)
	resyncLater.Stop()
	if w.t.isAstDB() {
		if len(w.t.polledFamilies()) > 0 {
			p := time.NewTicker(max(w.t.Poll, 100*time.Millisecond))
			defer p.Stop()
			poll = p.C
		}
		every := w.t.Reconcile
		if every <= 0 {
			every = time.Minute
		}
		r := time.NewTicker(every)
		defer r.Stop()
		reconcile = r.C
		if w.t.Watch != nil {
			astdbEvents, astdbGaps = w.t.Watch.Events(), w.t.Watch.Gaps()
		}
	}
	askAgain := time.NewTicker(resyncEvery)
	defer askAgain.Stop()
	if !w.t.isAstDB() {
		askAgain.Stop()
	}
	defer func() {
		if w.deltaSub != nil {
			_ = w.deltaSub.Unsubscribe()
		}
	}()
	debounce := time.NewTimer(time.Hour)
	debounce.Stop()
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	armed := false

	defer w.flushKnown(false)
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev := <-astdbEvents:
			w.onAstDBEvents(ctx, ev)
		case <-astdbGaps:
			w.onAstDBGap(ctx)
		case msg := <-w.deltaMsgs:
			w.onDeltaMsg(ctx, msg)
		case <-w.resyncCh:
			w.onResyncRequest(ctx, resyncLater)
		case <-resyncLater.C:
			w.onResyncRequest(ctx, resyncLater)
		case <-askAgain.C:
			if w.isTarget() && w.tgt.reg.gapAt != 0 {
				w.tgt.askResync(ctx)
			}
		case <-reconcile:
			// The holder reads its families whole; a standby re-checks its
			// own against the holder's manifest, repairing local drift.
			w.followHolder()
			if !w.onTick(ctx, false) {
				retry.Reset(w.retryIn(time.Second))
			}
		case <-w.roleCh:
			w.onRole(ctx)
		case t := <-w.fsCh:
			if !w.isSource() {
				continue
			}
			w.src.noteChange(t)
			if !armed {
				debounce.Reset(w.e.cfg.Debounce)
				armed = true
			}
		case <-debounce.C:
			armed = false
			if w.isSource() && !w.src.passNotified(ctx) {
				retry.Reset(w.retryIn(time.Second))
			}
		case <-poll:
			if w.isSource() {
				w.src.poll(ctx)
			}
		case <-w.manifestCh:
			if w.isTarget() && !w.tgt.apply(ctx, false) {
				retry.Reset(w.retryIn(2 * time.Second))
			}
		case <-w.ackCh:
			w.ackMu.Lock()
			acks := w.acks
			w.acks = nil
			w.ackMu.Unlock()
			for _, a := range acks {
				w.src.onAck(ctx, a)
			}
		case <-retry.C:
			// A plain failure waits for the next scan; one that could not
			// read the group status retries with backoff until it can or
			// gives up.
			if !w.onTick(ctx, true) && w.backoff > 0 {
				retry.Reset(w.retryIn(0))
			}
		case <-scan.C:
			next := w.e.cfg.ScanInterval
			switch {
			case w.t.isAstDB():
				// Its reconcile ticker does the rest, less often.
				if w.isSource() {
					w.src.updateLag()
				}
			case w.isSource() && w.src.chained() && !w.src.resend, w.isTarget() && w.tgt.chainedTo(w.role):
				// In the background: changes go on being applied and
				// published while it walks; the timer is set again when
				// it is done.
				w.startScan(ctx)
				next = 0
			default:
				w.onTick(ctx, false)
			}
			w.flushKnown(false)
			if next > 0 {
				scan.Reset(next)
			}
		case o := <-w.rebaseCh:
			w.src.rebased(o)
		case o := <-w.scanCh:
			if !w.scanned(ctx, o) {
				retry.Reset(w.retryIn(time.Second))
			}
			if w.isSource() {
				w.src.updateLag()
			}
			scan.Reset(max(w.e.cfg.ScanInterval, scanCost*o.took))
		}
		if w.giveUp != nil {
			return w.giveUp
		}
	}
}

// retryIn is the delay before the next retry: def normally, the backoff
// (250 ms doubling to 5 s) while the group status cannot be read.
func (w *shared) retryIn(def time.Duration) time.Duration {
	if w.backoff == 0 {
		return def
	}
	d := w.backoff
	w.backoff = min(2*w.backoff, 5*time.Second)
	return d
}

// unconfirmed enters (or stays in) the state in which the group status
// cannot be read: retries back off, cond is raised, and past ConfirmWithin
// run ends.
func (w *shared) unconfirmed(cond string, err error) {
	if w.backoff == 0 {
		w.backoff = 250 * time.Millisecond
	}
	if gu := w.e.unconfirmed(cond, w.t.Name, err); gu != nil {
		w.log.Error("cannot read the group status within confirm_within; exiting for a restart", "condition", cond, "err", gu)
		w.giveUp = gu
	}
}

// confirmedStatus leaves that state.
func (w *shared) confirmedStatus(cond string) {
	w.backoff = 0
	w.e.confirmed(cond, w.t.Name)
}

func (w *shared) isSource() bool { return w.role.Holder == w.e.cfg.Node && w.role.Epoch > 0 }
func (w *shared) isTarget() bool { return w.role.Holder != "" && w.role.Holder != w.e.cfg.Node }

func (w *worker) onRole(ctx context.Context) {
	r := w.e.currentRole()
	if r == w.role {
		return
	}
	was := w.isSource()
	w.role = r
	if w.t.isAstDB() {
		w.followHolder()
	}
	// A new role starts afresh: whatever could not be confirmed was about
	// the old one.
	w.confirmedStatus(CondSourceUnconfirmed)
	w.confirmedStatus(CondHolderUnconfirmed)
	w.tgt.newRole()
	if w.isSource() {
		w.src.start(ctx)
		return
	}
	w.e.m.source.WithLabelValues(w.t.Name).Set(0)
	if was {
		w.src.stop()
	}
	if w.isTarget() {
		w.tgt.apply(ctx, false)
	}
}

func (w *worker) onTick(ctx context.Context, retry bool) bool {
	switch {
	case w.isSource():
		var ok bool
		if w.src.chained() && !w.src.resend {
			// The periodic scan (not a retry, which looks again at what
			// failed) walks the whole tree: the safety net behind
			// notifications.
			ok = w.src.deltaPass(ctx, !retry)
			w.flushKnown(false)
		} else {
			ok = w.src.pass(ctx, false)
		}
		w.src.updateLag()
		return ok
	case w.isTarget():
		// The full re-check also repairs local drift on the target.
		return w.tgt.apply(ctx, !retry)
	}
	return true
}

func nudgeTime(ch chan time.Time, t time.Time) {
	select {
	case ch <- t:
	default:
	}
}

func (w *shared) alarm(ctx context.Context, reason events.AlarmReason, msg string, deletes, files int64) {
	w.alarmFrom(ctx, "", reason, msg, deletes, files, "")
}

// alarmFrom raises an alarm once per reason (and generation), not per pass.
func (w *shared) alarmFrom(ctx context.Context, source string, reason events.AlarmReason, msg string, deletes, files int64, gen string) {
	key := string(reason) + "/" + gen
	if w.lastAlarm == key {
		return
	}
	w.lastAlarm = key
	w.log.Error("replication stopped for a human", "reason", reason, "msg", msg)
	w.e.emit(ctx, events.ReplicationAlarm{Node: w.e.cfg.Node, Source: source, Group: w.e.cfg.Group, Tree: w.t.Name,
		Reason: reason, Deletes: deletes, TargetFiles: files, MaxShare: w.e.cfg.MaxDeleteShare, Message: msg},
		events.WithEpoch(w.role.Epoch))
}

// notify turns file-system notifications into pass requests. Every
// directory is watched (inotify is not recursive); a new directory is
// watched as soon as it appears, and the pass's full scan covers whatever
// was created in it before the watch was in place.
func (w *shared) notify(ctx context.Context) {
	for ctx.Err() == nil {
		if err := w.notifyOnce(ctx); err != nil && ctx.Err() == nil {
			level := slog.LevelWarn
			if errors.Is(err, os.ErrNotExist) {
				level = slog.LevelDebug // a target's root appears with its first apply
			}
			w.log.Log(ctx, level, "file notifications failed; relying on periodic scans until they work again", "err", err)
			select {
			case <-ctx.Done():
			case <-time.After(5 * time.Second):
			}
		}
	}
}

func (w *shared) notifyOnce(ctx context.Context) error {
	fw, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("fsnotify: %w", err)
	}
	defer fw.Close()
	if _, err := os.Stat(w.t.Root); err != nil {
		return fmt.Errorf("watch %s: %w", w.t.Root, err)
	}
	// watched are the directories watched, by the path they were watched
	// under: a directory renamed inside the tree keeps its watches (and
	// its subdirectories'), which would go on naming the old paths; they
	// are dropped when it moves, and its new name is watched afresh.
	watched := map[string]bool{}
	addTree := func(dir string) {
		_ = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
			if err != nil || !d.IsDir() {
				return nil
			}
			if rel, _ := filepath.Rel(w.t.Root, p); rel != "." && w.t.Exclude.ExcludedAnywhere(filepath.ToSlash(rel), true) {
				return filepath.SkipDir
			}
			if err := fw.Add(p); err != nil {
				w.log.Warn("watch", "dir", p, "err", err)
				return nil
			}
			watched[p] = true
			return nil
		})
	}
	dropTree := func(dir string) {
		if !watched[dir] {
			return
		}
		prefix := dir + string(filepath.Separator)
		for p := range watched {
			if p == dir || strings.HasPrefix(p, prefix) {
				_ = fw.Remove(p)
				delete(watched, p)
			}
		}
	}
	addTree(w.t.Root)
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-fw.Events:
			if !ok {
				return errors.New("fsnotify closed")
			}
			now := time.Now()
			rel, err := filepath.Rel(w.t.Root, ev.Name)
			if err != nil {
				continue
			}
			isDir := false
			if ev.Has(fsnotify.Create) {
				if fi, err := os.Lstat(ev.Name); err == nil && fi.IsDir() {
					isDir = true
				}
			}
			if ev.Has(fsnotify.Rename) || ev.Has(fsnotify.Remove) {
				dropTree(ev.Name)
			}
			if rel != "." && w.t.Exclude.ExcludedAnywhere(filepath.ToSlash(rel), isDir) {
				continue
			}
			if isDir {
				addTree(ev.Name)
			}
			w.pend.add(filepath.ToSlash(rel))
			nudgeTime(w.fsCh, now)
		case err, ok := <-fw.Errors:
			if !ok {
				return errors.New("fsnotify closed")
			}
			// An overflow lost events: the next pass scans everything.
			w.log.Warn("file notification error", "err", err)
			w.pend.addAll()
			nudgeTime(w.fsCh, time.Now())
		}
	}
}

// stateFile keeps what this node last had confirmed for a tree, across restarts.
func (w *shared) stateFile() string {
	return filepath.Join(w.e.cfg.StateDir, w.e.cfg.Group+"."+w.t.Name+".known.json.gz")
}

func (w *shared) loadKnown() (map[string]string, error) {
	f, err := os.Open(w.stateFile())
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("state %s: %w", w.stateFile(), err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		return nil, fmt.Errorf("state %s: %w", w.stateFile(), err)
	}
	var k map[string]string
	if err := json.NewDecoder(zr).Decode(&k); err != nil {
		return nil, fmt.Errorf("state %s: %w", w.stateFile(), err)
	}
	return k, nil
}

func (w *shared) saveKnown() error {
	if err := os.MkdirAll(w.e.cfg.StateDir, 0o700); err != nil {
		return fmt.Errorf("state dir: %w", err)
	}
	err := durablefile.WriteFrom(w.stateFile(), 0o600, func(f io.Writer) error {
		zw, _ := gzip.NewWriterLevel(f, gzip.BestSpeed)
		if err := json.NewEncoder(zw).Encode(w.known); err != nil {
			return err
		}
		return zw.Close()
	})
	if err != nil {
		return fmt.Errorf("state: %w", err)
	}
	return nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
