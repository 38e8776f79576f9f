package decide

import (
	"strings"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/events"
)

// beacons sends one presence beacon from each node not listed.
func (f *fx) beacons(every time.Duration, except ...string) Output {
	var all Output
	for _, n := range f.allNodes() {
		if !strings.Contains(" "+strings.Join(except, " ")+" ", " "+n+" ") {
			out := f.c.Beacon(f.now, events.Beacon{Node: n, IntervalMS: every.Milliseconds(), At: f.now})
			f.check(out)
			all.Emits = append(all.Emits, out.Emits...)
		}
	}
	return all
}

// runBeacons advances time in beacon steps, ticking like the shell does.
func (f *fx) runBeacons(d, every time.Duration, silent ...string) Output {
	var all Output
	for range int(d / every) {
		f.now = f.now.Add(every)
		all.Emits = append(all.Emits, f.beacons(every, silent...).Emits...)
		all.Emits = append(all.Emits, f.tick(0).Emits...)
	}
	return all
}

func firstDecision(out Output) *events.ArbiterDecision {
	for _, e := range out.Emits {
		if d, ok := e.Payload.(events.ArbiterDecision); ok {
			return &d
		}
	}
	return nil
}

func TestBeaconSilenceReplacesACrashedHolderFast(t *testing.T) {
	const every = 100 * time.Millisecond
	f := newFx(t, testConfig())
	f.boot()
	f.runBeacons(time.Second, every)

	// n1 crashes: its beacons stop, and both peers lose its PBX. Within the
	// silence limit (3 x 100 ms + 50 ms) nothing moves: n1 might only have
	// hiccuped.
	f.runBeacons(300*time.Millisecond, every, "n1")
	for _, obs := range []string{"n2", "n3"} {
		if d := firstDecision(f.setPeer(obs, "n1", down)); d != nil && d.Action != events.ActionHold {
			t.Fatalf("moved before the silence limit: %+v", d)
		}
	}
	// One more beacon interval and n1 is silent and unreachable: replaced
	// on the next tick, well under a second after the crash.
	d := firstDecision(f.runBeacons(every, every, "n1"))
	if d == nil || d.Action != events.ActionFailover || d.From != "n1" || !strings.Contains(d.Reason, "cannot reach") {
		t.Fatalf("want a failover away from n1 (silent, unreachable), got %+v", d)
	}
	if len(d.CausedBy) == 0 {
		t.Fatal("a failover on silence must still cite the peers' transitions")
	}
}

func TestBeaconSilenceAloneDoesNotMoveAReachableHolder(t *testing.T) {
	const every = 100 * time.Millisecond
	f := newFx(t, testConfig())
	f.boot()
	f.runBeacons(time.Second, every)
	// n1 is cut off from the bus only: no beacons, but peers still reach its PBX.
	out := f.runBeacons(2*time.Second, every, "n1")
	for _, e := range out.Emits {
		if d, ok := e.Payload.(events.ArbiterDecision); ok && d.Action != events.ActionHold {
			t.Fatalf("a holder cut off from the bus but answering its peers moved: %+v", d)
		}
	}
	if h := f.c.Snapshot().Groups[0].Holder; h != "n1" {
		t.Fatalf("holder %q, want n1 kept (invariant 6)", h)
	}
	// Beacons back: n1 is heard again and stays.
	f.runBeacons(time.Second, every)
	if h := f.c.Snapshot().Groups[0].Holder; h != "n1" {
		t.Fatalf("holder %q after the bus came back", h)
	}
}

// TestWakeIsWhenTheHolderFallsSilent: the core names the instant a
// holder's silence limit passes (last beacon + 3 beacons + grace), so the
// shell's timer acts on a crash there, not at its next periodic tick.
func TestWakeIsWhenTheHolderFallsSilent(t *testing.T) {
	const every = 50 * time.Millisecond
	cases := []struct {
		name  string
		grace time.Duration
		since time.Duration // from the holder's last beacon to the peers' transitions
	}{
		{"peers first, silence decides", 10 * time.Millisecond, 20 * time.Millisecond},
		{"peers first, default grace", 0, 60 * time.Millisecond},
		{"peers at the last moment", 10 * time.Millisecond, 159 * time.Millisecond},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig()
			cfg.PresenceGrace = tc.grace
			f := newFx(t, cfg)
			f.boot()
			f.runBeacons(time.Second, every)
			last := f.now
			limit := 3*every + tc.grace
			if tc.grace == 0 {
				limit = 3*every + DefaultPresenceGrace
			}
			if w, want := f.c.Wake(f.now), last.Add(limit+time.Nanosecond); !w.Equal(want) {
				t.Fatalf("Wake = %s after the last beacon, want %s", w.Sub(last), want.Sub(last))
			}
			// n1 crashes right after its beacon: the others keep beaconing
			// (which never moves n1's wake), the peers lose its PBX.
			f.now = last.Add(tc.since)
			f.beacons(every, "n1")
			for _, obs := range []string{"n2", "n3"} {
				if d := firstDecision(f.setPeer(obs, "n1", down)); d != nil && d.Action != events.ActionHold {
					t.Fatalf("moved before the silence limit: %+v", d)
				}
			}
			w := f.c.Wake(f.now)
			if want := last.Add(limit + time.Nanosecond); !w.Equal(want) {
				t.Fatalf("Wake = %s after the last beacon, want %s", w.Sub(last), want.Sub(last))
			}
			// At the limit itself n1 is still heard; a nanosecond past it, silent.
			f.now = w.Add(-time.Nanosecond)
			if d := firstDecision(f.tick(0)); d != nil && d.Action != events.ActionHold {
				t.Fatalf("moved at the limit itself: %+v", d)
			}
			f.now = w
			d := firstDecision(f.tick(0))
			if d == nil || d.Action != events.ActionFailover || d.From != "n1" || d.Trigger != events.TriggerTick {
				t.Fatalf("want a failover from n1 on the wake tick, got %+v", d)
			}
		})
	}
}

// TestWakeNamesAClaimsDeadlineAndNothingWhileFollowing: with a claim out the
// core wakes for the earlier of its deadline and the claimant's silence; a
// follower never asks to be woken.
func TestWakeNamesAClaimsDeadlineAndNothingWhileFollowing(t *testing.T) {
	const every = 100 * time.Millisecond
	f := newFx(t, testConfig())
	f.boot()
	f.runBeacons(time.Second, every)
	f.setSelf("n1", down) // failover to n2: a claim is out
	p := f.c.Snapshot().Groups[0].Claim
	if p == nil {
		t.Fatal("no claim out after the holder went down")
	}
	silentAt := f.now.Add(3*every + DefaultPresenceGrace + time.Nanosecond)
	if w := f.c.Wake(f.now); !w.Equal(silentAt) {
		t.Fatalf("Wake = %s, want the claimant's silence limit %s", w, silentAt)
	}
	// The claimant keeps beaconing and heartbeating: its claim's deadline
	// comes first.
	for f.now.Add(every).Before(p.Deadline) {
		f.now = f.now.Add(every)
		f.beacons(every)
		f.beat()
	}
	if w := f.c.Wake(f.now); !w.Equal(p.Deadline) {
		t.Fatalf("Wake = %s, want the claim's deadline %s", w, p.Deadline)
	}
	if err := f.c.SetLeadership(1, false); err != nil {
		t.Fatal(err)
	}
	if w := f.c.Wake(f.now); !w.IsZero() {
		t.Fatalf("a follower asked to be woken at %s", w)
	}
}

// TestLateHeartbeatsDoNotTakeAHolderOffTheBus: heartbeats come through the
// live stream and beacons do not. After a partition heals, the stream can
// deliver a node's heartbeats seconds late while its beacons arrive; a
// holder in that state is on the bus, and its peers' reports of it down
// (left over from their own cut, just healed) move nothing. Once its
// beacons stop as well, the same reports move it at once.
func TestLateHeartbeatsDoNotTakeAHolderOffTheBus(t *testing.T) {
	const every = 100 * time.Millisecond
	f := newFx(t, testConfig())
	f.boot()
	f.runBeacons(time.Second, every)
	for _, obs := range []string{"n2", "n3"} {
		if d := firstDecision(f.setPeer(obs, "n1", down)); d != nil && d.Action != events.ActionHold {
			t.Fatalf("a holder heard on the bus moved on its peers' reports: %+v", d)
		}
	}
	// Ten seconds, far past the heartbeat limit: n1's heartbeats do not
	// arrive, the others' do, every node's beacons do.
	for range 10 {
		out := f.runBeacons(time.Second, every)
		out.Emits = append(out.Emits, f.beat("n1").Emits...)
		for _, e := range out.Emits {
			if d, ok := e.Payload.(events.ArbiterDecision); ok && d.Action != events.ActionHold {
				t.Fatalf("a holder whose beacons arrive moved on late heartbeats: %+v", d)
			}
		}
	}
	if h := f.c.Snapshot().Groups[0].Holder; h != "n1" {
		t.Fatalf("holder %q, want n1 kept", h)
	}
	// It is still not eligible for anything new: what the arbiter knows of
	// it is stale (its status says silent).
	for _, n := range f.c.Snapshot().Groups[0].Nodes {
		if n.Node == "n1" && !n.Silent {
			t.Fatalf("n1's status %+v: want silent (heartbeats late)", n)
		}
	}
	// Its beacons stop too: off the bus, unreachable, replaced.
	d := firstDecision(f.runBeacons(500*time.Millisecond, every, "n1"))
	if d == nil || d.Action != events.ActionFailover || d.From != "n1" || !strings.Contains(d.Reason, "cannot reach") {
		t.Fatalf("want a failover away from n1 once its beacons stopped, got %+v", d)
	}
}

// TestClaimSurvivesLateHeartbeats: an operator's switchover claims n2,
// and n2's heartbeats stop arriving while its beacons do (the live stream
// lagging while its raft leader moves). The claim is kept until n2 answers:
// giving it up would release the group and place it elsewhere, an outage
// nobody asked for. Once n2 falls off the bus (no beacons either) the claim
// is given up as before.
func TestClaimSurvivesLateHeartbeats(t *testing.T) {
	const every = 100 * time.Millisecond
	for _, beaconsStop := range []bool{false, true} {
		f := newFx(t, testConfig())
		f.boot()
		f.runBeacons(time.Second, every)
		f.chans["n1"] = 0 // drained: the switchover moves at once
		f.beat()
		if rep, _ := f.op(events.OpSwitchover, "pbx", "n2", "maintenance of n1"); !rep.Accepted {
			t.Fatalf("switchover refused: %+v", rep)
		}
		if g := f.c.Snapshot().Groups[0]; g.Claim == nil || g.Claim.Node != "n2" {
			t.Fatalf("no claim on n2 after the switchover: %+v", g)
		}
		// 4 s without heartbeats (SilentAfter is 3 s), under the claim
		// timeout (5 s).
		var except []string
		if beaconsStop {
			except = []string{"n2"}
		}
		out := f.runBeacons(4*time.Second, every, except...)
		d := firstDecision(out)
		if !beaconsStop {
			if d != nil && d.Action != events.ActionHold {
				t.Fatalf("late heartbeats gave the claim up: %+v", d)
			}
			f.result("pbx", "n2", events.OutcomeApplied)
			if g := f.c.Snapshot().Groups[0]; g.Holder != "n2" {
				t.Fatalf("n2 does not hold after answering: %+v", g)
			}
			continue
		}
		if d == nil || d.Action != events.ActionRetry || !strings.Contains(d.Reason, "n2 silent") {
			t.Fatalf("a claimant off the bus kept its claim: %+v", d)
		}
	}
}
