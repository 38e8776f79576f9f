package replicate

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/services/replicator/internal/astdb"
	"github.com/fanpbx/fan/services/replicator/internal/fstree"
	"github.com/fanpbx/fan/services/replicator/internal/store"
)

// target is the half of a tree's worker that runs on every node but the
// holder: it reads the holder's manifest of the current epoch, checks that
// the holder still holds, validates and applies it (fstree.Apply or AstDB
// over AMI), applies progress manifests while the holder uploads, and
// confirms what it applied.
type target struct {
	*shared

	appliedGen uint64
	appliedEp  uint64
	// progressGen: the holder's last progress manifest applied;
	// progressDone: what progress manifests wrote since the last
	// confirmation, which counts it as part of the pass it confirms.
	progressGen  uint64
	progressDone fstree.ApplyResult
	// reg is an AstDB tree's state (astdbtree.go).
	reg astdbTarget

	// A file tree following the holder's deltas (delta.go): wanted is the
	// tree as applied (nil when the holder publishes none), wantedFiles its
	// files; appliedSeq the last delta applied (or the full manifest's
	// AsOf), from appliedNode, with appliedDigest; deletes what deltas
	// deleted lately, for the safety valve.
	wanted        map[string]fstree.Entry
	wantedFiles   int
	appliedSeq    uint64
	appliedNode   string
	appliedDigest string
	deletes       []deletion
	// refusedGen is the delta the safety valve refused last.
	refusedGen uint64
}

// namedAs says whether a manifest's header is that of this cluster, group
// and tree: one read under this tree's name but written for another (a
// copy into the wrong name) would otherwise be applied here.
func (w *target) namedAs(m *fstree.Manifest, name string) bool {
	if m.Cluster == w.e.cfg.Cluster && m.Group == w.e.cfg.Group && m.Tree == w.t.Name {
		return true
	}
	w.log.Warn("manifest refused: written for another tree", "name", name,
		"cluster", m.Cluster, "group", m.Group, "manifest_tree", m.Tree)
	return false
}

// newRole forgets progress manifests: they are per holder and epoch
// (generations come from the holder's clock).
func (w *target) newRole() {
	w.progressDone, w.progressGen = fstree.ApplyResult{}, 0
	w.wanted, w.appliedSeq, w.deletes = nil, 0, nil
	if w.t.isAstDB() {
		w.reg.reset()
	}
}

// apply makes this node's tree match the holder's current manifest and
// confirms it. force re-applies a generation already applied (a full
// re-check), confirming again only if it had to change something. It
// returns false when it should be retried.
func (w *target) apply(ctx context.Context, force bool) bool {
	r := w.role
	if w.chainedTo(r) {
		// Following the holder's deltas: its full manifest is read only
		// when the chain breaks.
		switch w.followDeltas(ctx) {
		case chainCurrent:
			if force {
				w.checkDrift(ctx)
				w.flushKnown(false)
			}
			return true
		case chainRetry:
			return false
		}
	}
	name := events.ReplManifestName(w.e.cfg.Cluster, w.e.cfg.Group, w.t.Name, r.Holder)
	m, err := w.e.store.GetManifest(ctx, name)
	if errors.Is(err, store.ErrManifestReplaced) {
		// Replaced while read: the new one is there to read now.
		w.log.Debug("holder's manifest replaced while read; reading it again")
		m, err = w.e.store.GetManifest(ctx, name)
	}
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
	if !w.namedAs(m, name) {
		return true // nothing to retry until the holder writes a new one
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
	if w.chainedTo(r) && m.Node == r.Holder && m.Epoch == r.Epoch && m.Generation < w.appliedGen {
		// Older than the deltas applied since: never go back.
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
		first := w.reg.lastSeq == 0
		var ar astdb.ManifestResult
		ar, err = astdb.ApplyManifest(actx, w.t.AMI, w.t.Families, m.Entries, astdb.ManifestOptions{
			Newer:          func(k string) bool { return w.reg.keySeq[k] > m.AsOf },
			Held:           func(k string) bool { return w.reg.held[k] },
			MaxDeleteShare: w.e.cfg.MaxDeleteShare, AllowDeletes: w.e.cfg.AllowDeletes, Parallel: astdbParallel,
		})
		cancel()
		res.Files, res.Deleted = ar.Put, ar.Deleted
		if err == nil {
			w.afterManifest(ctx, m, ar, first)
		}
	} else {
		res, err = fstree.Apply(ctx, w.sc, m.Entries, w.applyOptions(m, start, false))
	}
	if ctx.Err() != nil {
		return true
	}
	changed := res.Files+res.Deleted+res.MetaFixed+int64(len(res.Conflicts)) > 0
	w.reportConflicts(ctx, m, res.Conflicts)
	valve := w.valveHeld(ctx, err, m.Node, m.Generation)
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
		if !w.t.isAstDB() {
			w.known = fstree.KnownOf(m.Entries)
			w.flushKnown(true)
		}
		newGen := m.Generation != w.appliedGen || m.Epoch != w.appliedEp
		w.appliedGen, w.appliedEp = m.Generation, m.Epoch
		w.setWanted(m)
		defer releaseMemory(len(m.Entries))
		defer func() {
			// Deltas published since the full manifest follow it.
			if w.chainedTo(w.role) && ctx.Err() == nil {
				w.followDeltas(ctx)
			}
		}()
		if !newGen && !changed {
			return true
		}
		w.e.m.duration.WithLabelValues(w.t.Name, "target").Observe(time.Since(start).Seconds())
		w.e.m.files.WithLabelValues(w.t.Name, "target").Add(float64(res.Files))
		w.e.m.bytes.WithLabelValues(w.t.Name, "target").Add(float64(res.Bytes))
	}
	a := w.appliedReport(m.Node, m.Epoch, m.Generation, m.Digest, res, err, start)
	a.Files += w.progressDone.Files
	a.Bytes += w.progressDone.Bytes
	w.e.emit(ctx, a, events.WithEpoch(m.Epoch))
	w.progressDone = fstree.ApplyResult{}
	w.log.Debug("applied", "generation", m.Generation, "files", res.Files, "bytes", res.Bytes, "deleted", res.Deleted,
		"err", err, "ms", time.Since(start).Milliseconds())
	return err == nil || valve != nil
}

// applyOptions are the tree's options for an apply of m started at now.
func (w *target) applyOptions(m *fstree.Manifest, now time.Time, partial bool) fstree.ApplyOptions {
	prefetch := w.e.store.Prefetch
	if w.e.fetch != nil {
		prefetch = w.storeThenHolder(m)
	}
	return fstree.ApplyOptions{
		Exclude: w.t.Exclude, Fetch: w.e.store.Get, Prefetch: prefetch, Known: w.known,
		ConflictDir:    filepath.Join(w.e.cfg.StateDir, "conflicts", w.e.cfg.Group, w.t.Name),
		MaxDeleteShare: w.e.cfg.MaxDeleteShare, AllowDeletes: w.e.cfg.AllowDeletes,
		Owner: w.e.cfg.Owner, Workers: w.e.cfg.Workers, Now: now, Partial: partial,
		AllowOutsideSymlinks: w.t.Policy.AllowOutsideSymlinks,
		PreserveOwner:        w.t.Policy.PreserveOwner,
		PreserveSpecialBits:  w.t.Policy.PreserveSpecialBits,
	}
}

// storeThenHolder fetches each content from the object store if it holds
// it, and from m's node (the holder) otherwise: the store is replicated and
// costs the holder nothing, so only what a pass left out of it (direct
// transfer) or what went missing from it is asked of the holder.
func (w *target) storeThenHolder(m *fstree.Manifest) func(ctx context.Context, hashes []string) fstree.Fetcher {
	return func(ctx context.Context, hashes []string) fstree.Fetcher {
		st := w.e.store
		if err := st.Lookup(ctx, hashes); err != nil {
			// Unknown: the store first, the holder for what it lacks.
			w.log.Debug("content look-up failed", "err", err)
		}
		sizes := make(map[string]int64, len(hashes))
		for _, e := range m.Entries {
			if e.Kind == fstree.KindFile {
				sizes[e.Hash] = e.Size
			}
		}
		var stored, served []string
		fromHolder := map[string]bool{}
		for _, h := range hashes {
			if st.Has(h) {
				stored = append(stored, h)
			} else {
				served = append(served, h)
				fromHolder[h] = true
			}
		}
		fromStore := st.Prefetch(ctx, stored)
		holder := w.e.fetch.Prefetch(ctx, m.Node, w.t.Name, sizes, served)
		return func(ctx context.Context, hash string) (io.ReadCloser, error) {
			if fromHolder[hash] {
				return holder(ctx, hash)
			}
			rc, err := fromStore(ctx, hash)
			if errors.Is(err, fstree.ErrMissingContent) {
				// Gone from the store (collected, or never there).
				return holder(ctx, hash)
			}
			return rc, err
		}
	}
}

func (w *target) reportConflicts(ctx context.Context, m *fstree.Manifest, cs []fstree.Conflict) {
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
func (w *target) applyProgress(ctx context.Context, floor uint64) {
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
	if !w.namedAs(p, "progress of "+r.Holder) || p.Node != r.Holder || p.Epoch != r.Epoch || p.Generation <= floor || p.Generation <= w.progressGen {
		return
	}
	w.progressGen = p.Generation
	start := time.Now()
	res, err := fstree.Apply(ctx, w.sc, p.Entries, w.applyOptions(p, start, true))
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
	if errors.Is(err, fstree.ErrUnsafeManifest) || errors.Is(err, fstree.ErrOutsideTree) {
		// Never seen from a healthy holder: say so louder than a retry.
		w.log.Warn("progress manifest refused", "source", p.Node, "generation", p.Generation, "err", err)
	}
	w.log.Debug("progress applied", "generation", p.Generation, "files", res.Files, "bytes", res.Bytes,
		"err", err, "ms", time.Since(start).Milliseconds())
}

// valveHeld raises the safety valve's alarm when err is its refusal of
// what source published as gen, and returns that refusal (nil: none).
func (w *target) valveHeld(ctx context.Context, err error, source string, gen uint64) *fstree.ValveError {
	var valve *fstree.ValveError
	if !errors.As(err, &valve) {
		return nil
	}
	w.e.m.valve.WithLabelValues(w.t.Name).Inc()
	w.alarmFrom(ctx, source, events.AlarmSafetyValve, valve.Error(), int64(valve.Deletes), int64(valve.TargetFiles), fmt.Sprint(gen))
	return valve
}

// appliedReport is the trail's record of an apply of what source published
// as gen (a full manifest, a delta, or a repair back to it), its error and
// missing list cut to what an event carries.
func (w *target) appliedReport(source string, epoch, gen uint64, digest string, res fstree.ApplyResult, err error, start time.Time) events.ReplicationApplied {
	a := events.ReplicationApplied{
		Node: w.e.cfg.Node, Source: source, Group: w.e.cfg.Group, Tree: w.t.Name, Epoch: epoch,
		Generation: gen, Digest: digest, Deleted: res.Deleted, Files: res.Files, Bytes: res.Bytes,
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
	return a
}
