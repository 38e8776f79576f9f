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
