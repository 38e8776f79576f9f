package replicate

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/services/replicator/internal/fstree"
	"github.com/fanpbx/fan/services/replicator/internal/store"
)

// published is a manifest this node published as source.
type published struct {
	m *fstree.Manifest
	// delta is set when m stands for a delta (generation, digest, epoch
	// and changed only).
	delta     *fstree.Delta
	started   time.Time // pass start
	published time.Time
}

type peerState struct {
	gen      uint64
	caughtUp bool
}

const keepRecent = 64

// source is the half of a tree's worker that runs on the holder: it
// scans the tree (or reads AstDB), uploads what the content store lacks,
// publishes manifests (and progress manifests during a long upload), and
// turns targets' confirmations into status reports.
type source struct {
	*shared

	changedAt time.Time // oldest change not yet in a published manifest
	dirty     bool
	recent    []published // newest last, a few kept to resolve late acks
	lastGen   uint64
	peers     map[string]peerState
	// progressOut: a progress manifest of this node is in the bucket;
	// progressFiles: how many files the last one listed.
	progressOut   bool
	progressFiles int
	// room is what the current pass may still store (direct transfer).
	room storeRoom
	// resend: a peer reported contents missing, so the next pass uploads
	// them and publishes again even if the tree did not change (the
	// manifest it has is the one it cannot complete).
	resend bool
	// rewritten counts the files putFile left to the next pass in the
	// current one (the sender's and the worker's uploads both count).
	rewritten atomic.Int32
	// reg is an AstDB tree's state (astdbtree.go).
	reg astdbSource

	// A file tree's chain of deltas (delta.go): cur is the tree as last
	// published (nil until this tenure's first full manifest), curFiles
	// its files; seq the last delta published (or the full manifest's
	// AsOf) and chainGen its generation; sinceFull counts deltas since the
	// last full manifest, prevAsOf is the AsOf of the one before;
	// knownSeq the last delta recorded in known.
	cur       map[string]fstree.Entry
	curFiles  int
	seq       uint64
	chainGen  uint64
	sinceFull int
	prevAsOf  uint64
	knownSeq  uint64
	fullGen   uint64 // the generation of the last full manifest published
	dropping  atomic.Bool
	// tenure counts this node's tenures as source; rebasing says a full
	// manifest is being published beside the worker (delta.go: rebase).
	tenure   uint64
	rebasing bool
}

// storeRoom is how many bytes of new contents a pass may still store in
// the object store before it leaves the rest to direct transfer; which
// contents were left to it (a later pass neither looks them up nor stores
// them: the targets have them, or fetch them from this node); and the
// contents a target could not fetch directly, which are stored whatever
// the room. The sender's goroutine and the worker's both ask it.
type storeRoom struct {
	mu        sync.Mutex
	unbounded bool
	left      int64
	served    map[string]bool
	must      map[string]bool
}

// reset starts a pass with limit bytes (0: every content is stored).
func (r *storeRoom) reset(limit int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.unbounded, r.left = limit <= 0, limit
}

// forget starts a tenure: nothing is known to have been served.
func (r *storeRoom) forget() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.served, r.must = nil, nil
}

// skip says whether hash was left to direct transfer and is not wanted
// in the store: not worth a look-up.
func (r *storeRoom) skip(hash string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.served[hash] && !r.must[hash]
}

// take says whether e's content is to be stored, and counts it.
func (r *storeRoom) take(e fstree.Entry) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case r.must[e.Hash]:
		delete(r.must, e.Hash)
		delete(r.served, e.Hash)
		return true
	case r.served[e.Hash]:
		return false
	case r.unbounded:
		return true
	case e.Size > r.left:
		r.left = 0 // in order: the rest of the pass goes direct
		if r.served == nil {
			r.served = map[string]bool{}
		}
		r.served[e.Hash] = true
		return false
	}
	r.left -= e.Size
	return true
}

// keep forgets served contents no longer in entries.
func (r *storeRoom) keep(entries []fstree.Entry) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.served) == 0 {
		return
	}
	in := make(map[string]bool, len(entries))
	for _, e := range entries {
		in[e.Hash] = true
	}
	for h := range r.served {
		if !in[h] {
			delete(r.served, h)
		}
	}
}

// mustStore marks contents a target could not fetch from this node.
func (r *storeRoom) mustStore(hashes []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.must == nil {
		r.must = map[string]bool{}
	}
	for _, h := range hashes {
		r.must[h] = true
	}
}

func newSource(sh *shared) *source { return &source{shared: sh, peers: map[string]peerState{}} }

// noteChange records a change seen at t (a notification).
func (w *source) noteChange(t time.Time) {
	if w.changedAt.IsZero() || t.Before(w.changedAt) {
		w.changedAt = t
	}
	w.dirty = true
}

// start begins a tenure as source: a new epoch always publishes, even an
// unchanged tree, so every peer confirms against this epoch before any
// failback.
func (w *source) start(ctx context.Context) {
	w.e.m.source.WithLabelValues(w.t.Name).Set(1)
	w.log.Info("source of the tree", "epoch", w.role.Epoch)
	w.peers = map[string]peerState{}
	w.recent = nil
	w.cur, w.curFiles, w.sinceFull, w.prevAsOf, w.knownSeq = nil, 0, 0, 0, 0
	w.tenure++
	w.room.forget()
	w.changedAt, w.dirty = time.Now(), true
	if w.t.isAstDB() {
		// Read afresh; the sequence goes on above anything a standby saw.
		w.reg.mirror.Reset()
		w.reg.seq = max(w.reg.seq, uint64(time.Now().UnixNano()))
	}
	w.pass(ctx, true)
}

// stop ends a tenure as source: its peers' lag and caught-up gauges go.
func (w *source) stop() {
	w.log.Info("no longer source", "holder", w.role.Holder, "epoch", w.role.Epoch)
	if w.e.serve != nil {
		w.e.serve.Withdraw(w.t.Name)
	}
	w.e.m.caughtUp.DeletePartialMatch(map[string]string{"tree": w.t.Name})
	w.e.m.lag.DeletePartialMatch(map[string]string{"tree": w.t.Name})
}

// read lists the tree as it is now; snd, when set, is handed every file
// the scan reads, to send while the scan goes on, and prog, when set, what
// the scan has found so far.
func (w *source) read(ctx context.Context, snd *sender, prog *scanProgress) ([]fstree.Entry, error) {
	if w.t.isAstDB() {
		return w.reconcile(ctx)
	}
	var hooks fstree.ScanHooks
	if prog != nil {
		hooks.Walked = prog.walked
	}
	if snd != nil || prog != nil {
		hooks.Hashed = func(e fstree.Entry, content []byte) {
			if afterHashing != nil {
				afterHashing(e.Path)
			}
			if prog != nil {
				prog.hashed(e)
			}
			if snd != nil {
				snd.add(e, content)
			}
		}
	}
	res, err := w.sc.ScanHooked(ctx, hooks)
	if err != nil {
		return nil, err
	}
	if res.Unsettled > 0 {
		// Files still being written: publish what was read, look again
		// (once deltas follow, at the paths notified since the scan
		// began, which include them).
		w.dirty = true
		nudgeTime(w.fsCh, time.Now())
	}
	return res.Entries, nil
}

// pass publishes a new manifest when the tree changed (or force). It
// returns false when it should be retried.
func (w *source) pass(ctx context.Context, force bool) bool {
	start := time.Now()
	epoch := w.role.Epoch
	changedAt := w.changedAt
	force = force || w.resend
	w.resend = false
	if changedAt.IsZero() {
		changedAt = start
	}
	w.dirty = false
	if !w.t.isAstDB() {
		// The scan covers whatever was notified before it.
		w.pend.take()
	}
	w.room.reset(w.e.cfg.StorePassBytes)
	w.progressFiles = -1
	var snd *sender
	var prog *scanProgress
	if !w.t.isAstDB() {
		snd = w.newSender(ctx)
		defer snd.stop()
		prog = &scanProgress{}
	}
	stopProgress := w.progressWhileScanning(ctx, epoch, start, changedAt, prog)
	entries, err := w.read(ctx, snd, prog)
	stopProgress()
	if err == nil && w.e.serve != nil && !w.t.isAstDB() {
		// Before anything is published, and after the last progress
		// manifest (which serves only part of the tree): targets ask for
		// what the store will not hold as soon as they read the manifest.
		w.e.serve.Serve(w.t.Name, w.sc.OpenFile, entries)
	}
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
		w.pend.addAll()
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
		if err := w.publishProgress(ctx, epoch, entries, start, changedAt, w.available()); err != nil && ctx.Err() == nil {
			w.log.Debug("progress manifest not published", "err", err)
		}
	}
	files, bytes, err := w.upload(ctx, entries, progress, snd)
	w.room.keep(entries)
	if err != nil {
		if ctx.Err() == nil {
			w.log.Warn("upload failed", "err", err)
			w.e.m.passes.WithLabelValues(w.t.Name, "source", "error").Inc()
		}
		w.dirty = true
		w.changedAt = changedAt
		return false
	}
	switch w.confirmBeforePublish(ctx, epoch) {
	case publishRetry:
		w.dirty = true
		w.changedAt = changedAt
		return false
	case publishStop:
		return true
	}
	gen := max(uint64(time.Now().UnixNano()), w.lastGen+1)
	m := &fstree.Manifest{
		Cluster: w.e.cfg.Cluster, Group: w.e.cfg.Group, Tree: w.t.Name, Node: w.e.cfg.Node,
		Epoch: epoch, Generation: gen, Created: start.UTC(), Changed: changedAt.UTC(), Digest: digest, Entries: entries,
	}
	if w.t.isAstDB() {
		m.AsOf = w.reg.seq
	} else {
		if w.cur == nil {
			// A tenure's chain is numbered from its start: above any
			// delta an earlier process of this node left in the bucket.
			w.seq = uint64(time.Now().UnixNano())
		}
		m.AsOf = w.seq
	}
	if err := w.e.store.PutManifest(ctx, m); err != nil {
		if ctx.Err() == nil {
			w.log.Warn("publishing manifest failed", "err", err)
			w.e.m.passes.WithLabelValues(w.t.Name, "source", "error").Inc()
		}
		w.dirty = true
		w.changedAt = changedAt
		if !w.t.isAstDB() {
			w.pend.addAll()
		}
		return false
	}
	w.lastGen = gen
	if !w.t.isAstDB() {
		drop := w.prevAsOf
		if w.cur == nil {
			drop = w.seq // what earlier processes of this node left
		}
		w.setCur(entries)
		w.chainGen, w.fullGen, w.sinceFull, w.prevAsOf = gen, gen, 0, w.seq
		w.dropDeltas(drop)
		defer releaseMemory(len(entries))
	}
	if w.progressOut {
		w.progressOut = false
		if err := w.e.store.DeleteProgress(ctx, w.e.cfg.Cluster, w.e.cfg.Group, w.t.Name, w.e.cfg.Node); err != nil {
			w.log.Debug("progress manifest left behind", "err", err)
		}
	}
	if !w.dirty {
		w.changedAt = time.Time{}
	}
	if w.t.isAstDB() {
		// Confirmations need its generation and digest, not its records:
		// the holder keeps those once, in its mirror.
		head := *m
		head.Entries = nil
		m = &head
	}
	w.remember(published{m: m, started: start, published: time.Now()})
	w.e.m.passes.WithLabelValues(w.t.Name, "source", "published").Inc()
	w.e.m.duration.WithLabelValues(w.t.Name, "source").Observe(time.Since(start).Seconds())
	w.e.m.files.WithLabelValues(w.t.Name, "source").Add(float64(files))
	w.e.m.bytes.WithLabelValues(w.t.Name, "source").Add(float64(bytes))
	w.log.Debug("manifest published", "generation", gen, "epoch", epoch, "entries", len(entries), "uploaded", files, "bytes", bytes,
		"ms", time.Since(start).Milliseconds())
	return true
}

// progressEvery: during a scan or an upload longer than this, a progress
// manifest (what a target can have so far) is published this often, so
// targets fetch while the source still reads and uploads instead of after.
const progressEvery = time.Second

// afterHashing, when set by a test, runs as each file's hash is known: a
// scan long enough to publish progress without a gigabyte to read, or a
// file appended to before its upload reads it.
var afterHashing func(path string)

// available says which contents a target can already have: those in the
// bucket, and with direct transfer every content this node scanned (it
// serves them).
func (w *source) available() func(hash string) bool {
	if w.e.serve != nil {
		return func(string) bool { return true }
	}
	return w.e.store.Has
}

// scanProgress is what a scan has found so far: the entries its walk
// listed and the files read since. The scan's readers add to it while the
// worker's progress goroutine reads it.
type scanProgress struct {
	mu     sync.Mutex
	listed []fstree.Entry
	read   map[string]fstree.Entry
}

func (p *scanProgress) walked(es []fstree.Entry) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.listed = es
}

func (p *scanProgress) hashed(e fstree.Entry) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.read == nil {
		p.read = map[string]fstree.Entry{}
	}
	p.read[e.Path] = e
}

// part is the tree as far as it is known: every directory and symlink
// listed, and every file whose hash is known (from the scanner's cache or
// read since); nil while nothing was read (a pass that reads nothing
// publishes no progress).
func (p *scanProgress) part() []fstree.Entry {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.read) == 0 {
		return nil
	}
	out := make([]fstree.Entry, 0, len(p.listed))
	for _, e := range p.listed {
		if e.Kind == fstree.KindFile {
			if r, ok := p.read[e.Path]; ok {
				e = r
			} else if e.Hash == "" {
				continue
			}
		}
		out = append(out, e)
	}
	fstree.Sort(out)
	return out
}

// progressWhileScanning publishes progress manifests while the scan still
// reads files (first after progressEvery/4, then every progressEvery),
// serving what it lists first with direct transfer. The returned stop
// waits for it to end: it uses the source's progress state, which only
// the worker's goroutine touches once the scan is over.
func (w *source) progressWhileScanning(ctx context.Context, epoch uint64, start, changedAt time.Time, prog *scanProgress) (stop func()) {
	if prog == nil {
		return func() {}
	}
	done, finished := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(finished)
		tick := time.NewTimer(progressEvery / 4)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			tick.Reset(progressEvery)
			part := prog.part()
			if part == nil {
				continue
			}
			if w.e.serve != nil {
				w.e.serve.Serve(w.t.Name, w.sc.OpenFile, part)
			}
			if err := w.publishProgress(ctx, epoch, part, start, changedAt, w.available()); err != nil && ctx.Err() == nil {
				w.log.Debug("progress manifest not published", "err", err)
			}
		}
	}()
	return func() {
		close(done)
		<-finished
	}
}

// publishVerdict is what confirming the role before a publish decided.
type publishVerdict int

const (
	publishGo    publishVerdict = iota
	publishRetry                // unable to tell: the change stays pending and is retried
	publishStop                 // the role is lost, or the pass ends: the role loop takes over
)

// confirmBeforePublish is the rule every publish of a source (a full
// manifest or a delta) follows: the group status, read afresh, must still
// name this node holder at epoch. It logs and counts what held a publish
// back; a status that cannot be read is not taken for a lost role.
func (w *source) confirmBeforePublish(ctx context.Context, epoch uint64) publishVerdict {
	err := w.e.confirmHolder(ctx, epoch)
	switch {
	case err == nil:
		w.confirmedStatus(CondHolderUnconfirmed)
		return publishGo
	case ctx.Err() != nil:
		return publishStop
	case !errors.Is(err, errNotHolder):
		w.log.Warn("cannot confirm this node still holds; not publishing", "epoch", epoch, "err", err)
		w.e.m.passes.WithLabelValues(w.t.Name, "source", "unconfirmed").Inc()
		w.unconfirmed(CondHolderUnconfirmed, err)
		return publishRetry
	default:
		w.confirmedStatus(CondHolderUnconfirmed)
		w.log.Warn("not publishing", "err", err)
		w.e.m.passes.WithLabelValues(w.t.Name, "source", "not_holder").Inc()
		nudge(w.roleCh)
		return publishStop
	}
}

// publishProgress publishes, as a progress manifest, the part of entries
// whose contents a target can already have: every directory and symlink,
// every file whose content is available (in the bucket, or served by this
// node), and a voicemail .txt only once every file of its message (same
// name, other extensions) is too. Targets apply it without deleting
// anything and do not confirm it.
func (w *source) publishProgress(ctx context.Context, epoch uint64, entries []fstree.Entry, start, changedAt time.Time, available func(hash string) bool) error {
	part := fstree.StoredPart(entries, available)
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
// progress every progressEvery while it runs: first it waits for what snd
// (when set) still sends of what the scan handed it, then it sends what
// is left (contents hashed in an earlier pass, or that a target reported
// missing).
func (w *source) upload(ctx context.Context, entries []fstree.Entry, progress func(), snd *sender) (int64, int64, error) {
	// The first one early, so targets start fetching at once.
	tick := time.NewTimer(progressEvery / 4)
	defer tick.Stop()
	var files, bytes int64
	defer func() {
		if n := w.rewritten.Swap(0); n > 0 {
			// The pass goes on without them (a target reports them
			// missing); what the files hold now is for the next pass, soon.
			w.log.Debug("files rewritten since the scan, not stored", "files", n)
			w.dirty = true
			w.pend.addAll()
			nudgeTime(w.fsCh, time.Now())
		}
	}()
	if snd != nil {
		snd.close()
	wait:
		for {
			select {
			case <-snd.done:
				break wait
			case <-tick.C:
				progress()
				tick.Reset(progressEvery)
			}
		}
		if snd.err != nil {
			return snd.files, snd.bytes, snd.err
		}
		files, bytes = snd.files, snd.bytes
	}
	var todo []fstree.Entry
	seen := map[string]bool{}
	for _, e := range entries {
		if e.Kind == fstree.KindFile && !seen[e.Hash] && !w.e.store.Has(e.Hash) && !w.room.skip(e.Hash) {
			seen[e.Hash] = true
			todo = append(todo, e)
		}
	}
	if len(todo) == 0 {
		return files, bytes, nil
	}
	// One look-up for all of them, not one per upload.
	hashes := make([]string, len(todo))
	for i, e := range todo {
		hashes[i] = e.Hash
	}
	if err := w.e.store.Lookup(ctx, hashes); err != nil {
		return files, bytes, err
	}
	todo = slices.DeleteFunc(todo, func(e fstree.Entry) bool { return w.e.store.Has(e.Hash) || !w.room.take(e) })
	// Uploads mostly wait on the bus: twice as many as hash.
	workers := 2 * max(w.e.cfg.Workers, 1)
	var mu sync.Mutex
	var firstErr error
	ch := make(chan fstree.Entry)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for e := range ch {
				stored, err := w.putFile(ctx, e)
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
func (w *source) onAck(ctx context.Context, am ackMsg) {
	a := am.a
	if !w.isSource() || a.Epoch != w.role.Epoch {
		return
	}
	var pub *published
	for i := range w.recent {
		// A full manifest that rebases the deltas shares the last one's
		// generation: the digest tells which was confirmed.
		if w.recent[i].m.Generation == a.Generation && w.recent[i].m.Digest == a.Digest {
			pub = &w.recent[i]
		}
	}
	if pub == nil {
		return // a confirmation of a manifest this process did not publish
	}
	latest := w.recent[len(w.recent)-1]
	for _, h := range a.Missing {
		w.e.store.Forget(h)
	}
	// Whether the store lost them or this node could not serve them, the
	// next pass stores them.
	w.room.mustStore(a.Missing)
	if a.Error != "" && len(a.Missing) == 0 && w.chained() && w.fullGen != w.chainGen {
		// A target refused part of the chain (the safety valve, or a
		// path not as this node saw it): the tree as it stands now is
		// what it judges next, whole.
		w.rebase(ctx)
	}
	if len(a.Missing) > 0 {
		w.log.Warn("peer lacks contents; sending them again", "peer", a.Node, "missing", len(a.Missing))
		w.dirty, w.resend = true, true
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
	if a.Error == "" && !w.t.isAstDB() {
		// What a peer confirmed is what this node may later treat as
		// replicated: a file published but never confirmed stays "local"
		// and is preserved, not deleted, if this node becomes a target.
		switch {
		case pub.delta != nil:
			w.deltaAck(pub.delta)
		case pub.m.Entries != nil && pub.m.AsOf >= w.knownSeq:
			w.known = fstree.KnownOf(pub.m.Entries)
			w.knownSeq = pub.m.AsOf
			w.flushKnown(true)
			defer releaseMemory(len(pub.m.Entries))
			if !w.t.isAstDB() {
				// Known now holds them: another peer's confirmation of
				// the same manifest changes nothing, and the tree as it
				// stands is in cur.
				head := *pub.m
				head.Entries = nil
				pub.m = &head
			}
		}
	}
	w.peers[a.Node] = peerState{gen: a.Generation, caughtUp: caught}
	w.updateLag()
}

func (w *source) updateLag() {
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

// sender stores contents while the scan still reads the tree: each file
// the scan hashes is looked up in batches (a few hundred a request) and,
// when the bucket lacks it, sent by one of its workers. The scan never
// waits for it (a target can start only once the scan is done and the
// first progress manifest is out); a file of at most fstree.KeepMax bytes
// is sent from the bytes the scan read while those held stay under
// senderHeld, else read again.
type sender struct {
	w    *source
	ctx  context.Context
	done chan struct{} // closed when every file handed over was dealt with

	mu     sync.Mutex
	queue  []hashedFile
	held   int // bytes of content in queue
	closed bool
	wake   chan struct{}

	// Set by run before done closes.
	files, bytes int64
	err          error
}

type hashedFile struct {
	e       fstree.Entry
	content []byte
}

const (
	// senderGroup is the most files looked up at once.
	senderGroup = 256
	// senderHeld bounds the file contents waiting to be sent.
	senderHeld = 32 << 20
)

func (w *source) newSender(ctx context.Context) *sender {
	s := &sender{w: w, ctx: ctx, done: make(chan struct{}), wake: make(chan struct{}, 1)}
	go s.run()
	return s
}

// add hands over a file the scan read (fstree.ScanHooks.Hashed).
func (s *sender) add(e fstree.Entry, content []byte) {
	s.mu.Lock()
	if s.held+len(content) > senderHeld {
		content = nil
	}
	s.held += len(content)
	s.queue = append(s.queue, hashedFile{e: e, content: content})
	s.mu.Unlock()
	nudge(s.wake)
}

// close says no more files come.
func (s *sender) close() {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	nudge(s.wake)
}

// stop closes and waits for what was handed over.
func (s *sender) stop() {
	s.close()
	<-s.done
}

// next takes up to senderGroup files, waiting for one; false once closed
// and empty.
func (s *sender) next() ([]hashedFile, bool) {
	for {
		s.mu.Lock()
		if n := min(len(s.queue), senderGroup); n > 0 {
			group := slices.Clone(s.queue[:n])
			s.queue = s.queue[n:]
			s.mu.Unlock()
			return group, true
		}
		closed := s.closed
		s.mu.Unlock()
		if closed {
			return nil, false
		}
		<-s.wake
	}
}

func (s *sender) fail(err error) {
	s.mu.Lock()
	if s.err == nil {
		s.err = err
	}
	s.mu.Unlock()
}

func (s *sender) failed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err != nil
}

func (s *sender) run() {
	defer close(s.done)
	st := s.w.e.store
	work := make(chan hashedFile)
	var wg sync.WaitGroup
	// Uploads mostly wait on the bus: twice as many as hash.
	for range 2 * max(s.w.e.cfg.Workers, 1) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for f := range work {
				stored, err := s.put(f)
				s.mu.Lock()
				s.held -= len(f.content)
				if err != nil && s.err == nil {
					s.err = fmt.Errorf("upload %s: %w", f.e.Path, err)
				}
				if stored {
					s.files++
					s.bytes += f.e.Size
				}
				s.mu.Unlock()
			}
		}()
	}
	defer func() {
		close(work)
		wg.Wait()
	}()
	seen := map[string]bool{}
	for {
		group, ok := s.next()
		if !ok {
			return
		}
		if s.failed() || s.ctx.Err() != nil {
			s.release(group)
			continue // drain what the scan still hands over
		}
		var hashes []string
		for _, f := range group {
			if !seen[f.e.Hash] && !st.Has(f.e.Hash) && !s.w.room.skip(f.e.Hash) {
				hashes = append(hashes, f.e.Hash)
			}
		}
		if len(hashes) > 0 {
			if err := st.Lookup(s.ctx, hashes); err != nil {
				s.fail(err)
				s.release(group)
				continue
			}
		}
		for _, f := range group {
			if seen[f.e.Hash] || st.Has(f.e.Hash) || s.ctx.Err() != nil {
				s.release([]hashedFile{f})
				continue
			}
			seen[f.e.Hash] = true
			if !s.w.room.take(f.e) {
				s.release([]hashedFile{f}) // served directly
				continue
			}
			work <- f
		}
	}
}

// release forgets files not sent.
func (s *sender) release(fs []hashedFile) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, f := range fs {
		s.held -= len(f.content)
	}
}

func (s *sender) put(f hashedFile) (bool, error) {
	if f.content != nil {
		return s.w.e.store.Put(s.ctx, f.e.Hash, bytes.NewReader(f.content))
	}
	return s.w.putFile(s.ctx, f.e)
}

// putFile stores e's content as the scan hashed it: the first e.Size bytes
// of the file. A file appended to since (a recording still being written)
// still begins with them; one rewritten does not, and Put refuses it
// (store.ErrChanged): that file is left to the next pass (counted in
// w.rewritten, not stored, no error) and the pass goes on with the rest.
func (w *source) putFile(ctx context.Context, e fstree.Entry) (bool, error) {
	f, err := w.sc.OpenFile(e.Path)
	if err != nil {
		return false, err
	}
	defer f.Close()
	stored, err := w.e.store.Put(ctx, e.Hash, io.LimitReader(f, e.Size))
	if errors.Is(err, store.ErrChanged) {
		w.rewritten.Add(1)
		return false, nil
	}
	return stored, err
}
