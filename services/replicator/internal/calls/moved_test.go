package calls_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/fanpbx/fan/lab/amipeer"
	"github.com/fanpbx/fan/pkg/ami"
	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/waittest"
	"github.com/fanpbx/fan/services/replicator/internal/calls"
)

// keep writes node's kept record of the call recorded here, as that
// node's ipmover does when it adopts it.
func (l *lab) keep(node string, rec events.CallRecord) string {
	l.t.Helper()
	rec.Node, rec.Kept, rec.KeptSince, rec.AdoptedFrom, rec.UpdatedAt = node, true, time.Now(), l.node, time.Now()
	for i := range rec.Legs {
		rec.Legs[i].CSeq = 1 << 30
	}
	b, err := json.Marshal(rec)
	if err != nil {
		l.t.Fatal(err)
	}
	key := events.KeptKey(cluster, group, node, rec.ID)
	if _, err := l.kv.Put(l.ctx, key, b); err != nil {
		l.t.Fatal(err)
	}
	return key
}

func (l *lab) unkeep(key string) {
	l.t.Helper()
	if err := l.kv.Delete(l.ctx, key); err != nil {
		l.t.Fatal(err)
	}
}

// up says whether the peer still has channel.
func (l *lab) up(channel string) bool {
	for _, ch := range l.channels() {
		if ch == channel {
			return true
		}
	}
	return false
}

// channels lists the peer's channels, as CoreShowChannels does.
func (l *lab) channels() []string {
	l.t.Helper()
	s := ami.NewSession(ami.Config{Addr: l.peer.Addr(), Username: "fan", Secret: "s"}, nil)
	defer s.Close()
	resp, err := s.Action(l.ctx, "CoreShowChannels")
	if err != nil {
		l.t.Fatal(err)
	}
	var out []string
	for _, ev := range resp.Events() {
		if ch := ev.Field("Channel"); ev.Name() == "CoreShowChannel" && ch != "" {
			out = append(out, ch)
		}
	}
	return out
}

// hangups lists the channels the recorder asked the peer to hang up.
func (l *lab) hangups() []string {
	var out []string
	for _, a := range l.peer.Actions() {
		if strings.EqualFold(a.Name, "Hangup") {
			out = append(out, a.Field("Channel"))
		}
	}
	return out
}

// TestMovedCallHungUpWhenItsKeeperEnds: after a planned move, the old
// holder keeps the channels of the calls another node keeps, and hangs
// them up as soon as no node keeps them any more (the call ended there),
// not while one does (handed over from keeper to keeper), and never while
// it holds the group again.
func TestMovedCallHungUpWhenItsKeeperEnds(t *testing.T) {
	l := newLab(t)
	l.hold("n1", 1)
	r := l.start(nil)
	ends, stays := l.answer(1, true), l.answer(2, true)
	var recEnds, recStays events.CallRecord
	waittest.Until(t, 10*time.Second, "both calls recorded", func() bool {
		var ok1, ok2 bool
		recEnds, ok1 = l.record(ends.BridgeID())
		recStays, ok2 = l.record(stays.BridgeID())
		return ok1 && ok2 && recEnds.Carriable() && recStays.Carriable()
	})

	// The switchover: n2 holds, and keeps both calls.
	l.hold("n2", 2)
	keptEnds, keptStays := l.keep("n2", recEnds), l.keep("n2", recStays)
	waittest.Until(t, 10*time.Second, "both calls seen kept by n2", func() bool {
		return metricWith(t, r.reg, "fan_replicator_moved_calls", "state", "kept") == 2
	})
	// Handed over: n3 keeps one, then n2 lets it go. Still kept.
	keptByN3 := l.keep("n3", recStays)
	l.unkeep(keptStays)

	// The first call ends at n2: its channels go here, its record too.
	ended := time.Now()
	l.unkeep(keptEnds)
	endsCaller, endsCallee := ends.Channels()
	waittest.Until(t, 10*time.Second, "the ended call's channels hung up", func() bool {
		return !l.up(endsCaller) && !l.up(endsCallee)
	})
	t.Logf("channels hung up %v after the kept record went", time.Since(ended).Round(time.Millisecond))
	waittest.Until(t, 10*time.Second, "its record deleted", func() bool {
		_, ok := l.record(ends.BridgeID())
		return !ok
	})
	if got := metricWith(t, r.reg, "fan_replicator_moved_calls_hung_up_total", "reason", calls.HungUpEnded); got != 1 {
		t.Errorf("hung up (ended): %v", got)
	}
	// The call n3 keeps is up, and so are its channels and record.
	waittest.Until(t, 10*time.Second, "the other call seen kept by n3", func() bool {
		return metricWith(t, r.reg, "fan_replicator_moved_calls", "state", "kept") == 1 &&
			metricWith(t, r.reg, "fan_replicator_moved_calls", "state", "waiting") == 0
	})
	staysCaller, staysCallee := stays.Channels()
	if !l.up(staysCaller) || !l.up(staysCallee) {
		t.Fatal("the call still kept elsewhere was hung up")
	}
	for _, ch := range l.hangups() {
		if ch == staysCaller || ch == staysCallee {
			t.Fatalf("asked to hang up %s, whose call is kept", ch)
		}
	}

	// The group comes back here: its Asterisk answers the call's dialogs
	// again, and nothing a keeper does hangs it up.
	l.hold("n1", 3)
	waittest.Until(t, 10*time.Second, "no call counted moved", func() bool {
		return metricWith(t, r.reg, "fan_replicator_moved_calls", "state", "kept") == 0 && r.last().Holder
	})
	hungUp := metric(t, r.reg, "fan_replicator_moved_calls_hung_up_total")
	l.unkeep(keptByN3)
	r.plannedPast(t, time.Now().Add(500*time.Millisecond))
	if got := metric(t, r.reg, "fan_replicator_moved_calls_hung_up_total"); got != hungUp {
		t.Fatalf("%v hang-ups started for a call of the group this node holds", got-hungUp)
	}
	if !l.up(staysCaller) || !l.up(staysCallee) {
		t.Fatal("a call of the group this node holds was hung up")
	}
	if _, ok := l.record(stays.BridgeID()); !ok {
		t.Fatal("the record of the call up here was deleted")
	}
}

// TestMovedCallNeverKeptHungUpAfterGrace: a call left here by a move that
// no node keeps (its adoption failed, or a kept record names its id but
// not its channels) is hung up OrphanGrace after the group status named
// another holder, not before, and not while the move is in flight; a
// call this node's Asterisk has without ever having held the group is
// never hung up.
func TestMovedCallNeverKeptHungUpAfterGrace(t *testing.T) {
	const grace = 700 * time.Millisecond
	l := newLab(t)
	l.hold("n1", 1)
	r := l.start(func(c *calls.Config) { c.OrphanGrace = grace })
	orphan := l.answer(1, true)
	waittest.Until(t, 10*time.Second, "the call recorded", func() bool {
		_, ok := l.record(orphan.BridgeID())
		return ok
	})
	rec, _ := l.record(orphan.BridgeID())
	caller, callee := orphan.Channels()

	// A move in flight: no holder named yet.
	l.hold("", 2)
	waittest.Until(t, 10*time.Second, "the move in flight seen", func() bool { return r.last().Epoch == 2 })
	r.plannedPast(t, time.Now().Add(2*grace))
	if got := metric(t, r.reg, "fan_replicator_moved_calls_hung_up_total"); got != 0 || !l.up(caller) {
		t.Fatalf("hung up (%v started) while no holder was named", got)
	}
	// Another node keeps a call of the same id with other channels: not
	// this call.
	forged := rec
	forged.Legs = append([]events.CallLeg(nil), rec.Legs...)
	forged.Legs[0].Channel = "PJSIP/6009-000000ff"
	l.keep("n2", forged)

	named := time.Now()
	l.hold("n2", 3)
	standby := l.answer(2, true) // up here while n2 holds
	waittest.Until(t, 10*time.Second, "the orphaned call hung up", func() bool { return !l.up(caller) && !l.up(callee) })
	if waited := time.Since(named); waited < grace {
		t.Errorf("hung up %v after n2 was named holder, before the grace of %v", waited, grace)
	}
	if got := metricWith(t, r.reg, "fan_replicator_moved_calls_hung_up_total", "reason", calls.HungUpNeverKept); got != 1 {
		t.Errorf("hung up (never kept): %v", got)
	}
	r.plannedPast(t, time.Now().Add(2*grace))
	sc, se := standby.Channels()
	if got := metric(t, r.reg, "fan_replicator_moved_calls_hung_up_total"); got != 1 || !l.up(sc) || !l.up(se) {
		t.Fatalf("a call this node never held was hung up (%v hang-ups started)", got)
	}
}

// TestMovedCallHangupRefused: an AMI user that may not hang up (write
// without system or call) is refused; the recorder counts it, retries,
// and the channels stay.
func TestMovedCallHangupRefused(t *testing.T) {
	l := newLabWith(t, amipeer.Config{Username: "fan", Secret: "s", SystemName: "pbx",
		Users: []amipeer.User{{Name: "ro", Secret: "ro", Read: []string{"system", "call"}, Write: []string{"reporting"}}}})
	l.hold("n1", 1)
	r := l.startOn(l.bus, l.peer.Addr(), "ro", "ro", func(c *calls.Config) { c.OrphanGrace = 100 * time.Millisecond })
	c := l.answer(1, true)
	waittest.Until(t, 10*time.Second, "the call recorded", func() bool {
		_, ok := l.record(c.BridgeID())
		return ok
	})
	l.hold("n2", 2)
	waittest.Until(t, 10*time.Second, "a refused hang-up counted", func() bool {
		return metric(t, r.reg, "fan_replicator_moved_call_hangup_errors_total") >= 1
	})
	caller, _ := c.Channels()
	if !l.up(caller) {
		t.Fatal("channel gone")
	}
}
