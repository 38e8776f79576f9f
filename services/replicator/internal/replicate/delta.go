package replicate

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"path"
	"runtime/debug"
	"slices"
	"sync"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/services/replicator/internal/fstree"
	"github.com/fanpbx/fan/services/replicator/internal/store"
)

// A file tree's source publishes a full manifest when its tenure starts
// and then, for each batch of notified changes, a delta: only the paths
// named by notifications are looked at (stat, and a read of the files
// whose size, times or inode moved), and only what changed is sent. Every
// fullEvery deltas the tree as it stands is published again as the full
// manifest under the last delta's generation (a target that followed the
// deltas already has it and reads only its head), and the deltas it
// includes are deleted one such publication later. The full scan every
// scan_interval is the safety net behind notifications: its differences
// go out as a delta too.

// fullEvery is how many deltas go out between two full manifests: a
// target that joins late, or misses a delta, reads at most that many
// after the full manifest, and the bucket holds at most twice as many.
// A variable only for tests (SetFullEvery).
var fullEvery = 256

// knownSaveEvery bounds how often the known state is written after a
// delta: a crash loses at most that much of it, which makes a file
// replicated meanwhile count as a local change, kept as a conflict when
// replaced, never lost.
const knownSaveEvery = 10 * time.Second

// deleteWindow is how far back deletions made by deltas count with a new
// delta's against the safety valve: a mass deletion that notifications
// cut into many small deltas still meets it.
const deleteWindow = time.Minute

// maxPending is how many notified paths are kept; beyond, the next pass
// scans the whole tree.
const maxPending = 4096

// pendingPaths are the paths notified since the source last looked.
type pendingPaths struct {
	mu    sync.Mutex
	paths map[string]bool
	all   bool // notifications were lost, or too many: scan everything

	// While a periodic scan runs in the background, every path notified
	// is also tracked: deltas carry those, newer than what the scan saw.
	tracking, trackLost bool
	track               map[string]bool
}

func (p *pendingPaths) startTrack() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.tracking, p.trackLost, p.track = true, false, map[string]bool{}
}

// stopTrack ends tracking and returns what was notified meanwhile; lost
// says that is not known.
func (p *pendingPaths) stopTrack() (map[string]bool, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	t, lost := p.track, p.trackLost || !p.tracking
	p.tracking, p.trackLost, p.track = false, false, nil
	return t, lost
}

func (p *pendingPaths) add(rel string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.tracking {
		if rel == "." || rel == "" || len(p.track) >= maxPending {
			p.trackLost = true
		} else {
			p.track[rel] = true
		}
	}
	if p.all {
		return
	}
	if rel == "." || rel == "" || len(p.paths) >= maxPending {
		p.all, p.paths = true, nil
		return
	}
	if p.paths == nil {
		p.paths = map[string]bool{}
	}
	p.paths[rel] = true
}

func (p *pendingPaths) addAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.all, p.paths = true, nil
	if p.tracking {
		p.trackLost = true
	}
}

// take returns what was notified and forgets it.
func (p *pendingPaths) take() ([]string, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	all, paths := p.all, p.paths
	p.all, p.paths = false, nil
	if all {
		return nil, true
	}
	return slices.Collect(maps.Keys(paths)), false
}

// putBack returns what a failed pass took.
func (p *pendingPaths) putBack(rels []string, all bool) {
	if all {
		p.addAll()
		return
	}
	for _, r := range rels {
		p.add(r)
	}
}

// saveKnownSoon persists the known state now if it was not saved within
// knownSaveEvery, and otherwise at the next flushKnown.
func (w *shared) saveKnownSoon() {
	if time.Since(w.knownSaved) < knownSaveEvery {
		w.knownDirty = true
		return
	}
	w.flushKnown(true)
}

// flushKnown saves the known state if a delta changed it since it was saved.
func (w *shared) flushKnown(force bool) {
	if !force && !w.knownDirty {
		return
	}
	w.knownDirty = false
	w.knownSaved = time.Now()
	if err := w.saveKnown(); err != nil {
		w.log.Warn("saving state", "err", err)
	}
}

// knowDelta records in known what a delta carried.
func (w *shared) knowDelta(d *fstree.Delta) {
	if w.known == nil {
		w.known = map[string]string{}
	}
	for _, p := range d.Deleted {
		delete(w.known, p)
	}
	for _, e := range d.Entries {
		if e.Kind != fstree.KindDir {
			w.known[e.Path] = fstree.ContentKey(e)
		} else {
			delete(w.known, e.Path)
		}
	}
}

// setCur makes entries the tree as last published.
func (w *source) setCur(entries []fstree.Entry) {
	w.cur = make(map[string]fstree.Entry, len(entries))
	for _, e := range entries {
		w.cur[e.Path] = e
	}
	w.curFiles = fstree.Files(entries)
}

// chained says whether this tenure published a full manifest that deltas
// can follow.
func (w *source) chained() bool { return w.cur != nil && !w.t.isAstDB() }

// deltaPass publishes what changed since the last publication as a delta:
// the notified paths only, or (all) the whole tree scanned (stat every
// entry, read only what moved). It returns false when it should be retried.
func (w *source) deltaPass(ctx context.Context, all bool) bool {
	start := time.Now()
	changedAt := w.changedAt
	if changedAt.IsZero() {
		changedAt = start
	}
	rels, every := w.pend.take()
	all = all || every
	if !all && len(rels) == 0 {
		if !w.dirty {
			w.changedAt = time.Time{}
		}
		return true
	}
	w.dirty = false
	fail := func() bool {
		w.pend.putBack(rels, all)
		w.dirty = true
		w.changedAt = changedAt
		return false
	}
	var res fstree.ScanResult
	var gone []string
	var err error
	if all {
		res, err = w.sc.Scan(ctx)
	} else {
		res, gone, err = w.sc.ScanPaths(ctx, rels, true)
	}
	if err != nil {
		if ctx.Err() != nil {
			return true
		}
		if errors.Is(err, fstree.ErrRootMissing) {
			w.pend.putBack(rels, all)
			w.alarm(ctx, events.AlarmSourceMissing, fmt.Sprintf("source tree %s is missing (unmounted?); nothing published", w.t.Root), 0, 0)
			w.e.m.passes.WithLabelValues(w.t.Name, "source", "alarm").Inc()
			return true
		}
		w.log.Warn("source read failed", "err", err)
		w.e.m.passes.WithLabelValues(w.t.Name, "source", "error").Inc()
		return fail()
	}
	if res.Unsettled > 0 {
		// Files still being written: publish what was read. The write
		// that unsettled each was notified after the paths were taken,
		// so the next delta looks at it again (a whole scan is not
		// repeated for it: a recording may go on for an hour).
		w.dirty = true
	}
	var changed []fstree.Entry
	var deleted []string
	if all {
		changed, deleted = fstree.DiffAll(w.cur, res.Entries)
	} else {
		changed, deleted = fstree.Diff(w.cur, rels, res.Entries, gone)
	}
	return w.publishDelta(ctx, start, changedAt, changed, deleted, all, fail)
}

// publishDelta uploads and publishes changed and deleted as the next
// delta of the chain; fail undoes what the pass took (and says retry).
func (w *source) publishDelta(ctx context.Context, start, changedAt time.Time, changed []fstree.Entry, deleted []string, all bool, fail func() bool) bool {
	epoch := w.role.Epoch
	if len(changed) == 0 && len(deleted) == 0 {
		if !w.dirty {
			w.changedAt = time.Time{}
		}
		return true
	}
	files := w.curFiles
	for _, p := range deleted {
		if w.cur[p].Kind != fstree.KindDir {
			files--
		}
	}
	for _, e := range changed {
		old, had := w.cur[e.Path]
		switch {
		case (!had || old.Kind == fstree.KindDir) && e.Kind != fstree.KindDir:
			files++
		case had && old.Kind != fstree.KindDir && e.Kind == fstree.KindDir:
			files--
		}
	}
	if files == 0 && len(w.known) > 0 {
		w.pend.addAll() // judged again whole once files are back
		w.alarm(ctx, events.AlarmSourceEmpty, fmt.Sprintf("source tree %s is empty but held %d files; not published, so no target deletes anything", w.t.Root, len(w.known)), int64(len(w.known)), 0)
		w.e.m.passes.WithLabelValues(w.t.Name, "source", "alarm").Inc()
		return true
	}
	w.lastAlarm = ""
	w.room.reset(w.e.cfg.StorePassBytes)
	up, bytes, err := w.upload(ctx, changed, func() {}, nil)
	if err != nil {
		if ctx.Err() == nil {
			w.log.Warn("upload failed", "err", err)
			w.e.m.passes.WithLabelValues(w.t.Name, "source", "error").Inc()
		}
		return fail()
	}
	if w.e.serve != nil {
		w.e.serve.Add(w.t.Name, w.sc.OpenFile, changed)
	}
	switch w.confirmBeforePublish(ctx, epoch) {
	case publishRetry:
		return fail()
	case publishStop:
		return true
	}
	gen := max(uint64(time.Now().UnixNano()), w.lastGen+1)
	d := &fstree.Delta{
		Cluster: w.e.cfg.Cluster, Group: w.e.cfg.Group, Tree: w.t.Name, Node: w.e.cfg.Node,
		Epoch: epoch, Seq: w.seq + 1, Generation: gen, Prev: w.chainGen,
		Created: start.UTC(), Changed: changedAt.UTC(), Files: files,
		Digest: fstree.DeltaDigest(changed, deleted), Entries: changed, Deleted: deleted,
	}
	if err := w.e.store.PutDelta(ctx, d); err != nil {
		if ctx.Err() == nil {
			w.log.Warn("publishing delta failed", "err", err)
			w.e.m.passes.WithLabelValues(w.t.Name, "source", "error").Inc()
		}
		return fail()
	}
	for _, p := range deleted {
		delete(w.cur, p)
	}
	for _, e := range changed {
		w.cur[e.Path] = e
	}
	w.curFiles = files
	w.seq, w.chainGen, w.lastGen = d.Seq, gen, gen
	w.sinceFull++
	if !w.dirty {
		w.changedAt = time.Time{}
	}
	w.remember(published{m: &fstree.Manifest{Epoch: epoch, Generation: gen, Digest: d.Digest, Changed: changedAt.UTC()},
		delta: d, started: start, published: time.Now()})
	w.e.m.passes.WithLabelValues(w.t.Name, "source", "published").Inc()
	w.e.m.duration.WithLabelValues(w.t.Name, "source").Observe(time.Since(start).Seconds())
	w.e.m.files.WithLabelValues(w.t.Name, "source").Add(float64(up))
	w.e.m.bytes.WithLabelValues(w.t.Name, "source").Add(float64(bytes))
	w.log.Debug("delta published", "seq", d.Seq, "generation", gen, "epoch", epoch, "changed", len(changed),
		"deleted", len(deleted), "scanned_all", all, "uploaded", up, "ms", time.Since(start).Milliseconds())
	if w.sinceFull >= fullEvery {
		w.rebase(ctx)
	}
	return true
}

// remember keeps a publication to resolve confirmations with; only the
// newest full manifest keeps its entries (a 50,000-file tree's are some
// ten megabytes).
func (w *source) remember(p published) {
	if p.delta == nil && p.m.Entries != nil {
		for i := range w.recent {
			if w.recent[i].delta == nil && w.recent[i].m.Entries != nil {
				head := *w.recent[i].m
				head.Entries = nil
				w.recent[i].m = &head
			}
		}
	}
	w.recent = append(w.recent, p)
	if len(w.recent) > keepRecent {
		w.recent = w.recent[len(w.recent)-keepRecent:]
	}
}

// rebase publishes the tree as the deltas left it as the full manifest,
// under the last delta's generation: a target that followed them reads
// only its head. It runs beside the worker (on a 50,000-file tree the
// digest, encoding and upload take some half a second, which a change
// would otherwise wait for); rebased takes the outcome.
func (w *source) rebase(ctx context.Context) {
	if w.rebasing || w.cur == nil {
		return
	}
	entries := slices.Collect(maps.Values(w.cur))
	fstree.Sort(entries)
	now := time.Now().UTC()
	m := &fstree.Manifest{
		Cluster: w.e.cfg.Cluster, Group: w.e.cfg.Group, Tree: w.t.Name, Node: w.e.cfg.Node,
		Epoch: w.role.Epoch, Generation: w.chainGen, AsOf: w.seq, Created: now, Changed: now, Entries: entries,
	}
	w.rebasing, w.sinceFull = true, 0
	tenure := w.tenure
	go func() {
		m.Digest = fstree.Digest(m.Entries)
		err := w.e.confirmHolder(ctx, m.Epoch)
		if err == nil {
			err = w.e.store.PutManifest(ctx, m)
		}
		select {
		case w.rebaseCh <- rebaseOutcome{m: m, tenure: tenure, err: err}:
		case <-ctx.Done():
		}
	}()
}

// rebaseOutcome is a full manifest published beside the worker.
type rebaseOutcome struct {
	m      *fstree.Manifest
	tenure uint64
	err    error
}

// rebased records a full manifest rebase published: the deltas the
// previous one included are deleted (those of this one stay a while for
// targets still reading them).
func (w *source) rebased(o rebaseOutcome) {
	w.rebasing = false
	if o.tenure != w.tenure || !w.isSource() || w.cur == nil {
		return // from a tenure that ended
	}
	if o.err != nil {
		w.log.Debug("full manifest not published", "err", o.err)
		w.sinceFull = fullEvery // again with the next delta
		return
	}
	w.fullGen = o.m.Generation
	w.remember(published{m: o.m, started: o.m.Created, published: time.Now()})
	w.dropDeltas(w.prevAsOf)
	w.prevAsOf = o.m.AsOf
	w.log.Debug("full manifest published", "generation", o.m.Generation, "as_of", o.m.AsOf, "entries", len(o.m.Entries))
	releaseMemory(len(o.m.Entries))
}

// dropDeltas deletes, in the background, this node's deltas of the tree
// numbered at most upTo (0: none).
func (w *source) dropDeltas(upTo uint64) {
	if upTo == 0 || !w.dropping.CompareAndSwap(false, true) {
		return
	}
	go func() {
		defer w.dropping.Store(false)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		n, err := w.e.store.DeleteDeltas(ctx, w.e.cfg.Cluster, w.e.cfg.Group, w.t.Name, w.e.cfg.Node, upTo)
		if err != nil {
			w.log.Debug("deleting old deltas", "err", err)
		}
		if n > 0 {
			w.log.Debug("old deltas deleted", "count", n, "up_to", upTo)
		}
	}()
}

// deltaAck records a confirmed delta in known: every delta of the chain
// up to it, in order (a target applies them only in order).
func (w *source) deltaAck(d *fstree.Delta) {
	if d.Seq <= w.knownSeq {
		return
	}
	for _, p := range w.recent {
		if p.delta != nil && p.delta.Seq > w.knownSeq && p.delta.Seq <= d.Seq {
			w.knowDelta(p.delta)
		}
	}
	w.knownSeq = d.Seq
	w.saveKnownSoon()
}

// chain is where a target's walk along the holder's deltas ended.
type chain int

const (
	chainCurrent chain = iota // nothing newer to apply
	chainRetry                // a failure to retry later
	chainGap                  // the next delta is gone or does not follow: read the full manifest
)

// chainedTo says whether the target applied a full manifest of the
// current holder and epoch that deltas follow.
func (w *target) chainedTo(r role) bool {
	return w.wanted != nil && w.appliedEp == r.Epoch && w.appliedNode == r.Holder && w.appliedSeq > 0
}

// followDeltas applies the holder's deltas after the last one applied,
// in order, each only if it names the generation applied last as its
// predecessor.
func (w *target) followDeltas(ctx context.Context) chain {
	r := w.role
	full := events.ReplManifestName(w.e.cfg.Cluster, w.e.cfg.Group, w.t.Name, r.Holder)
	// newer says whether the holder's full manifest holds more than was
	// applied: only then is it read (never to go back to an older state).
	newer := func() chain {
		h, ok, err := w.e.store.ManifestHead(ctx, full)
		switch {
		case errors.Is(err, store.ErrNoManifest):
			return chainCurrent
		case err != nil:
			if ctx.Err() == nil {
				w.log.Warn("reading the holder's manifest failed", "err", err)
			}
			return chainRetry
		case !ok || h.Node != r.Holder || h.Epoch != r.Epoch || h.Generation > w.appliedGen:
			return chainGap
		}
		if h.Generation == w.appliedGen && h.AsOf == w.appliedSeq {
			w.deletes = nil // a new base: the valve's window starts again
		}
		return chainCurrent
	}
	for {
		if ctx.Err() != nil {
			return chainCurrent
		}
		name := store.DeltaName(w.e.cfg.Cluster, w.e.cfg.Group, w.t.Name, r.Holder, w.appliedSeq+1)
		d, err := w.e.store.GetDelta(ctx, name)
		if errors.Is(err, store.ErrNoManifest) || errors.Is(err, store.ErrManifestReplaced) {
			return newer()
		}
		if err != nil {
			if ctx.Err() == nil {
				w.log.Warn("reading the holder's delta failed", "name", name, "err", err)
			}
			if errors.Is(err, fstree.ErrUnsafeManifest) {
				return newer()
			}
			return chainRetry
		}
		if d.Cluster != w.e.cfg.Cluster || d.Group != w.e.cfg.Group || d.Tree != w.t.Name {
			w.log.Warn("delta refused: written for another tree", "name", name, "cluster", d.Cluster, "group", d.Group, "manifest_tree", d.Tree)
			return newer()
		}
		if d.Node != r.Holder || d.Epoch != r.Epoch || d.Seq != w.appliedSeq+1 || d.Prev != w.appliedGen {
			return newer() // left from another chain: the full manifest says where this one stands
		}
		if d.Generation == w.refusedGen {
			// Refused by the valve: judged again whole once the holder
			// publishes its full manifest (it does on the refusal).
			return newer()
		}
		if err := w.e.confirmTenure(ctx, d.Node, d.Epoch); err != nil {
			if errors.Is(err, errNotHolder) {
				w.confirmedStatus(CondSourceUnconfirmed)
				return chainCurrent
			}
			if ctx.Err() == nil {
				w.log.Warn("cannot confirm the source still holds; not applying", "source", d.Node, "epoch", d.Epoch, "err", err)
				w.unconfirmed(CondSourceUnconfirmed, err)
			}
			return chainRetry
		}
		w.confirmedStatus(CondSourceUnconfirmed)
		if c, done := w.applyDelta(ctx, d); done {
			if c == chainGap {
				return newer()
			}
			return c
		}
	}
}

// applyDelta applies one delta and confirms it; done says the walk ends
// there (with c).
func (w *target) applyDelta(ctx context.Context, d *fstree.Delta) (c chain, done bool) {
	start := time.Now()
	now := time.Now()
	recent := 0
	w.deletes = slices.DeleteFunc(w.deletes, func(x deletion) bool { return now.Sub(x.at) > deleteWindow })
	for _, x := range w.deletes {
		recent += x.n
	}
	m := &fstree.Manifest{Node: d.Node, Epoch: d.Epoch, Generation: d.Generation, Entries: d.Entries}
	o := w.applyOptions(m, start, false)
	o.TreeFiles, o.DeletedBefore = w.wantedFiles, recent
	res, err := fstree.ApplyDelta(ctx, w.sc, d.Entries, d.Deleted, o)
	if ctx.Err() != nil {
		return chainCurrent, true
	}
	fm := &fstree.Manifest{Node: d.Node, Epoch: d.Epoch, Generation: d.Generation}
	w.reportConflicts(ctx, fm, res.Conflicts)
	valve := w.valveHeld(ctx, err, d.Node, d.Generation)
	a := w.appliedReport(d.Node, d.Epoch, d.Generation, d.Digest, res, err, start)
	if err != nil {
		outcome := "error"
		if valve != nil {
			outcome = "safety_valve"
		}
		w.e.m.passes.WithLabelValues(w.t.Name, "target", outcome).Inc()
		w.log.Warn("delta apply failed", "seq", d.Seq, "generation", d.Generation, "err", err)
		switch {
		case valve != nil:
			// The holder answers the refusal with its full manifest, which
			// is judged whole: stay here until then.
			w.refusedGen = d.Generation
			w.e.emit(ctx, a, events.WithEpoch(d.Epoch))
			return chainCurrent, true
		case errors.Is(err, fstree.ErrMissingContent):
			// The holder stores what is missing on this confirmation.
			w.e.emit(ctx, a, events.WithEpoch(d.Epoch))
			return chainRetry, true
		}
		// Anything else (a directory holding what the delta does not name,
		// a path that is not what the holder saw): the full manifest
		// plans the whole tree; the holder publishes it on the refusal.
		w.e.emit(ctx, a, events.WithEpoch(d.Epoch))
		return chainGap, true
	}
	w.e.m.passes.WithLabelValues(w.t.Name, "target", "applied").Inc()
	w.e.m.duration.WithLabelValues(w.t.Name, "target").Observe(time.Since(start).Seconds())
	w.e.m.files.WithLabelValues(w.t.Name, "target").Add(float64(res.Files))
	w.e.m.bytes.WithLabelValues(w.t.Name, "target").Add(float64(res.Bytes))
	if res.Deleted > 0 {
		w.deletes = append(w.deletes, deletion{at: now, n: int(res.Deleted)})
	}
	for _, p := range d.Deleted {
		if e, ok := w.wanted[p]; ok {
			if e.Kind != fstree.KindDir {
				w.wantedFiles--
			}
			delete(w.wanted, p)
		}
	}
	for _, e := range d.Entries {
		if w.t.Exclude.ExcludedAnywhere(e.Path, e.Kind == fstree.KindDir) {
			continue
		}
		old, had := w.wanted[e.Path]
		if (!had || old.Kind == fstree.KindDir) && e.Kind != fstree.KindDir {
			w.wantedFiles++
		} else if had && old.Kind != fstree.KindDir && e.Kind == fstree.KindDir {
			w.wantedFiles--
		}
		w.wanted[e.Path] = e
	}
	w.knowDelta(d)
	w.saveKnownSoon()
	w.appliedSeq, w.appliedGen, w.appliedDigest = d.Seq, d.Generation, d.Digest
	w.e.emit(ctx, a, events.WithEpoch(d.Epoch))
	w.log.Debug("delta applied", "seq", d.Seq, "generation", d.Generation, "files", res.Files, "deleted", res.Deleted,
		"ms", time.Since(start).Milliseconds())
	return chainCurrent, false
}

type deletion struct {
	at time.Time
	n  int
}

// setWanted makes entries (a full manifest's) what this tree holds as
// replicated, for the deltas that follow and the periodic check.
func (w *target) setWanted(m *fstree.Manifest) {
	if w.t.isAstDB() || m.AsOf == 0 {
		w.wanted = nil // a source that publishes no deltas
		return
	}
	w.wanted = make(map[string]fstree.Entry, len(m.Entries))
	w.wantedFiles = 0
	for _, e := range m.Entries {
		if w.t.Exclude.ExcludedAnywhere(e.Path, e.Kind == fstree.KindDir) {
			continue
		}
		w.wanted[e.Path] = e
		if e.Kind != fstree.KindDir {
			w.wantedFiles++
		}
	}
	w.appliedSeq, w.appliedNode, w.appliedDigest = m.AsOf, m.Node, m.Digest
	w.deletes = nil
}

// checkDrift is the periodic check of a target that follows deltas: the
// tree is walked (stat only; a file is read only if its size, times or
// inode moved since this node wrote or read it) and compared with what was
// applied; only a difference costs a full apply, from memory.
func (w *target) checkDrift(ctx context.Context) {
	res, err := w.sc.Scan(ctx)
	if err != nil {
		if ctx.Err() == nil {
			w.log.Debug("periodic check: scan failed", "err", err)
		}
		return
	}
	w.compareScan(ctx, res)
}

// compareScan compares a scan of the tree with what was applied and
// repairs a difference with a full apply.
func (w *target) compareScan(ctx context.Context, res fstree.ScanResult) {
	drift := len(res.Entries) != len(w.wanted)
	for _, e := range res.Entries {
		if drift {
			break
		}
		want, ok := w.wanted[e.Path]
		drift = !ok || fstree.Drifted(want, e)
	}
	if !drift {
		return
	}
	entries := slices.Collect(maps.Values(w.wanted))
	fstree.Sort(entries)
	start := time.Now()
	m := &fstree.Manifest{Node: w.appliedNode, Epoch: w.appliedEp, Generation: w.appliedGen, Entries: entries}
	res2, err := fstree.Apply(ctx, w.sc, entries, w.applyOptions(m, start, false))
	if ctx.Err() != nil {
		return
	}
	w.reportConflicts(ctx, m, res2.Conflicts)
	w.log.Info("periodic check repaired local changes", "files", res2.Files, "deleted", res2.Deleted,
		"fixed", res2.MetaFixed, "err", err)
	w.valveHeld(ctx, err, w.appliedNode, w.appliedGen)
	w.e.emit(ctx, w.appliedReport(w.appliedNode, w.appliedEp, w.appliedGen, w.appliedDigest, res2, err, start), events.WithEpoch(w.appliedEp))
}

// passNotified publishes what notifications named: a delta once this
// tenure's full manifest is out, a full pass before it (or when a peer
// lacks contents: that pass stores them).
func (w *source) passNotified(ctx context.Context) bool {
	if w.chained() && !w.resend {
		return w.deltaPass(ctx, false)
	}
	return w.pass(ctx, false)
}

// scanCost bounds the periodic scan's share of a core: it runs every
// scan_interval, or this many times as long as the last one took,
// whichever is longer (a 50,000-file tree walks in some 150 ms: every
// 30 s; on a loaded machine less often).
const scanCost = 200

// scanOutcome is a periodic scan run in the background: the worker keeps
// applying and publishing while the tree is walked.
type scanOutcome struct {
	res  fstree.ScanResult
	err  error
	took time.Duration
	// source: run as the source; gen: the generation a target had
	// applied when it started.
	source bool
	gen    uint64
}

// startScan walks the tree in the background; the outcome comes on scanCh.
func (w *worker) startScan(ctx context.Context) {
	o := scanOutcome{source: w.isSource(), gen: w.tgt.appliedGen}
	if o.source {
		w.pend.startTrack()
	}
	go func() {
		t0 := time.Now()
		o.res, o.err = w.sc.Scan(ctx)
		o.took = time.Since(t0)
		select {
		case w.scanCh <- o:
		case <-ctx.Done():
		}
	}()
}

// scanned takes a background scan's outcome; false asks for a retry.
func (w *worker) scanned(ctx context.Context, o scanOutcome) bool {
	if !o.source {
		if o.err == nil && w.isTarget() && w.tgt.chainedTo(w.role) && w.tgt.appliedGen == o.gen {
			w.tgt.compareScan(ctx, o.res)
		}
		return true
	}
	track, lost := w.pend.stopTrack()
	if !w.isSource() || !w.src.chained() || lost {
		return true // notifications overflowed meanwhile: the next pass scans whole
	}
	if o.err != nil {
		if errors.Is(o.err, fstree.ErrRootMissing) {
			w.alarm(ctx, events.AlarmSourceMissing, fmt.Sprintf("source tree %s is missing (unmounted?); nothing published", w.t.Root), 0, 0)
			w.e.m.passes.WithLabelValues(w.t.Name, "source", "alarm").Inc()
			return true
		}
		if ctx.Err() == nil {
			w.log.Warn("periodic scan failed", "err", o.err)
		}
		return true
	}
	changed, deleted := fstree.DiffAll(w.src.cur, o.res.Entries)
	// What notifications named since the scan began, deltas carry, newer
	// than what the scan saw.
	under := func(p string) bool {
		for q := p; q != "." && q != "/"; q = path.Dir(q) {
			if track[q] {
				return true
			}
		}
		return false
	}
	changed = slices.DeleteFunc(changed, func(e fstree.Entry) bool { return under(e.Path) })
	deleted = slices.DeleteFunc(deleted, under)
	if len(changed)+len(deleted) > 0 {
		w.log.Info("periodic scan found changes notifications missed", "changed", len(changed), "deleted", len(deleted))
	}
	now := time.Now()
	return w.src.publishDelta(ctx, now, now, changed, deleted, true, func() bool {
		w.pend.addAll()
		w.src.dirty = true
		return false
	})
}

// releaseAfter is the size of tree past which a full pass (or full apply)
// hands the memory it used back to the system at once: its scan, digest
// and encoding (or decoding and planning) of every entry take a few
// hundred MiB of heap for a moment on a 50,000-file tree, which the
// runtime would otherwise keep for minutes, while deltas need a fraction.
const releaseAfter = 10000

func releaseMemory(entries int) {
	if entries > releaseAfter {
		debug.FreeOSMemory()
	}
}
