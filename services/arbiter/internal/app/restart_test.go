package app

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/bus/bustest"
	"github.com/fanpbx/fan/pkg/platform/waittest"
	"github.com/fanpbx/fan/services/arbiter/internal/decide"
	"github.com/google/uuid"
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
	l.nodesUp(ctx)
	stopA := l.arbiter("ctlA")
	// Wait until the placement claim is in the trail, then kill the leader.
	waittest.Until(t, 10*time.Second, "a placement claim for n1", func() bool { return l.claimIssued(ctx, "n1") })
	stopA()
	close(gate) // n1 applies the claim; its result lands while no arbiter runs
	l.waitHolder("n1", 10*time.Second)
	time.Sleep(1500 * time.Millisecond) // the dead leader's lease expires

	l.arbiter("ctlB")
	l.tickedPast(time.Now().Add(l.claimTimeout + time.Second)) // past the claim timeout
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

// TestSuccessorReissuesAClaimNeverSent: the leader persisted a failover and
// died before its claim reached the bus (seen under load: the successor
// waited out the claim timeout with nobody holding, then skipped n2). The
// successor must find the claim absent from the command stream and claim
// n2 again at once, long before the claim's deadline.
func TestSuccessorReissuesAClaimNeverSent(t *testing.T) {
	l := newLab(t, "n1", "n2", "n3")
	l.claimTimeout = 10 * time.Second // the longest the lab's command TTL allows
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	l.nodesUp(ctx)
	stopA := l.arbiter("ctlA")
	l.waitHolder("n1", 10*time.Second)
	stopA()

	// What ctlA would have persisted just before publishing "release n1,
	// claim n2", had it not died first.
	b := bustest.Connect(t, l.s, bus.Identity{Cluster: "lab", Service: "test", Node: "writer"})
	kv, err := b.StateKV(ctx)
	if err != nil {
		t.Fatal(err)
	}
	e, err := kv.Get(ctx, events.ArbiterStateKey("lab"))
	if err != nil {
		t.Fatal(err)
	}
	var st decide.State
	if err := json.Unmarshal(e.Value(), &st); err != nil {
		t.Fatal(err)
	}
	unsent := uuid.Must(uuid.NewV7()).String()
	st.Groups[0].Holder = ""
	st.Groups[0].Claim = &decide.Claim{CommandID: unsent, Node: "n2", Action: events.ActionFailover,
		Deadline: time.Now().Add(l.claimTimeout), PreviousHolder: "n1", PreviousHolderFenced: true}
	raw, _ := json.Marshal(st)
	if _, err := kv.Put(ctx, events.ArbiterStateKey("lab"), raw); err != nil {
		t.Fatal(err)
	}
	l.setPBX("n1", false)

	start := time.Now()
	l.arbiter("ctlB")
	l.waitHolder("n2", 8*time.Second) // before the claim's deadline: not a timeout's retry
	t.Logf("n2 holds %s after the successor started", time.Since(start).Round(time.Millisecond))
	var reissued bool
	for _, env := range l.trail(ctx) {
		if env.Type == events.TypeArbiterDecision && env.CausationID == unsent &&
			strings.Contains(string(env.Data), "never reached the bus") {
			reissued = true
		}
	}
	if !reissued {
		t.Fatal("no decision cites the unsent claim as never sent")
	}
}
