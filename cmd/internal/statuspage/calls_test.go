package statuspage_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/fanpbx/fan/cmd/internal/statuspage"
	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/bus/bustest"
	"github.com/fanpbx/fan/pkg/platform/waittest"
)

// summarise publishes node's calls summary as its replicator does.
func (p *page) summarise(s events.CallsSummary) events.Envelope {
	p.t.Helper()
	if p.repl == nil {
		p.repl = map[string]*bus.Bus{}
	}
	b := p.repl[s.Node]
	if b == nil {
		b = bustest.Connect(p.t, p.srv, bus.Identity{Cluster: "lab", Service: "replicator", Node: s.Node})
		p.repl[s.Node] = b
	}
	env, err := b.Emit(context.Background(), s)
	if err != nil {
		p.t.Fatal(err)
	}
	return env
}

// heldSummary is n1's summary of one carriable call, with the settings
// that keep calls from surviving.
func heldSummary() events.CallsSummary {
	two := 2
	return events.CallsSummary{Node: "n1", Group: "pbx", Holder: true, Epoch: 1, IntervalMS: 2000, Channels: 2, CarriedChannels: 2,
		Calls: 1, Carriable: 1, At: time.Now(), TimersEndpoints: &two, TimersSample: []string{"6001", "6002"}, TransportsRead: true,
		ContactNodeAddress: []string{"transport-node"}}
}

// TestStatusShowsTheHoldersCalls: the snapshot carries the holder's calls
// summary on its node and the warnings it gives among the notes, as
// fanctl status prints them.
func TestStatusShowsTheHoldersCalls(t *testing.T) {
	p := startPage(t, statuspage.Config{})
	p.summarise(heldSummary())
	p.putStatus(group("n1", 1, time.Now()))
	var snap statuspage.Snapshot
	waittest.Until(t, 10*time.Second, "the holder's calls on the page", func() bool {
		resp := p.get("api/status", bearer(testToken))
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&snap) != nil {
			return false
		}
		return len(snap.Groups) == 1 && snap.Groups[0].Nodes[0].Calls != nil
	})
	n1, n2 := snap.Groups[0].Nodes[0], snap.Groups[0].Nodes[1]
	if n1.Name != "n1" || n1.Calls.Carriable != 1 || n1.CallsAt.IsZero() || n2.Calls != nil {
		t.Fatalf("nodes' calls: n1 %+v at %v, n2 %+v", n1.Calls, n1.CallsAt, n2.Calls)
	}
	notes := strings.Join(snap.Notes, "\n")
	for _, want := range []string{"pbx: CALLS: 2 endpoints on n1 negotiate session timers (6001, 6002)",
		"pbx: CALLS: dialogs on n1 carry the node's own address in their Contact (transport transport-node)", "pbx: holding: n1 is preferred"} {
		if !strings.Contains(notes, want) {
			t.Errorf("notes lack %q:\n%s", want, notes)
		}
	}
}

// TestExplainShowsWhatBecameOfTheCalls: the explanation of a failover
// carries what followed it (the claim's result) and the calls line.
func TestExplainShowsWhatBecameOfTheCalls(t *testing.T) {
	p := startPage(t, statuspage.Config{})
	ctx := context.Background()
	sum := heldSummary()
	sum.Anchored, sum.Calls, sum.Channels = 1, 2, 4
	se := p.summarise(sum)
	down, err := p.probes["n1"].Emit(ctx, events.HealthTransition{Check: "ami", TargetNode: "n1", Role: events.RoleSelf,
		From: events.HealthUp, To: events.HealthDown, Reason: "3 consecutive failures", Consecutive: 3, Rise: 2, Fall: 3,
		Evidence: []events.Evidence{{At: time.Now(), Error: "connection refused", ErrorClass: events.ErrorRefused, DurationMS: 1.5}}})
	if err != nil {
		t.Fatal(err)
	}
	hc := events.HolderCallsOf(se.ID, sum)
	claimID := "0193a1b2-0000-7000-8000-0000000000c2"
	dec, err := p.arb.Emit(ctx, events.ArbiterDecision{Group: "pbx", Action: events.ActionFailover, From: "n1", To: "n2",
		Reason: "holder n1 down (ami)", CausedBy: []string{down.ID, se.ID}, Commands: []string{claimID}, Calls: &hc},
		events.CausedBy(down), events.WithEpoch(2))
	if err != nil {
		t.Fatal(err)
	}
	ip := bustest.Connect(t, p.srv, bus.Identity{Cluster: "lab", Service: "ipmover", Node: "n2"})
	if _, err := ip.Emit(ctx, events.CommandResult{CommandID: claimID, CommandType: events.TypeClaimIP, Node: "n2", Group: "pbx",
		Outcome: events.OutcomeApplied, Calls: &events.CallsAdoption{Adopted: 1, NotAdopted: map[string]int{events.NotAdoptedAnchored: 1},
			From: []string{"n1"}}}); err != nil {
		t.Fatal(err)
	}
	var got struct {
		Links []statuspage.LinkView `json:"links"`
	}
	waittest.Until(t, 10*time.Second, "the explanation with what followed", func() bool {
		resp := p.get("api/explain?id="+dec.ID, bearer(testToken))
		defer resp.Body.Close()
		return resp.StatusCode == http.StatusOK && json.NewDecoder(resp.Body).Decode(&got) == nil && len(got.Links) == 4
	})
	last := got.Links[3]
	if got.Links[0].Calls == "" || !strings.Contains(got.Links[0].Calls, "1 survived, 1 lost (anchored 1)") ||
		!last.Consequence || last.Event.Type != events.TypeCommandResult {
		t.Fatalf("chain %+v", got.Links)
	}
}
