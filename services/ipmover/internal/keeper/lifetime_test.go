package keeper

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/fanpbx/fan/pkg/events"
)

// clockAt is a clock that reads at now and runs from there: lifetimes are
// measured from a record's wall-clock KeptSince.
func clockAt(at time.Time) func() time.Time {
	start := time.Now()
	return func() time.Time { return at.Add(time.Since(start)) }
}

// keptUntil is when the fixture's call (kept since t0 + 1 min) ends with
// a lifetime of keepFor.
func keptUntil(keepFor time.Duration) time.Time { return keptRecord("x").KeptSince.Add(keepFor) }

// A kept call that outlives its lifetime is ended on both sides, each
// phone sent a BYE in its own dialog from the floating address, and its
// record goes once both answered; nothing is sent before.
func TestLifetimeEndsKeptCall(t *testing.T) {
	const keepFor = 2 * time.Hour
	k, n, st := newTestKeeper(t, Config{KeepFor: keepFor, Now: clockAt(keptUntil(keepFor).Add(-150 * time.Millisecond))})
	rec := keep(t, k, "c1")[0]
	key := events.KeptKey("lab", "pbx", "n2", "c1")
	n.quiet(t, 75*time.Millisecond)

	byes := map[string]sent{}
	for range 2 {
		s := n.next(t, 2*time.Second)
		if s.src != floating || s.msg.method != "BYE" || s.msg.cseq != CSeqBase {
			t.Fatalf("sent %+v from %s", s.msg, s.src)
		}
		byes[s.dst.String()] = s
	}
	for i, phone := range []string{phoneA.String(), phoneB.String()} {
		s, ok := byes[phone]
		if !ok {
			t.Fatalf("no BYE to %s: %v", phone, byes)
		}
		l := rec.Legs[i]
		if s.msg.callID != l.CallID || s.msg.fromTag != l.LocalTag || s.msg.toTag != l.RemoteTag {
			t.Fatalf("BYE to %s not in its dialog: %+v", phone, s.msg)
		}
	}
	if got := testutil.ToFloat64(k.Metrics().expired); got != 1 {
		t.Fatalf("expired %v", got)
	}
	// A phone's own BYE now changes nothing: the call is ending.
	n.deliver(t, phoneA, floating, request(rec, 0, "BYE", 2))
	// A live call's phone answers 200, a ghost's 481: both end it.
	n.deliver(t, phoneA, floating, response(byes[phoneA.String()].msg, 200))
	n.deliver(t, phoneB, floating, response(byes[phoneB.String()].msg, 481))
	st.waitOps(t, "put "+key, "delete "+key)
	if k.Kept() != 0 {
		t.Fatalf("kept %d", k.Kept())
	}
	for len(n.out) > 0 { // retransmissions that crossed the answers
		if s := <-n.out; s.msg.method != "BYE" {
			t.Fatalf("sent %s", s.msg.method)
		}
	}
	n.quiet(t, 100*time.Millisecond)
	if got := testutil.ToFloat64(k.Metrics().ended.WithLabelValues("0", CauseBye)); got != 0 {
		t.Fatalf("the phone's late BYE counted as the call's end: %v", got)
	}
}

// A call adopted past its lifetime (its record taken up again long after
// its first adoption) is ended at once.
func TestLifetimeOverAtAdoption(t *testing.T) {
	const keepFor = time.Hour
	k, n, _ := newTestKeeper(t, Config{KeepFor: keepFor, Now: clockAt(keptUntil(keepFor).Add(3 * time.Hour))})
	keep(t, k, "c1")
	got := map[string]bool{}
	for range 2 {
		got[n.next(t, time.Second).dst.String()] = true
	}
	if !got[phoneA.String()] || !got[phoneB.String()] {
		t.Fatalf("BYEs to %v", got)
	}
}

// A call that ends (a phone hangs up) or leaves (the group is released)
// before its lifetime is not ended again when it would have expired.
func TestLifetimeStopsWithTheCall(t *testing.T) {
	const keepFor = time.Hour
	k, n, st := newTestKeeper(t, Config{KeepFor: keepFor, Now: clockAt(keptUntil(keepFor).Add(-100 * time.Millisecond))})
	recs := keep(t, k, "ended", "released")
	n.deliver(t, phoneA, floating, request(recs[0], 0, "BYE", 2))
	first := n.next(t, time.Second)
	n.deliver(t, phoneB, floating, response(first.msg, 200))
	ended := events.KeptKey("lab", "pbx", "n2", "ended")
	released := events.KeptKey("lab", "pbx", "n2", "released")
	st.waitOps(t, "put "+ended, "put "+released, "delete "+ended)
	k.Release("pbx")
	for len(n.out) > 0 {
		<-n.out
	}
	n.quiet(t, 300*time.Millisecond)
	if got := testutil.ToFloat64(k.Metrics().expired); got != 0 {
		t.Fatalf("expired %v", got)
	}
	st.waitOps(t, "put "+ended, "put "+released, "delete "+ended)
}
