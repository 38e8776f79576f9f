package calls_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/fanpbx/fan/lab/amipeer"
	"github.com/fanpbx/fan/pkg/ami"
	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/bus/bustest"
	"github.com/fanpbx/fan/pkg/platform/waittest"
	"github.com/fanpbx/fan/services/replicator/internal/calls"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
)

const cluster, group = "lab", "pbx"

// lab is one node's Asterisk (the AMI peer, with calls as Asterisk 22
// reports them) and a bus with fan's streams and buckets.
type lab struct {
	t    testing.TB
	peer *amipeer.Peer
	bus  *bus.Bus
	kv   jetstream.KeyValue
	node string
	ctx  context.Context
}

func newLab(t testing.TB) *lab {
	t.Helper()
	return newLabWith(t, amipeer.Config{Username: "fan", Secret: "s", SystemName: "pbx"})
}

// newLabWith is newLab with the AMI peer configured so.
func newLabWith(t testing.TB, cfg amipeer.Config) *lab {
	t.Helper()
	s := bustest.Server(t)
	b := bustest.Connect(t, s, bus.Identity{Cluster: cluster, Service: "replicator", Node: "n1"})
	p, err := amipeer.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	kv, err := b.CallsKV(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return &lab{t: t, peer: p, bus: b, kv: kv, node: "n1", ctx: ctx}
}

// hold makes node the group's holder in epoch, as the arbiter writes it.
func (l *lab) hold(node string, epoch uint64) {
	l.t.Helper()
	kv, err := l.bus.StateKV(l.ctx)
	if err != nil {
		l.t.Fatal(err)
	}
	v, _ := json.Marshal(events.GroupStatus{Group: group, Holder: node, Epoch: epoch, UpdatedAt: time.Now()})
	if _, err := kv.Put(l.ctx, events.GroupStatusKey(cluster, group), v); err != nil {
		l.t.Fatal(err)
	}
}

// recorder is one running recorder and what it published.
type recorder struct {
	rec     *calls.Recorder
	reg     *prometheus.Registry
	stop    func()
	mu      sync.Mutex
	summary []events.CallsSummary
}

func (l *lab) start(mod func(*calls.Config)) *recorder {
	l.t.Helper()
	return l.startOn(l.bus, l.peer.Addr(), "fan", "s", mod)
}

// startWith starts a recorder on its own bus connection (another
// identity's).
func (l *lab) startWith(b *bus.Bus, mod func(*calls.Config)) *recorder {
	l.t.Helper()
	return l.startOn(b, l.peer.Addr(), "fan", "s", mod)
}

// startAMI starts a recorder on another AMI (a real Asterisk's).
func (l *lab) startAMI(addr, user, secret string) *recorder {
	l.t.Helper()
	return l.startOn(l.bus, addr, user, secret, nil)
}

func (l *lab) startOn(b *bus.Bus, addr, user, secret string, mod func(*calls.Config)) *recorder {
	l.t.Helper()
	sess := ami.NewSession(ami.Config{Addr: addr, Username: user, Secret: secret, Events: true,
		EventMask: calls.EventMask, EventNames: calls.EventNames(), EventBuffer: 4096}, nil)
	r := &recorder{reg: prometheus.NewRegistry()}
	cfg := calls.Config{Cluster: cluster, Group: group, Node: l.node, AMI: sess, Events: sess,
		Reconcile: time.Hour, SummaryEvery: 100 * time.Millisecond,
		Publish: func(s events.CallsSummary) {
			if err := s.Validate(); err != nil {
				l.t.Errorf("summary %+v: %v", s, err)
			}
			r.mu.Lock()
			r.summary = append(r.summary, s)
			r.mu.Unlock()
		}}
	if mod != nil {
		mod(&cfg)
	}
	r.rec = calls.New(cfg, b, r.reg, slog.New(slog.DiscardHandler))
	ctx, cancel := context.WithCancel(l.ctx)
	done := make(chan error, 1)
	go func() { done <- r.rec.Run(ctx) }()
	var once sync.Once
	r.stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				l.t.Errorf("recorder: %v", err)
			}
			sess.Close()
		})
	}
	l.t.Cleanup(r.stop)
	return r
}

func (r *recorder) last() events.CallsSummary {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.summary) == 0 {
		return events.CallsSummary{}
	}
	return r.summary[len(r.summary)-1]
}

// records reads the node's records from the bucket.
func (l *lab) records() map[string]events.CallRecord {
	l.t.Helper()
	out := map[string]events.CallRecord{}
	keys, err := l.kv.ListKeysFiltered(l.ctx, events.CallKey(cluster, group, l.node, "*"))
	if err != nil {
		l.t.Fatal(err)
	}
	for k := range keys.Keys() {
		e, err := l.kv.Get(l.ctx, k)
		if err != nil {
			continue // deleted meanwhile
		}
		r, err := events.DecodeCallRecord(e.Value())
		if err != nil {
			l.t.Fatalf("record %s: %v", k, err)
		}
		if err := events.VerifyCallKey(k, r); err != nil {
			l.t.Fatal(err)
		}
		out[k] = r
	}
	return out
}

func (l *lab) record(bridge string) (events.CallRecord, bool) {
	r, ok := l.records()[events.CallKey(cluster, group, l.node, events.CallIDForBridge(bridge))]
	return r, ok
}

// vars are the two legs' dialogs as Asterisk 22 read them
// (docs/asterisk22.md, "Observed: Getvar"), made distinct per call.
func vars(i int, direct bool) (caller, callee amipeer.LegVars) {
	caller = amipeer.LegVars{CallID: fmt.Sprintf("b3cc1200a13d%04d@198.51.100.50", i), LocalTag: fmt.Sprintf("b963f3a1-2b18-4ff0-845a-6c16e243%04d", i),
		RemoteTag: "34caa59d", LocalURI: "<sip:6002@198.51.100.10>", RemoteURI: "<sip:6001@198.51.100.10>",
		TargetURI: "sip:6001@198.51.100.50:5060", RequestURI: "sip:6002@198.51.100.10", RemoteAddr: "198.51.100.50:5060",
		LocalAddr: "198.51.100.10:5060", RTPDest: "198.51.100.50:10000", RTPSrc: "198.51.100.11:14020"}
	callee = amipeer.LegVars{CallID: fmt.Sprintf("c91bb727-e5df-47e8-82ce-96178be0%04d", i), LocalTag: fmt.Sprintf("e0ce68d8-b7a9-4b45-ac36-cc9462a7%04d", i),
		RemoteTag: "831e819d", LocalURI: "<sip:6001@198.51.100.11>", RemoteURI: "<sip:6002@198.51.100.51>",
		TargetURI: "sip:6002@198.51.100.51:5060", RTPDest: "198.51.100.51:20000", RTPSrc: "198.51.100.11:10120"}
	if direct {
		caller.RTPDirect, callee.RTPDirect = "198.51.100.51:20000", "198.51.100.50:10000"
	}
	return caller, callee
}

// answer places a call from 6001 to 6002 that the callee answers: what
// lab/pbxstandin tells the peer at each step of a real call.
func (l *lab) answer(i int, direct bool) *amipeer.Call {
	a, b := vars(i, direct)
	c := l.peer.StartCall("6001", "6002", "6002", a)
	c.SetVars(nil, &b)
	c.Ringing()
	c.Answered()
	return c
}

// TestRecordsACall: a call the holder's Asterisk bridges is recorded with
// both dialogs as Asterisk reads them, direct, carriable; the summary
// counts it; its record is deleted when it ends.
func TestRecordsACall(t *testing.T) {
	l := newLab(t)
	l.hold("n1", 1)
	r := l.start(nil)
	waittest.Until(t, 10*time.Second, "a first summary", func() bool { return r.last().Holder })

	start := time.Now()
	c := l.answer(1, true)
	var rec events.CallRecord
	waittest.Until(t, 10*time.Second, "the call's record", func() bool {
		var ok bool
		rec, ok = l.record(c.BridgeID())
		return ok
	})
	t.Logf("recorded %v after the answer", time.Since(start).Round(time.Millisecond))
	caller, callee := c.Channels()
	a, b := vars(1, true)
	want := []events.CallLeg{
		{Channel: caller, Endpoint: "6001", CallID: a.CallID, LocalTag: a.LocalTag, RemoteTag: a.RemoteTag, LocalURI: a.LocalURI,
			RemoteURI: a.RemoteURI, RemoteTarget: a.TargetURI, RemoteAddr: a.RemoteAddr, Transport: "udp"},
		{Channel: callee, Endpoint: "6002", CallID: b.CallID, LocalTag: b.LocalTag, RemoteTag: b.RemoteTag, LocalURI: b.LocalURI,
			RemoteURI: b.RemoteURI, RemoteTarget: b.TargetURI, Transport: "udp"},
	}
	if len(rec.Legs) != 2 || rec.Legs[0] != want[0] || rec.Legs[1] != want[1] {
		t.Fatalf("legs:\n got %+v\nwant %+v", rec.Legs, want)
	}
	if rec.Media != events.MediaDirect || !rec.Carriable() || rec.Kept || rec.ID != c.BridgeID() || rec.DirectSince.IsZero() {
		t.Fatalf("record %+v", rec)
	}
	waittest.Until(t, 10*time.Second, "the summary counting it carriable", func() bool {
		s := r.last()
		return s.Calls == 1 && s.Carriable == 1 && s.Channels == 2 && s.CarriedChannels == 2
	})
	if got := metric(t, r.reg, "fan_replicator_calls_recorded_total"); got != 1 {
		t.Errorf("calls recorded: %v", got)
	}

	c.HungUp(true)
	waittest.Until(t, 10*time.Second, "the record deleted at the hang-up", func() bool {
		_, ok := l.record(c.BridgeID())
		return !ok
	})
	waittest.Until(t, 10*time.Second, "the summary without it", func() bool {
		s := r.last()
		return s.Calls == 0 && s.Channels == 0
	})
}

// TestMediaGoingDirect: a call bridged with its media through Asterisk is
// recorded anchored at once and rewritten direct soon after its media goes
// direct; one that stays anchored stays so, and counts as anchored.
func TestMediaGoingDirect(t *testing.T) {
	l := newLab(t)
	l.hold("n1", 1)
	r := l.start(nil)
	late := l.answer(1, false)
	anchored := l.answer(2, false)
	waittest.Until(t, 10*time.Second, "both calls recorded anchored", func() bool {
		a, ok1 := l.record(late.BridgeID())
		b, ok2 := l.record(anchored.BridgeID())
		return ok1 && ok2 && a.Media == events.MediaAnchored && b.Media == events.MediaAnchored
	})
	waittest.Until(t, 10*time.Second, "the summary counting two anchored calls", func() bool {
		s := r.last()
		return s.Calls == 2 && s.Anchored == 2 && s.Carriable == 0 && s.CarriedChannels == 0
	})
	a, b := vars(1, true)
	went := time.Now()
	late.SetVars(&a, &b)
	waittest.Until(t, 10*time.Second, "the record rewritten direct", func() bool {
		rec, ok := l.record(late.BridgeID())
		return ok && rec.Media == events.MediaDirect && rec.Carriable()
	})
	t.Logf("direct on the bus %v after the media went direct", time.Since(went).Round(time.Millisecond))
	waittest.Until(t, 10*time.Second, "the summary counting one of each", func() bool {
		s := r.last()
		return s.Calls == 2 && s.Anchored == 1 && s.Carriable == 1 && s.Channels == 4 && s.CarriedChannels == 2
	})
	if rec, _ := l.record(anchored.BridgeID()); rec.Media != events.MediaAnchored || rec.Carriable() {
		t.Errorf("the anchored call: %+v", rec)
	}
}

// TestReconcileAfterRestart: records outlive the recorder; a new one reads
// its node's records and Asterisk's channels, keeps the records of calls
// still up (not rewritten), deletes the record of a call that ended while
// it was away, and records the call that began meanwhile.
func TestReconcileAfterRestart(t *testing.T) {
	l := newLab(t)
	l.hold("n1", 1)
	r := l.start(nil)
	stays, ends := l.answer(1, true), l.answer(2, true)
	waittest.Until(t, 10*time.Second, "both calls recorded", func() bool { return len(l.records()) == 2 })
	r.stop()
	rev := func(bridge string) uint64 {
		e, err := l.kv.Get(l.ctx, events.CallKey(cluster, group, "n1", bridge))
		if err != nil {
			return 0
		}
		return e.Revision()
	}
	before := rev(stays.BridgeID())

	ends.HungUp(false)
	begins := l.answer(3, true)
	r = l.start(nil)
	waittest.Until(t, 10*time.Second, "the records reconciled", func() bool {
		got := l.records()
		_, s := got[events.CallKey(cluster, group, "n1", stays.BridgeID())]
		_, e := got[events.CallKey(cluster, group, "n1", ends.BridgeID())]
		_, b := got[events.CallKey(cluster, group, "n1", begins.BridgeID())]
		return len(got) == 2 && s && !e && b
	})
	if after := rev(stays.BridgeID()); after != before {
		t.Errorf("the record of the call that stayed up was rewritten (revision %d, then %d)", before, after)
	}
	waittest.Until(t, 10*time.Second, "the summary", func() bool {
		s := r.last()
		return s.Calls == 2 && s.Carriable == 2
	})

	// Asterisk restarts (its calls gone, no event): the next AMI
	// connection is a gap, and its reconcile deletes every record.
	l.peer.DropCalls()
	l.peer.DropSessions()
	waittest.Until(t, 10*time.Second, "the records of the calls Asterisk lost deleted", func() bool { return len(l.records()) == 0 })
}

// TestOnlyTheHolderRecords: a node that does not hold the group records
// nothing (its calls count as unrecorded); once it holds, it records them;
// when it stops holding (a planned move), it keeps their records while the
// calls last and deletes each at its end, and records no new call.
func TestOnlyTheHolderRecords(t *testing.T) {
	l := newLab(t)
	l.hold("n2", 1)
	r := l.start(nil)
	first := l.answer(1, true)
	waittest.Until(t, 10*time.Second, "the summary counting an unrecorded call", func() bool {
		s := r.last()
		return !s.Holder && s.Calls == 1 && s.Unrecorded == 1
	})
	if n := len(l.records()); n != 0 {
		t.Fatalf("a standby recorded %d calls", n)
	}
	l.hold("n1", 2)
	waittest.Until(t, 10*time.Second, "the call recorded by the new holder", func() bool {
		_, ok := l.record(first.BridgeID())
		return ok
	})
	l.hold("n2", 3)
	second := l.answer(2, true)
	waittest.Until(t, 10*time.Second, "the summary counting the new call unrecorded", func() bool {
		s := r.last()
		return !s.Holder && s.Calls == 2 && s.Carriable == 1 && s.Unrecorded == 1
	})
	if _, ok := l.record(first.BridgeID()); !ok {
		t.Fatal("the former holder deleted the record of a call still up on it")
	}
	if _, ok := l.record(second.BridgeID()); ok {
		t.Fatal("the former holder recorded a new call")
	}
	first.HungUp(true)
	waittest.Until(t, 10*time.Second, "the record deleted at the call's end", func() bool {
		_, ok := l.record(first.BridgeID())
		return !ok
	})
}

// TestBound: a node records at most MaxCalls calls; the next is refused
// (counted) and recorded once a slot frees.
func TestBound(t *testing.T) {
	l := newLab(t)
	l.hold("n1", 1)
	r := l.start(func(c *calls.Config) { c.MaxCalls = 2 })
	c1, c2 := l.answer(1, true), l.answer(2, true)
	waittest.Until(t, 10*time.Second, "two calls recorded", func() bool { return len(l.records()) == 2 })
	c3 := l.answer(3, true)
	waittest.Until(t, 10*time.Second, "the third refused", func() bool {
		return metric(t, r.reg, "fan_replicator_calls_refused_total") == 1 && r.last().Unrecorded == 1
	})
	if _, ok := l.record(c3.BridgeID()); ok || len(l.records()) != 2 {
		t.Fatalf("over the bound: %d records", len(l.records()))
	}
	c1.HungUp(true)
	waittest.Until(t, 10*time.Second, "the third recorded once the first ended", func() bool {
		_, ok := l.record(c3.BridgeID())
		_, ok2 := l.record(c2.BridgeID())
		return ok && ok2 && len(l.records()) == 2
	})
}

// TestIncomplete: a leg whose dialog Asterisk does not tell (a channel
// that is not PJSIP's reads empty) is recorded incomplete, with the reason,
// and counted so.
func TestIncomplete(t *testing.T) {
	l := newLab(t)
	l.hold("n1", 1)
	r := l.start(nil)
	a, _ := vars(1, true)
	c := l.peer.StartCall("6001", "6002", "6002", a)
	c.SetVars(nil, &amipeer.LegVars{RTPDirect: "198.51.100.50:10000"})
	c.Answered()
	waittest.Until(t, 10*time.Second, "an incomplete record", func() bool {
		rec, ok := l.record(c.BridgeID())
		return ok && rec.Incomplete != "" && !rec.Carriable()
	})
	waittest.Until(t, 10*time.Second, "the summary counting it incomplete", func() bool {
		s := r.last()
		return s.Calls == 1 && s.Incomplete == 1
	})
}

// plannedPast waits until the recorder's loop has planned at or after at:
// what it would have started by then (a hang-up) it has.
func (r *recorder) plannedPast(t *testing.T, at time.Time) {
	t.Helper()
	waittest.Until(t, time.Until(at)+10*time.Second, "the recorder planning past "+at.Format("15:04:05.000"), func() bool {
		return !calls.PlannedAt(r.rec).Before(at)
	})
}

// metric is a counter's or gauge's value in reg (the sum over its labels).
func metric(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return sum
}

// TestSilentAsterisk: while Asterisk does not answer (a deadlock), the
// recorder publishes no summary (its view is not current) and deletes no
// record (a failover is about to carry them); once it answers again, the
// summaries resume.
func TestSilentAsterisk(t *testing.T) {
	l := newLab(t)
	l.hold("n1", 1)
	r := l.start(nil)
	c := l.answer(1, true)
	waittest.Until(t, 10*time.Second, "the call recorded", func() bool {
		_, ok := l.record(c.BridgeID())
		return ok && r.last().Carriable == 1
	})
	if err := l.peer.SetMode(amipeer.ModeFrozen); err != nil {
		t.Fatal(err)
	}
	count := func() int {
		r.mu.Lock()
		defer r.mu.Unlock()
		return len(r.summary)
	}
	frozen := len(l.peer.Actions())
	// A ping the frozen peer received is never answered, and the next is
	// sent only once the one before was: the summary of the last answered
	// one is published by the time the peer sees this (the loop does both,
	// in turn), and none follows it while the peer is silent.
	waittest.Until(t, 10*time.Second, "a ping received by the silent Asterisk", func() bool {
		return slices.ContainsFunc(l.peer.Actions()[frozen:], func(a amipeer.Action) bool { return a.Name == "Ping" })
	})
	n := count()
	// Ten summary intervals of silence: none.
	r.plannedPast(t, time.Now().Add(time.Second))
	if got := count(); got != n {
		t.Errorf("%d summaries published while Asterisk was silent", got-n)
	}
	if _, ok := l.record(c.BridgeID()); !ok {
		t.Fatal("the record was deleted while Asterisk was silent")
	}
	if err := l.peer.SetMode(amipeer.ModeNormal); err != nil {
		t.Fatal(err)
	}
	waittest.Until(t, 15*time.Second, "summaries again", func() bool { return count() > n+1 && r.last().Carriable == 1 })
}

// metricWith is the sum of the series of name whose label is value.
func metricWith(t *testing.T, reg *prometheus.Registry, name, label, value string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == label && lp.GetValue() == value {
					sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
				}
			}
		}
	}
	return sum
}
