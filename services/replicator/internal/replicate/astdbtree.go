package replicate

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/fanpbx/fan/pkg/ami"
	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/services/replicator/internal/astdb"
	"github.com/fanpbx/fan/services/replicator/internal/fstree"
	"github.com/nats-io/nats.go"
)

// AstDB trees follow registrations as they happen. On the holder, each
// ContactStatus event Asterisk raises names a contact, which is read with
// DBGet and published at once as a delta (events.AstDBDelta, core NATS);
// a whole read of the families (the reconcile: DBGetTree) comes on start,
// on every new AMI connection or lost event, when a standby asks, and every
// Reconcile interval, and is published as the tree's manifest. On a
// standby, each delta is applied with DBPut and DBDel, without reading
// anything first; a gap in the holder's sequence makes it ask for a
// reconcile; a manifest is applied whole, except what a newer delta
// changed, and a deletion it would make that nothing explains is weighed
// there (astdb.ApplyManifest).

const (
	// astdbBatch is the most events taken into one delta.
	astdbBatch = 1024
	// astdbChunk and astdbChunkBytes bound one published delta (a
	// contact's value is under 1 KiB; a value may be up to
	// events.MaxAstDBValue), well below events.MaxAstDBDelta.
	astdbChunk      = 256
	astdbChunkBytes = events.MaxAstDBDelta / 2
	// astdbParallel is how many AMI actions a tree has in flight at once.
	astdbParallel = 16
	// resyncEvery spaces the reconciles standbys ask for (on the holder)
	// and the requests a standby sends while a gap stays open.
	resyncEvery = time.Second
)

// staleManifest: a standby whose first manifest of a tenure is older than
// this asks for a fresh one (what came after it is unknown). A variable so
// that a test can make every manifest stale instead of waiting for one to
// age.
var staleManifest = 2 * time.Second

// astdbSource is the holder's state of an AstDB tree.
type astdbSource struct {
	mirror *astdb.Mirror
	// seq is the last delta sequence used (published or not); a manifest
	// includes every delta up to it (its AsOf).
	seq uint64
	// failed: a delta could not be published; the next manifest carries
	// its changes.
	failed bool
	// gap: events may have been lost since the last reconcile.
	gap bool
	// lastForced is when a standby's request last made a reconcile.
	lastForced time.Time
	dropped    uint64
}

// astdbTarget is a standby's state of an AstDB tree.
type astdbTarget struct {
	// lastSeq is the holder's last delta applied, or the AsOf of the last
	// manifest applied if that is later.
	lastSeq uint64
	// keySeq holds the keys deltas changed since the last manifest
	// applied: a manifest read before them does not undo them.
	keySeq map[string]uint64
	// gapAt is set while deltas up to it may be missing: a manifest with
	// an AsOf at least this closes the gap.
	gapAt   uint64
	lastAsk time.Time
	// held are the deletions the last manifest held back.
	held map[string]bool
}

func (t *astdbTarget) reset() {
	t.lastSeq, t.gapAt = 0, 0
	t.keySeq = map[string]uint64{}
}

// polledFamilies are the families Asterisk reports no changes of: every
// family without an event source, all but the registrar with one.
func (t Tree) polledFamilies() []string {
	if t.Watch == nil {
		return t.Families
	}
	return slices.DeleteFunc(slices.Clone(t.Families), func(f string) bool { return f == astdb.ReportedFamily })
}

// onAstDBEvents takes first and whatever else is queued, and on the holder
// publishes the changes they report.
func (w *worker) onAstDBEvents(ctx context.Context, first ami.Event) {
	batch := []ami.Event{first}
	evs := w.t.Watch.Events()
drain:
	for len(batch) < astdbBatch {
		select {
		case ev := <-evs:
			batch = append(batch, ev)
		default:
			break drain
		}
	}
	if !w.isSource() {
		return
	}
	w.src.followEvents(ctx, batch)
}

// followEvents publishes what a batch of events reports. A contact that
// could not be read is left to a reconcile, soon.
func (w *source) followEvents(ctx context.Context, batch []ami.Event) {
	actx, cancel := context.WithTimeout(ctx, 10*time.Second)
	changes, _, err := w.reg.mirror.FromEvents(actx, w.t.AMI, batch, astdbParallel)
	cancel()
	if err != nil {
		if ctx.Err() == nil {
			w.log.Warn("reading reported contacts failed; reconciling", "err", err)
			w.reg.gap, w.resend = true, true
			nudgeTime(w.fsCh, time.Now())
		}
		return
	}
	w.publishDeltas(ctx, changes, events.AstDBReported)
}

// drainEvents follows every event already queued: a reconcile takes them
// first, since they were raised before its read was answered.
func (w *source) drainEvents(ctx context.Context) map[string]bool {
	if w.t.Watch == nil {
		return nil
	}
	var batch []ami.Event
	evs := w.t.Watch.Events()
drain:
	for {
		select {
		case ev := <-evs:
			batch = append(batch, ev)
		default:
			break drain
		}
	}
	if len(batch) == 0 {
		return nil
	}
	actx, cancel := context.WithTimeout(ctx, 10*time.Second)
	changes, touched, err := w.reg.mirror.FromEvents(actx, w.t.AMI, batch, astdbParallel)
	cancel()
	if err != nil {
		// The read that follows takes them as they are now.
		return nil
	}
	w.publishDeltas(ctx, changes, events.AstDBReported)
	return touched
}

// publishDeltas sends changes to the standbys, in chunks. Each chunk takes
// the next sequence number whether or not it goes out, so a standby sees
// the gap; one that did not go out also makes the next manifest come soon.
func (w *source) publishDeltas(ctx context.Context, changes []events.AstDBChange, cause events.AstDBCause) {
	for len(changes) > 0 {
		n, size := 0, 0
		for n < len(changes) && n < astdbChunk && (n == 0 || size+len(changes[n].Key)+len(changes[n].Value) < astdbChunkBytes) {
			size += len(changes[n].Key) + len(changes[n].Value) + 64
			n++
		}
		chunk := changes[:n]
		changes = changes[n:]
		now := time.Now()
		seq := max(uint64(now.UnixNano()), w.reg.seq+1)
		d := events.AstDBDelta{Node: w.e.cfg.Node, Group: w.e.cfg.Group, Tree: w.t.Name, Epoch: w.role.Epoch,
			Seq: seq, Prev: w.reg.seq, Cause: cause, At: now.UTC(), Changes: chunk}
		w.reg.seq = seq
		b, err := d.Encode()
		if err == nil {
			err = w.e.bus.NC.Publish(events.AstDBDeltaSubject(w.e.cfg.Cluster, w.e.cfg.Node), b)
		}
		if err != nil {
			if ctx.Err() == nil {
				w.log.Warn("publishing registrations failed; a manifest carries them", "changes", len(chunk), "err", err)
			}
			w.reg.failed, w.resend = true, true
			w.e.m.astdbChanges.WithLabelValues(w.t.Name, "source", "unpublished").Add(float64(len(chunk)))
			nudgeTime(w.fsCh, time.Now())
			continue
		}
		w.e.m.astdbChanges.WithLabelValues(w.t.Name, "source", string(cause)).Add(float64(len(chunk)))
		w.log.Debug("astdb delta published", "seq", seq, "changes", len(chunk), "cause", cause)
	}
}

// reconcile reads every family, publishes what no event reported as a
// delta, and returns the families as the manifest lists them.
func (w *source) reconcile(ctx context.Context) ([]fstree.Entry, error) {
	actx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if n := w.reg.dropped; w.t.Watch != nil {
		if d := w.t.Watch.DroppedEvents(); d != n {
			w.e.m.astdbDropped.WithLabelValues(w.t.Name).Add(float64(d - n))
			w.reg.dropped = d
		}
	}
	gap := w.reg.gap
	w.reg.gap = false
	read, err := astdb.Read(actx, w.t.AMI, w.t.Families)
	if err != nil {
		w.reg.gap = gap
		return nil, err
	}
	touched := w.drainEvents(ctx)
	puts, gone, unreported := w.reg.mirror.Reconcile(read, w.t.Families, touched)
	w.publishDeltas(ctx, puts, events.AstDBReconciled)
	if unreported > 0 {
		w.e.m.astdbUnreported.WithLabelValues(w.t.Name).Add(float64(unreported))
		if !gap && w.t.Watch != nil {
			w.log.Warn("Asterisk did not report some registration changes; this reconcile carried them (refreshes are reported only with send_contact_status_on_update_registration=yes in pjsip.conf [global])",
				"changes", unreported)
		}
	}
	if gone > 0 {
		w.log.Info("keys gone without being reported; the manifest carries their deletion", "keys", gone)
	}
	w.reg.failed = false
	return w.reg.mirror.Entries(), nil
}

// poll reads the families Asterisk reports no changes of and publishes
// their new values; a deletion among them makes a manifest now.
func (w *source) poll(ctx context.Context) {
	fams := w.t.polledFamilies()
	if len(fams) == 0 {
		return
	}
	actx, cancel := context.WithTimeout(ctx, 10*time.Second)
	read, err := astdb.Read(actx, w.t.AMI, fams)
	cancel()
	if err != nil {
		if ctx.Err() == nil {
			w.log.Warn("reading AstDB failed", "err", err)
		}
		return
	}
	puts, gone, _ := w.reg.mirror.Reconcile(read, fams, nil)
	w.publishDeltas(ctx, puts, events.AstDBPolled)
	if gone > 0 {
		w.pass(ctx, true)
	}
}

// onResyncRequest makes the reconcile a standby asked for, at most one a
// second; a request within the second is served at its end.
func (w *worker) onResyncRequest(ctx context.Context, later *time.Timer) {
	if !w.isSource() {
		return
	}
	if wait := resyncEvery - time.Since(w.src.reg.lastForced); wait > 0 {
		later.Reset(wait)
		return
	}
	w.src.reg.lastForced = time.Now()
	w.src.pass(ctx, true)
}

// onAstDBGap: events may have been lost (a new AMI connection, or the
// queue overflowed). The holder reconciles; a standby, whose Asterisk may
// have restarted without what it was given, asks for a fresh manifest.
func (w *worker) onAstDBGap(ctx context.Context) {
	switch {
	case w.isSource():
		w.e.m.astdbGaps.WithLabelValues(w.t.Name, "events").Inc()
		w.src.reg.gap = true
		if !w.src.pass(ctx, true) {
			nudgeTime(w.fsCh, time.Now())
		}
	case w.isTarget():
		if w.tgt.reg.lastSeq != 0 {
			w.tgt.reg.gapAt = max(w.tgt.reg.gapAt, w.tgt.reg.lastSeq)
			w.tgt.askResync(ctx)
		}
	}
}

// onDelta applies one delta of the holder on a standby.
func (w *target) onDelta(ctx context.Context, d events.AstDBDelta) {
	r := w.role
	if !w.isTarget() || d.Node != r.Holder {
		return
	}
	if d.Epoch != r.Epoch {
		if d.Epoch > r.Epoch {
			go func() {
				cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				defer cancel()
				_ = w.e.confirmHolder(cctx, 0)
			}()
		}
		return
	}
	t := &w.reg
	if d.Seq <= t.lastSeq {
		return // in a manifest already applied
	}
	if d.Prev > t.lastSeq {
		w.e.m.astdbGaps.WithLabelValues(w.t.Name, "sequence").Inc()
		w.log.Debug("astdb deltas missed; asking the holder for a reconcile", "after", t.lastSeq, "prev", d.Prev)
		t.gapAt = max(t.gapAt, d.Prev)
		w.askResync(ctx)
	}
	actx, cancel := context.WithTimeout(ctx, 10*time.Second)
	put, deleted, err := astdb.ApplyChanges(actx, w.t.AMI, d.Changes, astdbParallel)
	cancel()
	t.lastSeq = d.Seq
	for _, c := range d.Changes {
		t.keySeq[c.Key] = d.Seq
		delete(t.held, c.Key)
	}
	w.e.m.astdbHeld.WithLabelValues(w.t.Name).Set(float64(len(t.held)))
	w.e.m.astdbChanges.WithLabelValues(w.t.Name, "target", string(d.Cause)).Add(float64(put + deleted))
	if err != nil {
		if ctx.Err() == nil {
			w.log.Warn("applying registrations failed; asking for a reconcile", "seq", d.Seq, "err", err)
		}
		w.e.m.astdbGaps.WithLabelValues(w.t.Name, "apply").Inc()
		t.gapAt = max(t.gapAt, d.Seq)
		w.askResync(ctx)
		return
	}
	w.log.Debug("astdb delta applied", "seq", d.Seq, "put", put, "deleted", deleted, "ms", time.Since(d.At).Milliseconds())
}

// askResync asks the holder for a reconcile, at most once a second; the
// worker asks again while the gap stays open.
func (w *target) askResync(ctx context.Context) {
	if time.Since(w.reg.lastAsk) < resyncEvery {
		return
	}
	w.reg.lastAsk = time.Now()
	req := events.AstDBResync{Node: w.e.cfg.Node, Group: w.e.cfg.Group, Tree: w.t.Name, After: w.reg.lastSeq}
	b, err := req.Encode()
	if err != nil {
		return
	}
	subject := events.AstDBResyncSubject(w.e.cfg.Cluster, w.role.Holder)
	nc, log := w.e.bus.NC, w.log
	go func() {
		if _, err := nc.Request(subject, b, 2*time.Second); err != nil && ctx.Err() == nil {
			log.Debug("asking for a reconcile failed; the periodic one will come", "subject", subject, "err", err)
		}
	}()
}

// afterManifest updates a standby's delta state once a manifest applied:
// the deltas it includes are forgotten, a gap it covers closes, and what
// it held back is reported when it is new.
func (w *target) afterManifest(ctx context.Context, m *fstree.Manifest, ar astdb.ManifestResult, first bool) {
	t := &w.reg
	for k, s := range t.keySeq {
		if s <= m.AsOf {
			delete(t.keySeq, k)
		}
	}
	t.lastSeq = max(t.lastSeq, m.AsOf)
	if t.gapAt != 0 && m.AsOf >= t.gapAt {
		t.gapAt = 0
	}
	if first && time.Since(m.Created) > staleManifest {
		// What changed since it was read is unknown until the next delta.
		t.gapAt = max(t.gapAt, t.lastSeq)
		w.askResync(ctx)
	}
	held := make(map[string]bool, len(ar.Held))
	fresh := 0
	for _, k := range ar.Held {
		held[k] = true
		if !t.held[k] {
			fresh++
		}
	}
	t.held = held
	w.e.m.astdbHeld.WithLabelValues(w.t.Name).Set(float64(len(held)))
	if fresh == 0 {
		return
	}
	w.e.m.astdbHeldTotal.WithLabelValues(w.t.Name).Add(float64(fresh))
	msg := fmt.Sprintf("%s's manifest lacks %d of the %d keys this node has that Asterisk did not report gone and that have not expired (more than %d, or %.0f%%): held back, the rest applied; they stay until %s has them again, reports them gone, or they expire",
		m.Node, len(ar.Held), ar.Have, w.e.cfg.AllowDeletes, 100*w.e.cfg.MaxDeleteShare, m.Node)
	if !ar.HeldUntil.IsZero() {
		msg += " (by " + ar.HeldUntil.UTC().Format(time.RFC3339) + ")"
	}
	w.log.Warn("deletions held back", "source", m.Node, "held", len(ar.Held), "keys", ar.Have, "until", ar.HeldUntil)
	ev := events.ReplicationHeld{Node: w.e.cfg.Node, Source: m.Node, Group: w.e.cfg.Group, Tree: w.t.Name,
		Held: int64(len(ar.Held)), TargetKeys: int64(ar.Have), MaxShare: w.e.cfg.MaxDeleteShare, Until: ar.HeldUntil.UTC(),
		Keys: ar.Held[:min(len(ar.Held), events.MaxHeldListed)], Message: msg}
	if ar.HeldUntil.IsZero() {
		ev.Until = time.Time{}
	}
	w.e.emit(ctx, ev, events.WithEpoch(m.Epoch))
}

// followHolder subscribes a standby's AstDB tree to the deltas of the
// holder it follows, and nothing else: the holder's own deltas never come
// back to it, and each delta goes straight from the connection's reader
// into the worker's queue. A delta that finds the queue full is dropped by
// the NATS library, and the next one shows the gap.
func (w *worker) followHolder() {
	want := ""
	if w.isTarget() {
		want = w.role.Holder
	}
	if want == w.deltaFrom && (want == "" || w.deltaSub != nil) {
		return
	}
	if w.deltaSub != nil {
		_ = w.deltaSub.Unsubscribe()
		w.deltaSub = nil
	}
	w.deltaFrom = want
	if want == "" || w.e.bus == nil || w.e.bus.NC == nil {
		return
	}
	sub, err := w.e.bus.NC.ChanSubscribe(events.AstDBDeltaSubject(w.e.cfg.Cluster, want), w.deltaMsgs)
	if err != nil {
		// Asked again at the next reconcile tick; a manifest carries what
		// comes meanwhile.
		w.log.Warn("following the holder's deltas failed", "holder", want, "err", err)
		return
	}
	w.deltaSub = sub
}

// onDeltaMsg decodes a delta from the holder followed and applies it.
func (w *worker) onDeltaMsg(ctx context.Context, msg *nats.Msg) {
	d, err := events.DecodeAstDBDelta(msg.Data)
	if err == nil {
		err = events.VerifyAstDBDelta(w.e.cfg.Cluster, msg.Subject, d)
	}
	if err != nil {
		w.e.bus.Refuse(events.RefusalReason(err), msg.Subject, err)
		return
	}
	if d.Group != w.e.cfg.Group || d.Tree != w.t.Name {
		return
	}
	w.tgt.onDelta(ctx, d)
}

// answerResyncs takes standbys' requests for a reconcile: answered at once
// (empty), served by the tree's worker.
func (e *Engine) answerResyncs(ctx context.Context) error {
	subject := events.AstDBResyncSubject(e.cfg.Cluster, e.cfg.Node)
	sub, err := e.bus.NC.Subscribe(subject, func(msg *nats.Msg) {
		r, err := events.DecodeAstDBResync(msg.Data)
		if err != nil {
			e.bus.Refuse(events.RefusalReason(err), msg.Subject, err)
			return
		}
		_ = msg.Respond(nil)
		if w := e.trees[r.Tree]; w != nil && w.t.isAstDB() && r.Group == e.cfg.Group {
			nudge(w.resyncCh)
		}
	})
	if err != nil {
		return fmt.Errorf("replicator: answer astdb resyncs: %w", err)
	}
	<-ctx.Done()
	_ = sub.Unsubscribe()
	return nil
}

// hasAstDB says whether any tree carries AstDB.
func (e *Engine) hasAstDB() bool {
	for _, w := range e.trees {
		if w.t.isAstDB() {
			return true
		}
	}
	return false
}
