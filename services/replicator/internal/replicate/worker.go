package replicate

import (
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/services/replicator/internal/astdb"
	"github.com/fanpbx/fan/services/replicator/internal/fstree"
	"github.com/fanpbx/fan/services/replicator/internal/store"
	"github.com/fsnotify/fsnotify"
)

type ackMsg struct {
	env events.Envelope
	a   events.ReplicationApplied
	at  time.Time
}

// published is a manifest this node published as source.
type published struct {
	m         *fstree.Manifest
	started   time.Time // pass start
	published time.Time
}

// worker replicates one tree; all its state is owned by its run goroutine.
type worker struct {
	e   *Engine
	t   Tree
	log *slog.Logger
	sc  *fstree.Scanner

	roleCh, manifestCh chan struct{}
	fsCh               chan time.Time
	ackMu              sync.Mutex
	acks               []ackMsg
	ackCh              chan struct{}

	role role // as last acted on

	// source side
	changedAt time.Time // oldest change not yet in a published manifest
	dirty     bool
	recent    []published // newest last, a few kept to resolve late acks
	lastGen   uint64
	peers     map[string]peerState
	lastAlarm string
	// progressOut: a progress manifest of this node is in the bucket;
	// progressFiles: how many files the last one listed.
	progressOut   bool
	progressFiles int

	// target side, and both: what this node last had confirmed
	known      map[string]string
	appliedGen uint64
	appliedEp  uint64
	// progressGen: the holder's last progress manifest applied;
	// progressDone: what progress manifests wrote since the last
	// confirmation, which counts it as part of the pass it confirms.
	progressGen  uint64
	progressDone fstree.ApplyResult

	// backoff is the next retry's delay while the group status cannot be
	// read (0 otherwise); giveUp is set once that has lasted longer than
	// ConfirmWithin, and ends run.
	backoff time.Duration
	giveUp  error
}

type peerState struct {
	gen      uint64
	caughtUp bool
}

const keepRecent = 16

func newWorker(e *Engine, t Tree) (*worker, error) {
	if err := events.ValidToken("tree name", t.Name); err != nil {
		return nil, err
	}
	w := &worker{
		e: e, t: t, log: e.log.With("tree", t.Name),
		roleCh: make(chan struct{}, 1), manifestCh: make(chan struct{}, 1), fsCh: make(chan time.Time, 1),
		ackCh: make(chan struct{}, 1), peers: map[string]peerState{},
	}
	if !t.isAstDB() {
		w.sc = &fstree.Scanner{Root: t.Root, Exclude: t.Exclude, Workers: e.cfg.Workers}
	}
	k, err := w.loadKnown()
	if err != nil {
		return nil, err
	}
	w.known = k
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
		if err := fstree.RemoveTemps(w.t.Root); err != nil {
			w.log.Warn("removing crash leftovers", "err", err)
		}
		go w.notify(ctx)
	}
	scan := time.NewTicker(w.e.cfg.ScanInterval)
	defer scan.Stop()
	var poll <-chan time.Time
	if w.t.isAstDB() {
		p := time.NewTicker(max(w.t.Poll, 100*time.Millisecond))
		defer p.Stop()
		poll = p.C
	}
	debounce := time.NewTimer(time.Hour)
	debounce.Stop()
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	armed := false

	for {
		select {
		case <-ctx.Done():
			return nil
		case <-w.roleCh:
			w.onRole(ctx)
		case t := <-w.fsCh:
			if !w.isSource() {
				continue
			}
			if w.changedAt.IsZero() || t.Before(w.changedAt) {
				w.changedAt = t
			}
			w.dirty = true
			if !armed {
				debounce.Reset(w.e.cfg.Debounce)
				armed = true
			}
		case <-debounce.C:
			armed = false
			if w.isSource() && !w.pass(ctx, false) {
				retry.Reset(w.retryIn(time.Second))
			}
		case <-poll:
			if w.isSource() {
				w.pass(ctx, false)
			}
		case <-w.manifestCh:
			if w.isTarget() && !w.apply(ctx, false) {
				retry.Reset(w.retryIn(2 * time.Second))
			}
		case <-w.ackCh:
			w.ackMu.Lock()
			acks := w.acks
			w.acks = nil
			w.ackMu.Unlock()
			for _, a := range acks {
				w.onAck(ctx, a)
			}
		case <-retry.C:
			// A plain failure waits for the next scan; one that could not
			// read the group status retries with backoff until it can or
			// gives up.
			if !w.onTick(ctx, true) && w.backoff > 0 {
				retry.Reset(w.retryIn(0))
			}
		case <-scan.C:
			w.onTick(ctx, false)
		}
		if w.giveUp != nil {
			return w.giveUp
		}
	}
}

// retryIn is the delay before the next retry: def normally, the backoff
// (250 ms doubling to 5 s) while the group status cannot be read.
func (w *worker) retryIn(def time.Duration) time.Duration {
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
func (w *worker) unconfirmed(cond string, err error) {
	if w.backoff == 0 {
		w.backoff = 250 * time.Millisecond
	}
	if gu := w.e.unconfirmed(cond, w.t.Name, err); gu != nil {
		w.log.Error("cannot read the group status within confirm_within; exiting for a restart", "condition", cond, "err", gu)
		w.giveUp = gu
	}
}

// confirmedStatus leaves that state.
func (w *worker) confirmedStatus(cond string) {
	w.backoff = 0
	w.e.confirmed(cond, w.t.Name)
}

func (w *worker) isSource() bool { return w.role.Holder == w.e.cfg.Node && w.role.Epoch > 0 }
func (w *worker) isTarget() bool { return w.role.Holder != "" && w.role.Holder != w.e.cfg.Node }

func (w *worker) onRole(ctx context.Context) {
	r := w.e.currentRole()
	if r == w.role {
		return
	}
	was := w.isSource()
	w.role = r
	// A new role starts afresh: whatever could not be confirmed was about
	// the old one.
	w.confirmedStatus(CondSourceUnconfirmed)
	w.confirmedStatus(CondHolderUnconfirmed)
	// Progress manifests are per holder and epoch (generations come from
	// the holder's clock).
	w.progressDone, w.progressGen = fstree.ApplyResult{}, 0
	if w.isSource() {
		w.e.m.source.WithLabelValues(w.t.Name).Set(1)
		w.log.Info("source of the tree", "epoch", r.Epoch)
		// A new epoch always publishes, even an unchanged tree, so every
		// peer confirms against this epoch before any failback.
		w.peers = map[string]peerState{}
		w.recent = nil
		w.changedAt, w.dirty = time.Now(), true
		w.pass(ctx, true)
		return
	}
	w.e.m.source.WithLabelValues(w.t.Name).Set(0)
	if was {
		w.log.Info("no longer source", "holder", r.Holder, "epoch", r.Epoch)
		w.e.m.caughtUp.DeletePartialMatch(map[string]string{"tree": w.t.Name})
		w.e.m.lag.DeletePartialMatch(map[string]string{"tree": w.t.Name})
	}
	if w.isTarget() {
		w.apply(ctx, false)
	}
}

func (w *worker) onTick(ctx context.Context, retry bool) bool {
	switch {
	case w.isSource():
		ok := w.pass(ctx, false)
		w.updateLag()
		return ok
	case w.isTarget():
		// The full re-check also repairs local drift on the target.
		return w.apply(ctx, !retry)
	}
	return true
}

// read lists the tree as it is now.
func (w *worker) read(ctx context.Context) ([]fstree.Entry, error) {
	if w.t.isAstDB() {
		actx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		return astdb.Read(actx, w.t.AMI, w.t.Families)
	}
	res, err := w.sc.Scan(ctx)
	if err != nil {
		return nil, err
	}
	if res.Unsettled > 0 {
		// Files still being written: publish what was read, look again.
		w.dirty = true
		nudgeTime(w.fsCh, time.Now())
	}
	return res.Entries, nil
}

func nudgeTime(ch chan time.Time, t time.Time) {
	select {
	case ch <- t:
	default:
	}
}

// pass publishes a new manifest when the tree changed (or force). It
// returns false when it should be retried.
func (w *worker) pass(ctx context.Context, force bool) bool {
	start := time.Now()
	epoch := w.role.Epoch
	changedAt := w.changedAt
	if changedAt.IsZero() {
		changedAt = start
	}
	w.dirty = false
	entries, err := w.read(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return true
		}
		if errors.Is(err, fstree.ErrRootMissing) {
			w.alarm(ctx, events.AlarmSourceMissing, fmt.Sprintf("source tree %s is missing (unmounted?); nothing published", w.t.Root), 0, 0)
			w.e.m.passes.WithLabelValues(w.t.Name, "source", "alarm").Inc()
			return true
		}
		w.log.Warn("source read failed", "err", err)
		w.e.m.passes.WithLabelValues(w.t.Name, "source", "error").Inc()
		w.dirty = true
		return false
	}
	if fstree.Files(entries) == 0 && len(w.known) > 0 && !w.t.isAstDB() {
		w.alarm(ctx, events.AlarmSourceEmpty, fmt.Sprintf("source tree %s is empty but held %d files; not published, so no target deletes anything", w.t.Root, len(w.known)), int64(len(w.known)), 0)
		w.e.m.passes.WithLabelValues(w.t.Name, "source", "alarm").Inc()
		return true
	}
	digest := fstree.Digest(entries)
	var last *published
	if n := len(w.recent); n > 0 {
		last = &w.recent[n-1]
	}
	if !force && last != nil && last.m.Digest == digest && last.m.Epoch == epoch {
		w.changedAt = time.Time{}
		return true
	}
	if w.lastAlarm != "" {
		w.lastAlarm = ""
	}

	progress := func() {
		if err := w.publishProgress(ctx, epoch, entries, start, changedAt); err != nil && ctx.Err() == nil {
			w.log.Debug("progress manifest not published", "err", err)
		}
	}
	files, bytes, err := w.upload(ctx, entries, progress)
	if err != nil {
		if ctx.Err() == nil {
			w.log.Warn("upload failed", "err", err)
			w.e.m.passes.WithLabelValues(w.t.Name, "source", "error").Inc()
		}
		w.dirty = true
		w.changedAt = changedAt
		return false
	}
	if err := w.e.confirmHolder(ctx, epoch); err != nil {
		if ctx.Err() != nil {
			return true
		}
		if !errors.Is(err, errNotHolder) {
			// Not known to have lost the role, only unable to tell: keep
			// the change pending and retry.
			w.log.Warn("cannot confirm this node still holds; not publishing", "epoch", epoch, "err", err)
			w.e.m.passes.WithLabelValues(w.t.Name, "source", "unconfirmed").Inc()
			w.dirty = true
			w.changedAt = changedAt
			w.unconfirmed(CondHolderUnconfirmed, err)
			return false
		}
		w.confirmedStatus(CondHolderUnconfirmed)
		w.log.Warn("not publishing", "err", err)
		w.e.m.passes.WithLabelValues(w.t.Name, "source", "not_holder").Inc()
		nudge(w.roleCh)
		return true
	}
	w.confirmedStatus(CondHolderUnconfirmed)
	gen := max(uint64(time.Now().UnixNano()), w.lastGen+1)
	m := &fstree.Manifest{
		Cluster: w.e.cfg.Cluster, Group: w.e.cfg.Group, Tree: w.t.Name, Node: w.e.cfg.Node,
		Epoch: epoch, Generation: gen, Created: start.UTC(), Changed: changedAt.UTC(), Digest: digest, Entries: entries,
	}
	if err := w.e.store.PutManifest(ctx, m); err != nil {
		if ctx.Err() == nil {
			w.log.Warn("publishing manifest failed", "err", err)
			w.e.m.passes.WithLabelValues(w.t.Name, "source", "error").Inc()
		}
		w.dirty = true
		w.changedAt = changedAt
		return false
	}
	w.lastGen = gen
	if w.progressOut {
		w.progressOut = false
		if err := w.e.store.DeleteProgress(ctx, w.e.cfg.Cluster, w.e.cfg.Group, w.t.Name, w.e.cfg.Node); err != nil {
			w.log.Debug("progress manifest left behind", "err", err)
		}
	}
	if !w.dirty {
		w.changedAt = time.Time{}
	}
	w.recent = append(w.recent, published{m: m, started: start, published: time.Now()})
	if len(w.recent) > keepRecent {
		w.recent = w.recent[len(w.recent)-keepRecent:]
	}
	w.e.m.passes.WithLabelValues(w.t.Name, "source", "published").Inc()
	w.e.m.duration.WithLabelValues(w.t.Name, "source").Observe(time.Since(start).Seconds())
	w.e.m.files.WithLabelValues(w.t.Name, "source").Add(float64(files))
	w.e.m.bytes.WithLabelValues(w.t.Name, "source").Add(float64(bytes))
	w.log.Debug("manifest published", "generation", gen, "epoch", epoch, "entries", len(entries), "uploaded", files, "bytes", bytes,
		"ms", time.Since(start).Milliseconds())
	return true
}

// progressEvery: during an upload longer than this, a progress manifest
// (what is stored so far) is published this often, so targets fetch while
// the source still uploads instead of after it.
const progressEvery = time.Second

// publishProgress publishes, as a progress manifest, the part of entries
// whose contents are already stored: every directory and symlink, every
// file whose content is in the bucket, and a voicemail .txt only once every
// file of its message (same name, other extensions) is in it too. Targets
// apply it without deleting anything and do not confirm it.
func (w *worker) publishProgress(ctx context.Context, epoch uint64, entries []fstree.Entry, start, changedAt time.Time) error {
	part := fstree.StoredPart(entries, w.e.store.Has)
	if fstree.Files(part) == w.progressFiles {
		return nil // nothing new since the last one
	}
	if err := w.e.confirmHolder(ctx, epoch); err != nil {
		return err
	}
	gen := max(uint64(time.Now().UnixNano()), w.lastGen+1)
	m := &fstree.Manifest{
		Cluster: w.e.cfg.Cluster, Group: w.e.cfg.Group, Tree: w.t.Name, Node: w.e.cfg.Node,
		Epoch: epoch, Generation: gen, Created: start.UTC(), Changed: changedAt.UTC(), Digest: fstree.Digest(part), Entries: part,
	}
	if err := w.e.store.PutProgress(ctx, m); err != nil {
		return err
	}
	w.lastGen = gen
	w.progressOut = true
	w.progressFiles = fstree.Files(part)
	w.log.Debug("progress manifest published", "generation", gen, "files", w.progressFiles)
	return nil
}

// upload stores the content of every file the bucket lacks, calling
// progress every progressEvery while it runs.
func (w *worker) upload(ctx context.Context, entries []fstree.Entry, progress func()) (int64, int64, error) {
	var todo []fstree.Entry
	seen := map[string]bool{}
	for _, e := range entries {
		if e.Kind == fstree.KindFile && !seen[e.Hash] && !w.e.store.Has(e.Hash) {
			seen[e.Hash] = true
			todo = append(todo, e)
		}
	}
	if len(todo) == 0 {
		return 0, 0, nil
	}
	// Uploads mostly wait on the bus: twice as many as hash.
	workers := 2 * max(w.e.cfg.Workers, 1)
	var mu sync.Mutex
	var files, bytes int64
	var firstErr error
	ch := make(chan fstree.Entry)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for e := range ch {
				f, err := os.Open(filepath.Join(w.t.Root, filepath.FromSlash(e.Path)))
				var stored bool
				if err == nil {
					stored, err = w.e.store.Put(ctx, e.Hash, f)
					f.Close()
				}
				mu.Lock()
				if err != nil && firstErr == nil {
					firstErr = fmt.Errorf("upload %s: %w", e.Path, err)
				}
				if stored {
					files++
					bytes += e.Size
				}
				mu.Unlock()
			}
		}()
	}
	w.progressFiles = -1
	// The first one early, so targets start fetching at once.
	tick := time.NewTimer(progressEvery / 4)
	defer tick.Stop()
feed:
	for _, e := range todo {
		for {
			mu.Lock()
			failed := firstErr != nil
			mu.Unlock()
			if failed || ctx.Err() != nil {
				break feed
			}
			select {
			case ch <- e:
				continue feed
			case <-tick.C:
				progress()
				tick.Reset(progressEvery)
			case <-ctx.Done():
			}
		}
	}
	close(ch)
	wg.Wait()
	if firstErr == nil {
		firstErr = ctx.Err()
	}
	return files, bytes, firstErr
}

// onAck turns a target's confirmation into a status report.
func (w *worker) onAck(ctx context.Context, am ackMsg) {
	a := am.a
	if !w.isSource() || a.Epoch != w.role.Epoch {
		return
	}
	var pub *published
	for i := range w.recent {
		if w.recent[i].m.Generation == a.Generation {
			pub = &w.recent[i]
		}
	}
	if pub == nil || pub.m.Digest != a.Digest {
		return // a confirmation of a manifest this process did not publish
	}
	latest := w.recent[len(w.recent)-1]
	for _, h := range a.Missing {
		w.e.store.Forget(h)
	}
	if len(a.Missing) > 0 {
		w.log.Warn("peer lacks contents; sending them again", "peer", a.Node, "missing", len(a.Missing))
		w.dirty = true
		nudgeTime(w.fsCh, time.Now())
	}
	caught := a.Error == "" && a.Generation == latest.m.Generation && !w.dirty
	st := events.ReplicationStatus{
		Node: w.e.cfg.Node, Peer: a.Node, Tree: w.t.Name, Group: w.e.cfg.Group,
		Files: a.Files, Bytes: a.Bytes, Deleted: a.Deleted, Generation: a.Generation,
		DurationMS: ms(am.at.Sub(pub.started)),
		LagMS:      ms(am.at.Sub(pub.m.Changed)),
		CaughtUp:   caught, Error: a.Error,
	}
	w.e.emit(ctx, st, events.WithEpoch(w.role.Epoch), events.CausedBy(am.env))
	if a.Error == "" {
		// What a peer confirmed is what this node may later treat as
		// replicated: a file published but never confirmed stays "local"
		// and is preserved, not deleted, if this node becomes a target.
		w.known = fstree.KnownOf(pub.m.Entries)
		if err := w.saveKnown(); err != nil {
			w.log.Warn("saving state", "err", err)
		}
	}
	w.peers[a.Node] = peerState{gen: a.Generation, caughtUp: caught}
	w.updateLag()
}

func (w *worker) updateLag() {
	if len(w.recent) == 0 {
		return
	}
	latest := w.recent[len(w.recent)-1]
	for peer, p := range w.peers {
		up := p.caughtUp && p.gen == latest.m.Generation && !w.dirty
		lag := 0.0
		if !up {
			since := latest.m.Changed
			if w.dirty && !w.changedAt.IsZero() && w.changedAt.Before(since) {
				since = w.changedAt
			}
			lag = time.Since(since).Seconds()
		}
		w.e.m.lag.WithLabelValues(w.t.Name, peer).Set(lag)
		w.e.m.caughtUp.WithLabelValues(w.t.Name, peer).Set(b2f(up))
	}
}

// apply makes this node's tree match the holder's current manifest and
// confirms it. force re-applies a generation already applied (a full
// re-check), confirming again only if it had to change something. It
// returns false when it should be retried.
func (w *worker) apply(ctx context.Context, force bool) bool {
	r := w.role
	name := events.ReplManifestName(w.e.cfg.Cluster, w.e.cfg.Group, w.t.Name, r.Holder)
	m, err := w.e.store.GetManifest(ctx, name)
	if errors.Is(err, store.ErrNoManifest) {
		// The holder has not published yet; it may be uploading.
		w.applyProgress(ctx, 0)
		return true
	}
	if err != nil {
		if ctx.Err() == nil {
			w.log.Warn("reading the holder's manifest failed", "err", err)
		}
		return false
	}
	switch {
	case m.Node != r.Holder || m.Epoch < r.Epoch:
		// From the holder's earlier tenure: wait for this epoch's.
		w.applyProgress(ctx, m.Generation)
		return true
	case m.Epoch > r.Epoch:
		// Our view of the status lags: read it again (setRole wakes us).
		go func() {
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			_ = w.e.confirmHolder(cctx, 0)
		}()
		return true
	}
	if !force && m.Generation == w.appliedGen && m.Epoch == w.appliedEp {
		w.applyProgress(ctx, m.Generation)
		return true
	}
	if err := w.e.confirmTenure(ctx, m.Node, m.Epoch); err != nil {
		if errors.Is(err, errNotHolder) {
			w.confirmedStatus(CondSourceUnconfirmed)
			return true // the direction changed under us: setRole wakes the worker
		}
		if ctx.Err() == nil {
			w.log.Warn("cannot confirm the source still holds; not applying", "source", m.Node, "epoch", m.Epoch, "err", err)
			w.unconfirmed(CondSourceUnconfirmed, err)
		}
		return false
	}
	w.confirmedStatus(CondSourceUnconfirmed)
	start := time.Now()
	var res fstree.ApplyResult
	if w.t.isAstDB() {
		actx, cancel := context.WithTimeout(ctx, 30*time.Second)
		var ar astdb.Result
		ar, err = astdb.Apply(actx, w.t.AMI, w.t.Families, m.Entries,
			astdb.Options{MaxDeleteShare: w.e.cfg.MaxDeleteShare, AllowDeletes: w.e.cfg.AllowDeletes})
		cancel()
		res.Files, res.Deleted = ar.Put, ar.Deleted
	} else {
		res, err = fstree.Apply(ctx, w.sc, m.Entries, fstree.ApplyOptions{
			Exclude: w.t.Exclude, Fetch: w.e.store.Get, Known: w.known,
			ConflictDir:    filepath.Join(w.e.cfg.StateDir, "conflicts", w.e.cfg.Group, w.t.Name),
			MaxDeleteShare: w.e.cfg.MaxDeleteShare, AllowDeletes: w.e.cfg.AllowDeletes,
			Owner: w.e.cfg.Owner, Workers: w.e.cfg.Workers, Now: start,
		})
	}
	if ctx.Err() != nil {
		return true
	}
	changed := res.Files+res.Deleted+res.MetaFixed+int64(len(res.Conflicts)) > 0
	w.reportConflicts(ctx, m, res.Conflicts)
	var valve *fstree.ValveError
	if errors.As(err, &valve) {
		w.e.m.valve.WithLabelValues(w.t.Name).Inc()
		w.alarmFrom(ctx, m.Node, events.AlarmSafetyValve, valve.Error(), int64(valve.Deletes), int64(valve.TargetFiles), fmt.Sprint(m.Generation))
	}
	outcome := "applied"
	if err != nil {
		outcome = "error"
		if valve != nil {
			outcome = "safety_valve"
		}
		w.log.Warn("apply failed", "generation", m.Generation, "err", err)
	}
	w.e.m.passes.WithLabelValues(w.t.Name, "target", outcome).Inc()
	if err == nil {
		w.known = fstree.KnownOf(m.Entries)
		if serr := w.saveKnown(); serr != nil {
			w.log.Warn("saving state", "err", serr)
		}
		newGen := m.Generation != w.appliedGen || m.Epoch != w.appliedEp
		w.appliedGen, w.appliedEp = m.Generation, m.Epoch
		if !newGen && !changed {
			return true
		}
		w.e.m.duration.WithLabelValues(w.t.Name, "target").Observe(time.Since(start).Seconds())
		w.e.m.files.WithLabelValues(w.t.Name, "target").Add(float64(res.Files))
		w.e.m.bytes.WithLabelValues(w.t.Name, "target").Add(float64(res.Bytes))
	}
	a := events.ReplicationApplied{
		Node: w.e.cfg.Node, Source: m.Node, Group: w.e.cfg.Group, Tree: w.t.Name, Epoch: m.Epoch,
		Generation: m.Generation, Digest: m.Digest, Deleted: res.Deleted,
		Files: res.Files + w.progressDone.Files, Bytes: res.Bytes + w.progressDone.Bytes,
		Conflicts: int64(len(res.Conflicts)), DurationMS: ms(time.Since(start)), Missing: res.Missing,
	}
	if err != nil {
		a.Error = err.Error()
		if len(a.Error) > 1024 {
			a.Error = a.Error[:1024]
		}
		if len(a.Missing) > 500 {
			a.Missing = a.Missing[:500]
		}
	}
	w.e.emit(ctx, a, events.WithEpoch(m.Epoch))
	w.progressDone = fstree.ApplyResult{}
	w.log.Debug("applied", "generation", m.Generation, "files", res.Files, "bytes", res.Bytes, "deleted", res.Deleted,
		"err", err, "ms", time.Since(start).Milliseconds())
	return err == nil || valve != nil
}

func (w *worker) reportConflicts(ctx context.Context, m *fstree.Manifest, cs []fstree.Conflict) {
	if len(cs) == 0 {
		return
	}
	w.e.m.conflicts.WithLabelValues(w.t.Name).Add(float64(len(cs)))
	c := events.ReplicationConflict{Node: w.e.cfg.Node, Source: m.Node, Group: w.e.cfg.Group, Tree: w.t.Name, Count: int64(len(cs))}
	for _, cf := range cs[:min(len(cs), events.MaxConflictsListed)] {
		c.Files = append(c.Files, events.ConflictFile{Path: cf.Path, Reason: cf.Reason, PreservedAs: cf.PreservedAs})
	}
	w.log.Warn("local changes preserved before replication replaced them", "count", c.Count)
	w.e.emit(ctx, c, events.WithEpoch(m.Epoch))
}

// applyProgress applies the holder's progress manifest of the current
// epoch if it is newer than floor (the generation of the holder's full
// manifest: a progress manifest left from an earlier pass is older than
// it and never applied). Nothing is deleted and nothing is confirmed: only
// the full manifest earns a confirmation.
func (w *worker) applyProgress(ctx context.Context, floor uint64) {
	if w.t.isAstDB() {
		return
	}
	r := w.role
	p, err := w.e.store.GetManifest(ctx, store.ProgressName(w.e.cfg.Cluster, w.e.cfg.Group, w.t.Name, r.Holder))
	if err != nil {
		if !errors.Is(err, store.ErrNoManifest) && ctx.Err() == nil {
			w.log.Debug("reading the holder's progress manifest failed", "err", err)
		}
		return
	}
	if p.Node != r.Holder || p.Epoch != r.Epoch || p.Generation <= floor || p.Generation <= w.progressGen {
		return
	}
	w.progressGen = p.Generation
	start := time.Now()
	res, err := fstree.Apply(ctx, w.sc, p.Entries, fstree.ApplyOptions{
		Exclude: w.t.Exclude, Fetch: w.e.store.Get, Known: w.known,
		ConflictDir:    filepath.Join(w.e.cfg.StateDir, "conflicts", w.e.cfg.Group, w.t.Name),
		MaxDeleteShare: w.e.cfg.MaxDeleteShare, AllowDeletes: w.e.cfg.AllowDeletes,
		Owner: w.e.cfg.Owner, Workers: w.e.cfg.Workers, Now: start, Partial: true,
	})
	if ctx.Err() != nil {
		return
	}
	w.reportConflicts(ctx, p, res.Conflicts)
	outcome := "progress"
	if err != nil {
		outcome = "progress_error"
	}
	w.e.m.passes.WithLabelValues(w.t.Name, "target", outcome).Inc()
	w.e.m.files.WithLabelValues(w.t.Name, "target").Add(float64(res.Files))
	w.e.m.bytes.WithLabelValues(w.t.Name, "target").Add(float64(res.Bytes))
	w.progressDone.Files += res.Files
	w.progressDone.Bytes += res.Bytes
	if err == nil {
		// What replication put here is replication's, not a local change.
		if w.known == nil {
			w.known = map[string]string{}
		}
		for _, e := range p.Entries {
			if e.Kind != fstree.KindDir {
				w.known[e.Path] = fstree.ContentKey(e)
			}
		}
	}
	w.log.Debug("progress applied", "generation", p.Generation, "files", res.Files, "bytes", res.Bytes,
		"err", err, "ms", time.Since(start).Milliseconds())
}

func (w *worker) alarm(ctx context.Context, reason events.AlarmReason, msg string, deletes, files int64) {
	w.alarmFrom(ctx, "", reason, msg, deletes, files, "")
}

// alarmFrom raises an alarm once per reason (and generation), not per pass.
func (w *worker) alarmFrom(ctx context.Context, source string, reason events.AlarmReason, msg string, deletes, files int64, gen string) {
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
func (w *worker) notify(ctx context.Context) {
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

func (w *worker) notifyOnce(ctx context.Context) error {
	fw, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("fsnotify: %w", err)
	}
	defer fw.Close()
	if _, err := os.Stat(w.t.Root); err != nil {
		return fmt.Errorf("watch %s: %w", w.t.Root, err)
	}
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
			}
			return nil
		})
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
			if rel != "." && w.t.Exclude.ExcludedAnywhere(filepath.ToSlash(rel), isDir) {
				continue
			}
			if isDir {
				addTree(ev.Name)
			}
			nudgeTime(w.fsCh, now)
		case err, ok := <-fw.Errors:
			if !ok {
				return errors.New("fsnotify closed")
			}
			// An overflow lost events: a pass rescans everything anyway.
			w.log.Warn("file notification error", "err", err)
			nudgeTime(w.fsCh, time.Now())
		}
	}
}

// stateFile keeps what this node last had confirmed for a tree, across restarts.
func (w *worker) stateFile() string {
	return filepath.Join(w.e.cfg.StateDir, w.e.cfg.Group+"."+w.t.Name+".known.json.gz")
}

func (w *worker) loadKnown() (map[string]string, error) {
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

func (w *worker) saveKnown() error {
	if err := os.MkdirAll(w.e.cfg.StateDir, 0o700); err != nil {
		return fmt.Errorf("state dir: %w", err)
	}
	tmp, err := os.CreateTemp(w.e.cfg.StateDir, ".state-*")
	if err != nil {
		return fmt.Errorf("state: %w", err)
	}
	defer os.Remove(tmp.Name())
	zw, _ := gzip.NewWriterLevel(tmp, gzip.BestSpeed)
	if err := json.NewEncoder(zw).Encode(w.known); err != nil {
		tmp.Close()
		return fmt.Errorf("state: %w", err)
	}
	if err := zw.Close(); err != nil {
		tmp.Close()
		return fmt.Errorf("state: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("state: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("state: %w", err)
	}
	if err := os.Rename(tmp.Name(), w.stateFile()); err != nil {
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
