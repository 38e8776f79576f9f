package app

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/events"
)

// TestRestartedArbiterKeepsAnAppliedClaim: the leader dies with a claim
// outstanding, the claim is applied while no arbiter runs, and a new arbiter
// starts afterwards. It must find the result in the trail and keep the
// holder, not time the claim out and release a healthy node (found by the
// chaos suite: a needless outage and move).
func TestRestartedArbiterKeepsAnAppliedClaim(t *testing.T) {
	l := newLab(t, "n1", "n2")
	l.claimTimeout = 6 * time.Second // valid through a slow shutdown of the leader
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	gate := make(chan struct{})
	l.mu.Lock()
	l.slow["n1"] = gate // n1 receives its placement claim but answers only when told
	l.mu.Unlock()
	l.probers(ctx)
	for _, n := range l.nodes {
		l.executor(ctx, n)
	}
	stopA := l.arbiter("ctlA")
	// Wait until the placement claim is in the trail, then kill the leader.
	deadline := time.Now().Add(10 * time.Second)
	for !l.claimIssued(ctx, "n1") {
		if time.Now().After(deadline) {
			t.Fatal("no placement claim for n1")
		}
		time.Sleep(200 * time.Millisecond)
	}
	stopA()
	close(gate) // n1 applies the claim; its result lands while no arbiter runs
	l.waitHolder("n1", 10*time.Second)
	time.Sleep(1500 * time.Millisecond) // the dead leader's lease expires

	l.arbiter("ctlB")
	time.Sleep(l.claimTimeout + time.Second) // longer than the claim timeout
	if h := l.holding(); len(h) != 1 || h[0] != "n1" {
		t.Fatalf("holders %v after the restart, want n1 kept", h)
	}
	for _, env := range l.trail(ctx) {
		if env.Type == events.TypeReleaseIP {
			t.Fatalf("the restarted arbiter released a holder whose claim was applied: %s", env.ID)
		}
	}
}

func (l *lab) claimIssued(ctx context.Context, node string) bool {
	for _, env := range l.trail(ctx) {
		if env.Type == events.TypeClaimIP && strings.Contains(string(env.Data), `"node":"`+node+`"`) {
			return true
		}
	}
	return false
}
