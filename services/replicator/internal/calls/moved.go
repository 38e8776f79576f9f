package calls

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/fanpbx/fan/pkg/ami"
	"github.com/fanpbx/fan/pkg/events"
	"github.com/nats-io/nats.go/jetstream"
)

// Calls a planned move left on this node.
//
// A switchover or a node standby moves the group while this node's
// Asterisk is alive, and the calls it carries across keep their channels
// here: the phones' requests, their BYEs included, now go to the floating
// address, where the new holder answers them (481) and its keeper tells
// the other phone (services/ipmover). This Asterisk never hears that the
// call ended, and with direct media and no session timers nothing else
// ends its channels: they would stay for ever, counted in this node's
// channels, and hold up any later move that waits for every channel (a
// failback). Hanging them up while the call is alive would end it:
// Asterisk sends BYEs in the phones' own dialogs.
//
// So, while this node does not hold the group, the recorder follows the
// group's kept records (events.GroupKeptKeys) and, for each call of its
// own that another node keeps (a kept record of the call's id naming its
// two channels), hangs up its channels once no node keeps it any more:
// the keeper deletes its record only when the call ended (a phone hung up,
// or its lifetime ran out) or when another keeper took it over, whose
// record is there first. A call up here when the group left that no node
// has kept (its adoption failed, it was anchored or unrecorded, or it
// ended during the move) is hung up after OrphanGrace from the moment the
// group status named another holder. Asterisk then sends each phone a BYE
// in a dialog that phone already ended, which it answers 481 and nothing
// else (observed on Asterisk 22, docs in the README); a phone still in an
// orphaned call is told it ended. A call of a group this node holds is
// never hung up.

// DefaultOrphanGrace is how long a call left here by a move that no node
// keeps is left up: the new holder reads the records within 30 s of its
// PBX answering, before the group status names it, and a restart of its
// ipmover adopts again within seconds; five minutes is ten times that,
// room for a restart and a bus election or two, and bounds what a failed
// adoption leaves behind.
//
// The bounds (the replicator's calls.orphan_grace): below a minute a call
// could be hung up while its new holder is still adopting it, after a
// slow PBX answer or an ipmover restart; above an hour a failed adoption
// leaves a phone in a call its PBX no longer has for that long.
const (
	DefaultOrphanGrace = 5 * time.Minute
	MinOrphanGrace     = time.Minute
	MaxOrphanGrace     = time.Hour
)

// Moved calls' timings.
const (
	// keptRewatch is how often the watch of the kept records is made
	// anew: its first values say which records exist now, which a record
	// the bucket aged out without a trace, or a watch gone deaf after a
	// server's loss, would not.
	keptRewatch = 30 * time.Second
	// keptRetry is the pause after a watch or a read failed.
	keptRetry = time.Second
	// hangupAgain is when a call still up after its channels were hung up
	// is hung up again.
	hangupAgain = 10 * time.Second
	// hangers bounds the hang-ups in flight.
	hangers = 4
)

// Why a moved call's channels were hung up (metric label, log value).
const (
	HungUpEnded     = "ended"      // the node that kept it no longer does: the call ended there
	HungUpNeverKept = "never_kept" // no node kept it within the grace
)

// keptUpdate is what the watch of the kept records reports to the loop:
// the live keys when its first values are in (reset), then each change.
type keptUpdate struct {
	gen   int
	reset bool
	keys  map[string]bool // reset: the live keys
	key   string
	live  bool
	err   error
}

type verifyResult struct {
	bridge string
	legs   [2]string
	key    string
	ok     bool // the record is this call's
	err    error
}

type hangResult struct {
	bridge string
	legs   [2]string
	err    error
}

// movedState is a call's part in a move.
type movedState struct {
	// heldHere: the call was up here while this node held the group.
	heldHere bool
	// kept is the kept key verified to be this call's, "" while none is;
	// keptSeen says some node kept it since it moved.
	kept      string
	keptSeen  bool
	foreign   map[string]bool // keys of its id that name other channels
	verifying bool
	verifyAt  time.Time
	hanging   bool
	asked     bool // its hang-up was asked once (counted)
	hangAt    time.Time
	hangFails int
}

func (r *Recorder) roleKnown() bool { return r.role.Holder != "" || r.role.Epoch > 0 }

// movedCalls lists the calls a move left here, keyed by record id.
func (r *Recorder) movedCalls() map[string]*call {
	if !r.roleKnown() || r.holder() {
		return nil
	}
	out := map[string]*call{}
	for _, c := range r.calls {
		if c.moved.heldHere {
			out[c.id] = c
		}
	}
	return out
}

// planMoved follows the calls a move left here: watches the kept records
// while there are any, verifies the records that name them, and hangs up
// those that ended at their keeper or were never kept.
func (r *Recorder) planMoved(ctx context.Context, now time.Time) {
	moved := r.movedCalls()
	need := len(moved) > 0 && r.kv != nil
	switch {
	case need && r.watchStop == nil:
		r.startKeptWatch(ctx, moved)
	case !need && r.watchStop != nil:
		r.stopKeptWatch()
	}
	if !need || !r.keptCurrent {
		return
	}
	for id, c := range moved {
		m := &c.moved
		if m.hanging || m.verifying || now.Before(m.hangAt) {
			continue
		}
		var unverified string
		keptNow := false
		for key := range r.keptView[id] {
			switch {
			case m.foreign[key]:
			case key == m.kept:
				keptNow = true
			default:
				unverified = key
			}
		}
		if m.kept != "" && !keptNow {
			// Its keeper let it go: the call ended there, or another node
			// took it over (whose record, there before, is verified next).
			m.kept = ""
		}
		switch {
		case keptNow:
		case unverified != "":
			if !now.Before(m.verifyAt) {
				r.startVerify(ctx, c, unverified)
			}
		case m.keptSeen:
			r.startHangup(ctx, c, HungUpEnded)
		case !r.otherSince.IsZero() && now.Sub(r.otherSince) >= r.cfg.OrphanGrace:
			r.startHangup(ctx, c, HungUpNeverKept)
		}
	}
}

// startKeptWatch follows the kept records of the group, for the ids of
// the calls a move left here (which only shrink while it runs: a call is
// left here only when this node stops holding, which ends the watch).
func (r *Recorder) startKeptWatch(ctx context.Context, moved map[string]*call) {
	ids := map[string]bool{}
	for id := range moved {
		ids[id] = true
	}
	wctx, cancel := context.WithCancel(ctx)
	r.watchStop, r.keptCurrent, r.keptView = cancel, false, nil
	r.watchGen++
	gen, kv := r.watchGen, r.kv
	r.log.Info("following the kept records: calls a move left here end when their keeper lets them go",
		"calls", len(ids), "holder", r.role.Holder)
	r.spawn(func() { r.watchKept(wctx, gen, kv, ids) })
}

func (r *Recorder) stopKeptWatch() {
	r.watchStop()
	r.watchStop, r.keptCurrent, r.keptView = nil, false, nil
}

// watchKept reads the group's kept keys (no values: a record is read only
// when it names one of ids) until ctx ends, made anew every keptRewatch.
func (r *Recorder) watchKept(ctx context.Context, gen int, kv jetstream.KeyValue, ids map[string]bool) {
	for ctx.Err() == nil {
		wctx, cancel := context.WithTimeout(ctx, keptRewatch)
		err := r.watchKeptOnce(wctx, gen, kv, ids)
		cancel()
		if err == nil || ctx.Err() != nil {
			continue
		}
		send(ctx, r.keptCh, keptUpdate{gen: gen, err: err})
		select {
		case <-time.After(keptRetry):
		case <-ctx.Done():
		}
	}
}

// watchKeptOnce is one watch: its first values, then every change, until
// ctx ends (nil) or the watch fails.
func (r *Recorder) watchKeptOnce(ctx context.Context, gen int, kv jetstream.KeyValue, ids map[string]bool) error {
	w, err := kv.Watch(ctx, events.GroupKeptKeys(r.cfg.Cluster, r.cfg.Group), jetstream.MetaOnly())
	if err != nil {
		return fmt.Errorf("watch the kept records: %w", err)
	}
	defer func() { _ = w.Stop() }()
	initial := map[string]bool{}
	seen := 0
	for {
		select {
		case e, ok := <-w.Updates():
			if !ok {
				return errors.New("watch the kept records: closed")
			}
			if initial != nil {
				if e == nil {
					send(ctx, r.keptCh, keptUpdate{gen: gen, reset: true, keys: initial})
					initial = nil
					continue
				}
				if seen++; seen > maxKeptRead {
					return fmt.Errorf("watch the kept records: more than %d", maxKeptRead)
				}
			}
			if e == nil {
				continue
			}
			key, live := e.Key(), e.Operation() == jetstream.KeyValuePut
			if !r.relevant(key, ids) {
				continue
			}
			if initial != nil {
				if live {
					initial[key] = true
				}
				continue
			}
			send(ctx, r.keptCh, keptUpdate{gen: gen, key: key, live: live})
		case <-ctx.Done():
			return nil
		}
	}
}

// maxKeptRead bounds the kept keys a watch's first values may hold: a
// group's nodes keep no more than this many calls between them.
const maxKeptRead = 4 * events.MaxCallsPerNode

// relevant says whether key is another node's kept record of one of ids.
func (r *Recorder) relevant(key string, ids map[string]bool) bool {
	p, err := events.ParseCallKey(key)
	return err == nil && p.Kind == events.CallKeyKept && p.Cluster == r.cfg.Cluster && p.Group == r.cfg.Group &&
		p.Node != r.cfg.Node && ids[p.ID]
}

// onKept takes what the watch reports.
func (r *Recorder) onKept(u keptUpdate) {
	if u.gen != r.watchGen || r.watchStop == nil {
		return
	}
	if u.err != nil {
		r.keptFails++
		if r.keptFails == 1 || r.keptFails%30 == 0 {
			r.log.Warn("following the kept records failed; retrying", "err", u.err, "failures", r.keptFails)
		}
		return
	}
	r.keptFails = 0
	if u.reset {
		r.keptView, r.keptCurrent = map[string]map[string]bool{}, true
		for key := range u.keys {
			r.setKept(key, true)
		}
		return
	}
	r.setKept(u.key, u.live)
}

func (r *Recorder) setKept(key string, live bool) {
	p, err := events.ParseCallKey(key)
	if err != nil {
		return
	}
	keys := r.keptView[p.ID]
	switch {
	case live && keys == nil:
		r.keptView[p.ID] = map[string]bool{key: true}
	case live:
		keys[key] = true
	case keys != nil:
		delete(keys, key)
		if len(keys) == 0 {
			delete(r.keptView, p.ID)
		}
	}
}

// startVerify reads a kept record of c's id: it is c's when it names c's
// two channels, which only an adoption of this node's record of c does.
func (r *Recorder) startVerify(ctx context.Context, c *call, key string) {
	c.moved.verifying = true
	b, legs, names, kv := c.bridge, c.legs, c.names, r.kv
	r.spawn(func() {
		vctx, cancel := context.WithTimeout(ctx, actionTimeout)
		defer cancel()
		res := verifyResult{bridge: b, legs: legs, key: key}
		e, err := kv.Get(vctx, key)
		if err != nil {
			res.err = err
			send(ctx, r.verifyCh, res)
			return
		}
		rec, err := events.DecodeCallRecord(e.Value())
		if err == nil {
			err = events.VerifyCallKey(key, rec)
		}
		res.ok = err == nil && rec.Kept && len(rec.Legs) == 2 && rec.Legs[0].Channel == names[0] && rec.Legs[1].Channel == names[1]
		send(ctx, r.verifyCh, res)
	})
}

func (r *Recorder) onVerify(res verifyResult) {
	c := r.calls[res.bridge]
	if c == nil || c.legs != res.legs {
		return
	}
	m := &c.moved
	m.verifying = false
	now := r.cfg.Now()
	switch {
	case errors.Is(res.err, jetstream.ErrKeyNotFound):
		// Gone meanwhile; the watch says so too.
		return
	case res.err != nil:
		m.verifyAt = now.Add(keptRetry)
		r.log.Debug("reading a kept record failed; retrying", "key", res.key, "err", res.err)
		return
	case !res.ok:
		if m.foreign == nil {
			m.foreign = map[string]bool{}
		}
		m.foreign[res.key] = true
		r.log.Warn("a kept record names a call of this node's but not its channels; ignored", "key", res.key, "bridge", c.bridge)
		return
	}
	first := !m.keptSeen
	m.kept, m.keptSeen = res.key, true
	if first {
		p, _ := events.ParseCallKey(res.key)
		r.log.Info("a call left here by a move is kept by another node: its channels go when it ends there",
			"bridge", c.bridge, "call", c.id, "keeper", p.Node, "channels", c.names[:])
	}
}

// startHangup hangs up c's channels. A call of a group this node holds is
// never hung up (the caller checked).
func (r *Recorder) startHangup(ctx context.Context, c *call, reason string) {
	if r.hanging >= hangers {
		return
	}
	r.hanging++
	c.moved.hanging = true
	if !c.moved.asked {
		c.moved.asked = true
		r.m.hungUp.WithLabelValues(reason).Inc()
	}
	b, legs, names := c.bridge, c.legs, c.names
	r.log.Info("hanging up the channels of a call a move left here", "bridge", b, "call", c.id, "reason", reason,
		"channels", names[:], "holder", r.role.Holder)
	r.spawn(func() {
		hctx, cancel := context.WithTimeout(ctx, actionTimeout)
		defer cancel()
		var errs []error
		for _, n := range names {
			errs = append(errs, hangup(hctx, r.cfg.AMI, n))
		}
		send(ctx, r.hangCh, hangResult{bridge: b, legs: legs, err: errors.Join(errs...)})
	})
}

// hangup hangs one channel up with AMI Hangup (write class system or
// call). A channel already gone ("No such channel": hanging one leg up
// ends the other with it) is no error.
func hangup(ctx context.Context, a Actioner, channel string) error {
	resp, err := a.Action(ctx, "Hangup", ami.F("Channel", channel), ami.F("Cause", "16"))
	if err != nil {
		return fmt.Errorf("hang up %s: %w", channel, err)
	}
	if !resp.Success() && !strings.EqualFold(resp.Message(), "No such channel") {
		return fmt.Errorf("hang up %s: %s", channel, resp.Message())
	}
	return nil
}

func (r *Recorder) onHangup(res hangResult) {
	r.hanging--
	c := r.calls[res.bridge]
	if c == nil || c.legs != res.legs {
		return // gone already: its Hangup events came first
	}
	m := &c.moved
	m.hanging = false
	now := r.cfg.Now()
	if res.err != nil {
		m.hangFails++
		r.m.hangupErrors.Inc()
		m.hangAt = now.Add(min(time.Duration(m.hangFails)*time.Second, hangupAgain))
		if m.hangFails == 1 || m.hangFails%10 == 0 {
			r.log.Warn("hanging up a call a move left here failed; retrying", "bridge", c.bridge, "err", res.err, "failures", m.hangFails)
		}
		return
	}
	// Asterisk's Hangup events end the call; if they never come, a
	// reconcile does, and failing that it is hung up again.
	m.hangFails, m.hangAt = 0, now.Add(hangupAgain)
}

// heldAgain forgets what the calls' moves said: this node holds the group
// again, and its Asterisk answers their dialogs itself.
func (r *Recorder) heldAgain() {
	for _, c := range r.calls {
		c.moved = movedState{heldHere: true}
	}
	r.otherSince = time.Time{}
}

// countMoved sets the gauge of the calls a move left here.
func (r *Recorder) countMoved() {
	kept, waiting := 0, 0
	for _, c := range r.movedCalls() {
		if c.moved.kept != "" {
			kept++
		} else {
			waiting++
		}
	}
	r.m.moved.WithLabelValues("kept").Set(float64(kept))
	r.m.moved.WithLabelValues("waiting").Set(float64(waiting))
}
