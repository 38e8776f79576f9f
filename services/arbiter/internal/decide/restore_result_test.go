package decide

import (
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/events"
)

// TestSuccessorKeepsAClaimConfirmedDuringTheHandover: the old leader
// claimed n2 and died; n2's "applied" arrived while the successor was still
// following. After restoring, the successor must hold n2 confirmed, not time
// the claim out and move the group a second time.
func TestSuccessorKeepsAClaimConfirmedDuringTheHandover(t *testing.T) {
	old := newFx(t, testConfig())
	old.boot()
	old.setSelf("n1", down)
	snap := old.c.Snapshot()
	claimID := snap.Groups[0].Claim.CommandID

	f := newFx(t, testConfig())
	f.now = old.now
	f.self, f.peer, f.claims, f.cmdIDs, f.evIDs = old.self, old.peer, old.claims, old.cmdIDs, old.evIDs
	f.beat() // following: observes
	f.claims["pbx"] = claimID
	f.result("pbx", "n2", events.OutcomeApplied) // arrives while following
	if err := f.c.Restore(snap); err != nil {
		t.Fatal(err)
	}
	f.lead(2)
	if out := run(10 * time.Second)(f); len(out.Emits) != 0 {
		t.Fatalf("successor moved again: %q", summary(out))
	}
	if g := f.c.Snapshot().Groups[0]; g.Holder != "n2" || g.Claim != nil {
		t.Fatalf("successor state %+v", g)
	}
}
