package app

import (
	"testing"
	"time"
)

func TestStandbyMayHold(t *testing.T) {
	t0 := time.Unix(1000, 0)
	p := newPrimaries(t0)
	if p.mayHold(t0, false) {
		t.Fatal("a standby campaigned before it could have heard anyone")
	}
	if !p.mayHold(t0.Add(presenceDeadAfter), false) {
		t.Fatal("a standby that hears no primary does not campaign")
	}
	// A primary appears: the standby stops campaigning at once, but a
	// standby that leads keeps the lease until the primary has settled.
	at := t0.Add(2 * time.Second)
	p.heard("a1", at)
	if p.mayHold(at, false) {
		t.Fatal("a standby campaigned while a primary is alive")
	}
	for ; at.Before(t0.Add(2*time.Second + presenceSettle)); at = at.Add(presenceEvery) {
		p.heard("a1", at)
		if !p.mayHold(at, true) {
			t.Fatalf("handed back %v after the primary appeared, before the settle time", at.Sub(t0.Add(2*time.Second)))
		}
	}
	p.heard("a1", at)
	if p.mayHold(at, true) {
		t.Fatal("did not hand back once the primary settled")
	}
	// The primary goes quiet: the standby may campaign again; when it comes
	// back its settle time starts over (a flapping primary does not get
	// the lease back at each flap).
	at = at.Add(presenceDeadAfter + time.Millisecond)
	if !p.mayHold(at, false) {
		t.Fatal("a standby does not campaign after the primary went quiet")
	}
	p.heard("a1", at)
	if !p.mayHold(at.Add(presenceEvery), true) {
		t.Fatal("a returning primary's settle time did not start over")
	}
}
