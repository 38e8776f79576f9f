package calls

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/fanpbx/fan/pkg/ami"
	"github.com/fanpbx/fan/pkg/events"
	"github.com/nats-io/nats.go/jetstream"
)

// spawn runs f in a goroutine Run waits for before it returns.
func (r *Recorder) spawn(f func()) {
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		f()
	}()
}

// send hands a result to the loop, or drops it once ctx ended.
func send[T any](ctx context.Context, ch chan<- T, v T) {
	select {
	case ch <- v:
	case <-ctx.Done():
	}
}

func (r *Recorder) holder() bool { return r.role.Holder == r.cfg.Node }

// setRole takes the group's status; epochs only grow.
func (r *Recorder) setRole(gs events.GroupStatus) {
	if gs.Epoch < r.role.Epoch || (gs.Epoch == r.role.Epoch && gs.Holder == r.role.Holder) {
		return
	}
	was := r.holder()
	r.role = gs
	switch {
	case r.holder() && !was:
		r.log.Info("holding the group: recording its calls", "epoch", gs.Epoch)
		r.heldAgain()
	case was && !r.holder():
		r.log.Info("no longer holding the group: keeping the records of the calls still up here until they end",
			"holder", gs.Holder, "epoch", gs.Epoch, "records", r.liveRecords())
	}
	if !r.holder() && gs.Holder != "" && r.otherSince.IsZero() {
		// The calls a move left here that no node keeps are hung up
		// OrphanGrace from now (moved.go).
		r.otherSince = r.cfg.Now()
	}
}

// onEvent applies one event to the model.
func (r *Recorder) onEvent(ev ami.Event) {
	e, ok := parseEvent(ev)
	if !ok {
		return
	}
	bridges, media := r.model.apply(e)
	if len(bridges) > 0 || e.name == EventNewchannel || e.name == EventHangup {
		r.dirty = true
	}
	if media == "" {
		return
	}
	now := r.cfg.Now()
	for _, c := range r.calls {
		if c.legs[0] == media || c.legs[1] == media {
			c.mediaPlan = slices.Clone(afterHold)
			c.mediaAt = now.Add(c.mediaPlan[0])
		}
	}
}

// drain applies the events already queued, at most max of them (0: all),
// so that a burst does not keep the loop from its other work.
func (r *Recorder) drain(evs <-chan ami.Event, max int) {
	for n := 0; max == 0 || n < max; n++ {
		select {
		case ev := <-evs:
			r.onEvent(ev)
		default:
			return
		}
	}
}

// askReconcile asks for a read of every channel, now or after the one
// that runs.
func (r *Recorder) askReconcile(cause string) {
	if r.reconciling {
		if r.again == "" || cause == "gap" {
			r.again = cause
		}
		return
	}
	r.again = cause
	r.reconAt = time.Time{}
}

// startReconcile reads every channel, if one is due.
func (r *Recorder) startReconcile(ctx context.Context, now time.Time) {
	if r.reconciling || r.again == "" || now.Before(r.reconAt) {
		return
	}
	cause := r.again
	r.again, r.reconciling = "", true
	r.model.startReconcile()
	r.spawn(func() {
		sctx, cancel := context.WithTimeout(ctx, snapshotTimeout)
		defer cancel()
		chans, err := snapshot(sctx, r.cfg.AMI)
		send(ctx, r.snapCh, snapResult{cause: cause, chans: chans, err: err})
	})
}

// onSnapshot takes a reconcile's answer (the events queued before it were
// applied first).
func (r *Recorder) onSnapshot(res snapResult) {
	r.reconciling = false
	if res.err != nil {
		r.model.touched = nil
		r.current = false
		r.reconFails++
		r.m.reconcile.WithLabelValues(res.cause, "error").Inc()
		wait := min(time.Duration(r.reconFails)*time.Second, 10*time.Second)
		if r.reconFails == 1 || r.reconFails%10 == 0 {
			r.log.Warn("reading Asterisk's channels failed; retrying", "err", res.err, "retry_in", wait, "failures", r.reconFails)
		}
		if r.again == "" {
			r.again = res.cause
		}
		r.reconAt = r.cfg.Now().Add(wait)
		return
	}
	r.m.reconcile.WithLabelValues(res.cause, "ok").Inc()
	if r.reconFails > 0 {
		r.log.Info("reading Asterisk's channels again", "after_failures", r.reconFails)
	}
	r.reconFails = 0
	r.model.reconcile(res.chans)
	r.current, r.dirty, r.settingsDue = true, true, true
	r.matchFound()
}

// matchFound decides the records found on the bus at start, once both the
// bucket and Asterisk's channels were read: a record of a call Asterisk
// still has up is kept as this node's, every other one is deleted.
func (r *Recorder) matchFound() {
	if r.matched || r.found == nil || !r.current {
		return
	}
	live := map[string][2]string{}
	for _, b := range r.model.calls() {
		legs := r.model.legsOf(b)
		live[events.CallIDForBridge(b)] = [2]string{r.model.chans[legs[0]].name, r.model.chans[legs[1]].name}
	}
	kept, deleted := 0, 0
	for key, rec := range r.found {
		names, up := live[rec.ID]
		if up && len(rec.Legs) == 2 && rec.Legs[0].Channel == names[0] && rec.Legs[1].Channel == names[1] {
			kept++
			continue
		}
		deleted++
		r.setSlot(key, nil)
	}
	if kept > 0 || deleted > 0 {
		r.log.Info("records found on the bus at start", "kept", kept, "deleted", deleted)
	}
	// The kept ones are taken over by their calls (syncCalls, adopt).
	r.found, r.matched, r.dirty = nil, true, false
	r.syncCalls(r.cfg.Now())
}

// syncCalls makes r.calls the model's calls: a new bridge of two channels
// is a new call (one found on the bus at start takes its record over); a
// call whose bridge no longer joins the same two channels ends, and its
// record is deleted.
func (r *Recorder) syncCalls(now time.Time) {
	seen := map[string]bool{}
	for _, b := range r.model.calls() {
		seen[b] = true
		legs := r.model.legsOf(b)
		var l [2]string
		copy(l[:], legs)
		names := [2]string{r.model.chans[l[0]].name, r.model.chans[l[1]].name}
		if c := r.calls[b]; c != nil {
			if c.legs == l {
				if c.names != names {
					// Renamed: read again.
					c.names, c.read, c.readFails, c.readAt = names, false, 0, time.Time{}
				}
				continue
			}
			r.end(c)
		}
		id := events.CallIDForBridge(b)
		c := &call{bridge: b, id: id, key: events.CallKey(r.cfg.Cluster, r.cfg.Group, r.cfg.Node, id), legs: l, names: names, found: now}
		c.moved.heldHere = r.holder()
		r.adopt(c)
		r.calls[b], r.byKey[c.key] = c, c
	}
	for b, c := range r.calls {
		if !seen[b] {
			r.end(c)
		}
	}
}

// adopt gives a new call the record of it this node stored before it
// started (found on the bus, its slot stored and not yet taken).
func (r *Recorder) adopt(c *call) {
	s := r.slots[c.key]
	if s == nil || s.want == nil || s.stored != s.gen || r.byKey[c.key] != nil {
		return
	}
	rec, err := events.DecodeCallRecord(s.want)
	if err != nil || len(rec.Legs) != 2 || rec.Legs[0].Channel != c.names[0] || rec.Legs[1].Channel != c.names[1] {
		return
	}
	c.rec, c.gen, c.recorded, c.read = &rec, s.gen, true, true
	c.found, c.storedAt = rec.AnsweredAt, rec.UpdatedAt
	// Recorded here, so up while this node held the group: a move may
	// have left it here.
	c.moved.heldHere = true
	c.direct, c.directSince = rec.Media == events.MediaDirect, rec.DirectSince
	for i, l := range rec.Legs {
		c.dialog[i] = legDialog{leg: l, direct: c.direct}
	}
	if rec.Incomplete != "" {
		c.dialog[0].incomplete = rec.Incomplete
	}
	c.mediaAt = r.cfg.Now()
}

// end forgets a call and deletes its record.
func (r *Recorder) end(c *call) {
	delete(r.calls, c.bridge)
	delete(r.byKey, c.key)
	if s := r.slots[c.key]; s != nil && s.want != nil {
		r.setSlot(c.key, nil)
	}
}

// setSlot sets what this node wants under key (nil: nothing) and returns
// its generation.
func (r *Recorder) setSlot(key string, v []byte) uint64 {
	s := r.slots[key]
	if s == nil {
		if v == nil {
			return 0
		}
		s = &slot{}
		r.slots[key] = s
	}
	switch {
	case s.want == nil && v != nil:
		r.live++
	case s.want != nil && v == nil:
		r.live--
	}
	s.want = v
	s.gen++
	s.retryAt, s.failures = time.Time{}, 0
	return s.gen
}

// liveRecords counts the keys this node wants a record under.
func (r *Recorder) liveRecords() int { return r.live }

// plan starts what is due: a reconcile, reads of calls not yet read, media
// reads, records to store, writes to retry.
func (r *Recorder) plan(ctx context.Context) {
	now := r.cfg.Now()
	r.startReconcile(ctx, now)
	r.startSettings(ctx)
	if !r.matched {
		return
	}
	if r.dirty {
		r.dirty = false
		r.syncCalls(now)
	}
	holder := r.holder()
	var waiting []*call
	for _, c := range r.calls {
		if holder {
			c.moved.heldHere = true
		}
		switch {
		case c.reading || c.mediaReading:
		case !c.read && holder && !now.Before(c.readAt):
			if r.reading < readers {
				r.startRead(ctx, c)
			}
		case c.read && c.rec == nil && holder:
			waiting = append(waiting, c)
		case c.read && c.rec != nil && !c.mediaAt.IsZero() && !now.Before(c.mediaAt) && holder:
			if r.reading < readers {
				r.startMedia(ctx, c)
			}
		case c.rec != nil && now.Sub(c.storedAt) > refreshEvery && c.recorded:
			r.refresh(c, now)
		}
	}
	// Calls read but not recorded (the bound refused them, or the node
	// took the group): the oldest first, so the bound refuses the newest.
	slices.SortFunc(waiting, func(a, b *call) int {
		if d := a.found.Compare(b.found); d != 0 {
			return d
		}
		return compareUniqueid(a.legs[0], b.legs[0])
	})
	for _, c := range waiting {
		r.record(c, now)
	}
	r.startWrites(ctx, now)
	r.planMoved(ctx, now)
	r.plannedAt.Store(now.UnixNano())
}

func (r *Recorder) startRead(ctx context.Context, c *call) {
	c.reading = true
	r.reading++
	b, legs, names := c.bridge, c.legs, c.names
	r.spawn(func() {
		actx, cancel := context.WithTimeout(ctx, actionTimeout)
		defer cancel()
		d, err := readLegs(actx, r.cfg.AMI, names)
		send(ctx, r.readCh, readResult{bridge: b, legs: legs, dialog: d, err: err})
	})
}

func (r *Recorder) onRead(res readResult) {
	c := r.calls[res.bridge]
	if c == nil || c.legs != res.legs {
		return // the call ended or changed meanwhile
	}
	c.reading = false
	now := r.cfg.Now()
	if res.err != nil {
		c.readFails++
		if errors.Is(res.err, errGone) {
			// Its Hangup or BridgeLeave is on the way; a reconcile
			// settles it if not.
			c.readAt = now.Add(time.Second)
			return
		}
		if c.readFails >= 3 {
			// Asterisk will not say: record what is known, incomplete,
			// so the call is counted and a new holder says why.
			r.log.Warn("a call's dialogs could not be read; recording it incomplete", "bridge", c.bridge, "err", res.err)
			for i := range c.dialog {
				c.dialog[i] = legDialog{leg: events.CallLeg{Channel: c.names[i]},
					incomplete: fmt.Sprintf("reading the dialogs failed: %.200s", res.err)}
			}
			c.read = true
			return
		}
		c.readAt = now.Add(time.Duration(c.readFails) * 200 * time.Millisecond)
		return
	}
	c.read, c.dialog, c.readFails = true, res.dialog, 0
	c.direct = res.dialog[0].direct && res.dialog[1].direct
	if c.direct {
		c.directSince = now
	} else {
		c.mediaPlan = slices.Clone(mediaSteps)
		c.mediaAt = now.Add(c.mediaPlan[0])
	}
	if r.holder() {
		r.record(c, now)
	}
}

func (r *Recorder) startMedia(ctx context.Context, c *call) {
	c.mediaReading = true
	r.reading++
	b, legs, names := c.bridge, c.legs, c.names
	r.spawn(func() {
		actx, cancel := context.WithTimeout(ctx, actionTimeout)
		defer cancel()
		direct, err := readMedia(actx, r.cfg.AMI, names)
		send(ctx, r.mediaCh, mediaResult{bridge: b, legs: legs, direct: direct, err: err})
	})
}

func (r *Recorder) onMedia(res mediaResult) {
	c := r.calls[res.bridge]
	if c == nil || c.legs != res.legs {
		return
	}
	c.mediaReading = false
	now := r.cfg.Now()
	// The next read: the plan's next step, or none until the next
	// reconcile or Hold.
	if len(c.mediaPlan) > 1 {
		c.mediaAt = now.Add(c.mediaPlan[1] - c.mediaPlan[0])
		c.mediaPlan = c.mediaPlan[1:]
	} else {
		c.mediaAt, c.mediaPlan = time.Time{}, nil
	}
	if res.err != nil {
		return
	}
	if res.direct == c.direct {
		return
	}
	c.direct, c.wentDirect = res.direct, res.direct
	if c.direct {
		c.directSince = now
	} else {
		c.directSince = time.Time{}
	}
	if c.rec != nil {
		r.store(c, now)
	}
}

// rereadMedia schedules every recorded call's media to be read again,
// spread over a tenth of the reconcile interval.
func (r *Recorder) rereadMedia() {
	now := r.cfg.Now()
	spread := r.cfg.Reconcile / 10
	for _, c := range r.calls {
		if c.rec != nil && c.mediaAt.IsZero() {
			c.mediaAt = now.Add(time.Duration(rand.Int64N(int64(spread) + 1)))
		}
	}
}

// record gives a call read in full its first record, within the bound.
func (r *Recorder) record(c *call, now time.Time) {
	if r.liveRecords() >= r.cfg.MaxCalls {
		if !c.refused {
			c.refused = true
			r.m.refused.Inc()
			if now.Sub(r.lastRefused) > time.Minute {
				r.lastRefused = now
				r.log.Warn("too many calls to record: this one is not recorded, and will not be carried", "bridge", c.bridge, "max", r.cfg.MaxCalls)
			}
		}
		return
	}
	c.refused = false
	r.store(c, now)
}

// store builds the call's record as now known and sets it for writing.
func (r *Recorder) store(c *call, now time.Time) {
	rec := events.CallRecord{Cluster: r.cfg.Cluster, Group: r.cfg.Group, Node: r.cfg.Node, ID: c.id,
		Legs: []events.CallLeg{c.dialog[0].leg, c.dialog[1].leg}, Media: events.MediaAnchored,
		AnsweredAt: c.found, UpdatedAt: now}
	if c.direct {
		rec.Media, rec.DirectSince = events.MediaDirect, c.directSince
	}
	for _, d := range c.dialog {
		if d.incomplete != "" && rec.Incomplete == "" {
			rec.Incomplete = d.incomplete
		}
	}
	b, err := rec.Encode()
	if err != nil {
		// Over the size bound (every value within its own): keep the
		// channels only, and say why.
		rec.Legs = []events.CallLeg{{Channel: c.names[0]}, {Channel: c.names[1]}}
		rec.Incomplete = fmt.Sprintf("the record would be over %d bytes", events.MaxCallRecord)
		if b, err = rec.Encode(); err != nil {
			r.log.Warn("a call's record cannot be encoded", "bridge", c.bridge, "err", err)
			return
		}
	}
	c.rec = &rec
	c.gen = r.setSlot(c.key, b)
}

func (r *Recorder) refresh(c *call, now time.Time) {
	c.storedAt = now // once per interval, whatever the write's outcome
	r.store(c, now)
}

// startWrites writes what the bus does not hold yet, one write per key at
// a time, the newest value each time.
func (r *Recorder) startWrites(ctx context.Context, now time.Time) {
	if r.kv == nil {
		return
	}
	for key, s := range r.slots {
		if r.writing >= writers {
			return
		}
		if s.inflight || s.stored == s.gen || now.Before(s.retryAt) {
			continue
		}
		s.inflight = true
		r.writing++
		kv, v, gen := r.kv, s.want, s.gen
		r.spawn(func() {
			wctx, cancel := context.WithTimeout(ctx, actionTimeout)
			defer cancel()
			var err error
			if v == nil {
				err = kv.Delete(wctx, key)
			} else {
				_, err = kv.Put(wctx, key, v)
			}
			send(ctx, r.writeCh, writeResult{key: key, gen: gen, del: v == nil, err: err})
		})
	}
}

func (r *Recorder) onWrite(res writeResult) {
	s := r.slots[res.key]
	if s == nil {
		return
	}
	s.inflight = false
	op := "put"
	if res.del {
		op = "delete"
	}
	now := r.cfg.Now()
	if res.err != nil {
		r.m.writes.WithLabelValues(op, "error").Inc()
		s.failures++
		wait := min(time.Duration(s.failures)*250*time.Millisecond, 5*time.Second)
		s.retryAt = now.Add(wait)
		if s.failures == 1 || s.failures%20 == 0 {
			r.log.Warn("writing a call record failed; retrying", "key", res.key, "op", op, "err", res.err, "failures", s.failures)
		}
		return
	}
	r.m.writes.WithLabelValues(op, "ok").Inc()
	s.failures = 0
	s.stored = res.gen
	if s.want == nil && s.stored == s.gen {
		delete(r.slots, res.key)
		return
	}
	if c := r.byKey[res.key]; c != nil && c.gen == res.gen {
		c.storedAt = now
		if !c.recorded {
			c.recorded = true
			r.m.recorded.Inc()
			r.m.delay.WithLabelValues("answered").Observe(now.Sub(c.found).Seconds())
			r.log.Debug("call recorded", "bridge", c.bridge, "media", c.rec.Media, "carriable", c.rec.Carriable())
		}
		if c.wentDirect && c.rec.Media == events.MediaDirect {
			c.wentDirect = false
			r.m.delay.WithLabelValues("direct").Observe(now.Sub(c.directSince).Seconds())
		}
	}
}

// openBucket opens the bucket and reads this node's records of its group
// in it, retrying while it is missing or unreadable.
func (r *Recorder) openBucket(ctx context.Context, wait time.Duration) {
	if wait > 0 {
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return
		}
	}
	kv, err := r.bus.CallsKV(ctx)
	if err != nil {
		send(ctx, r.kvCh, kvResult{err: err})
		return
	}
	recs, err := r.list(ctx, kv)
	send(ctx, r.kvCh, kvResult{kv: kv, records: recs, err: err})
}

// list reads this node's records of its group.
func (r *Recorder) list(ctx context.Context, kv jetstream.KeyValue) (map[string]events.CallRecord, error) {
	lctx, cancel := context.WithTimeout(ctx, snapshotTimeout)
	defer cancel()
	w, err := kv.WatchFiltered(lctx, []string{events.CallKey(r.cfg.Cluster, r.cfg.Group, r.cfg.Node, "*")}, jetstream.IgnoreDeletes())
	if err != nil {
		return nil, fmt.Errorf("read this node's call records: %w", err)
	}
	defer func() { _ = w.Stop() }()
	out := map[string]events.CallRecord{}
	for {
		select {
		case e := <-w.Updates():
			if e == nil {
				return out, nil
			}
			rec, err := events.DecodeCallRecord(e.Value())
			if err == nil {
				err = events.VerifyCallKey(e.Key(), rec)
			}
			if err != nil {
				// This node's own key: whatever is there goes.
				r.log.Warn("an unreadable call record of this node; deleting it", "key", e.Key(), "err", err)
				rec = events.CallRecord{}
			}
			out[e.Key()] = rec
		case <-lctx.Done():
			return nil, fmt.Errorf("read this node's call records: %w", lctx.Err())
		}
	}
}

func (r *Recorder) onBucket(ctx context.Context, res kvResult) {
	if res.err != nil {
		if errors.Is(res.err, jetstream.ErrBucketNotFound) {
			r.log.Warn("the bucket of calls does not exist: no call is recorded until `fanctl provision` makes it", "bucket", events.CallsBucket)
		} else {
			r.log.Warn("opening the bucket of calls failed; retrying", "err", res.err)
		}
		r.spawn(func() { r.openBucket(ctx, 10*time.Second) })
		return
	}
	r.kv = res.kv
	r.found = map[string]events.CallRecord{}
	for key, rec := range res.records {
		r.found[key] = rec
		b, err := rec.Encode()
		if err != nil {
			b = []byte("{}")
		}
		r.slots[key] = &slot{want: b, gen: 1, stored: 1}
		r.live++
	}
	r.matchFound()
}

func (r *Recorder) ping(ctx context.Context) {
	pctx, cancel := context.WithTimeout(ctx, min(r.cfg.SummaryEvery, time.Second))
	defer cancel()
	resp, err := r.cfg.AMI.Action(pctx, "Ping")
	if err == nil && !resp.Success() {
		err = fmt.Errorf("ping refused: %s", resp.Message())
	}
	send(ctx, r.pingCh, err)
}

// onPing publishes the summary when Asterisk answered and the view is
// still current; a silent Asterisk makes the view unknown until the next
// reconcile.
func (r *Recorder) onPing(err error) {
	if err != nil {
		if r.current {
			r.log.Warn("Asterisk does not answer: no calls summary until its channels are read again", "err", err)
		}
		r.current = false
		r.askReconcile("gap")
		return
	}
	if r.current {
		r.publish()
	}
}

func (r *Recorder) countDropped() {
	n := r.cfg.Events.DroppedEvents()
	if n > r.dropped {
		r.m.dropped.Add(float64(n - r.dropped))
	}
	r.dropped = n
}

// Summary counts what the recorder knows now.
func (r *Recorder) Summary() events.CallsSummary {
	s := events.CallsSummary{Node: r.cfg.Node, Group: r.cfg.Group, Holder: r.holder(), Epoch: r.role.Epoch,
		IntervalMS: r.cfg.SummaryEvery.Milliseconds(), Channels: len(r.model.chans), At: r.cfg.Now().UTC()}
	for _, b := range r.model.calls() {
		s.Calls++
		c := r.calls[b]
		if c == nil || c.rec == nil {
			s.Unrecorded++
			continue
		}
		sl := r.slots[c.key]
		switch {
		case sl == nil || sl.stored != c.gen:
			// Not on the bus as known now: being written, or a change
			// of its media not written yet.
			s.Unrecorded++
		case c.rec.Complete() != nil:
			s.Incomplete++
		case !c.direct || !c.rec.Carriable():
			s.Anchored++
		default:
			s.Carriable++
		}
	}
	s.CarriedChannels = 2 * s.Carriable
	r.addSettings(&s)
	return s
}

func (r *Recorder) publish() {
	s := r.Summary()
	for state, n := range map[string]int{"carriable": s.Carriable, "anchored": s.Anchored, "incomplete": s.Incomplete, "unrecorded": s.Unrecorded} {
		r.m.calls.WithLabelValues(state).Set(float64(n))
	}
	r.m.channels.Set(float64(s.Channels))
	r.countMoved()
	if r.cfg.Publish != nil {
		r.cfg.Publish(s)
	}
}
