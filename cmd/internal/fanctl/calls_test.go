package fanctl_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/fanpbx/fan/cmd/internal/fanctl"
	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/bus/bustest"
	"github.com/fanpbx/fan/pkg/platform/waittest"
)

// TestStatusWarnsOfWhatEndsCarriedCalls: the holder's replicator says in
// its calls summary that its endpoints negotiate session timers, that its
// dialogs carry the node's own address and that a transport rewrites the
// media address; fanctl status says so under its tables. A standby's
// summary is not the holder's, and says nothing.
func TestStatusWarnsOfWhatEndsCarriedCalls(t *testing.T) {
	s := bustest.Server(t)
	arb := bustest.Connect(t, s, bus.Identity{Cluster: "lab", Service: "arbiter", Node: "ctl"})
	ctx := context.Background()
	kv, err := arb.StateKV(ctx)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	g := events.GroupStatus{Group: "pbx", Addresses: []string{"198.51.100.10/24"}, Holder: "n1", Epoch: 3, Since: now, UpdatedAt: now,
		Nodes: map[string]events.NodeStatus{"n1": {Health: events.HealthUp, LastHeartbeat: now}, "n2": {Health: events.HealthUp, Priority: 1}}}
	v, _ := json.Marshal(g)
	if _, err := kv.Put(ctx, events.GroupStatusKey("lab", "pbx"), v); err != nil {
		t.Fatal(err)
	}
	two := 2
	for _, n := range []string{"n1", "n2"} {
		repl := bustest.Connect(t, s, bus.Identity{Cluster: "lab", Service: "replicator", Node: n})
		sum := events.CallsSummary{Node: n, Group: "pbx", Holder: n == "n1", Epoch: 3, IntervalMS: 2000, Channels: 2, CarriedChannels: 2,
			Calls: 1, Carriable: 1, At: time.Now(), TimersEndpoints: &two, TimersSample: []string{"6001", "6002"}, TransportsRead: true,
			ContactNodeAddress: []string{"transport-" + n}, MediaAddressRewritten: []string{"transport-float"}}
		if _, err := repl.Emit(ctx, sum); err != nil {
			t.Fatal(err)
		}
	}
	var out, errb bytes.Buffer
	if code := fanctl.Main([]string{"--url", s.ClientURL(), "--cluster", "lab", "status"}, &out, &errb, "t"); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	for _, want := range []string{
		"pbx: CALLS: 2 endpoints on n1 negotiate session timers (6001, 6002): a call carried across a failover ends at its first session refresh",
		"pbx: CALLS: dialogs on n1 carry the node's own address in their Contact (transport transport-n1)",
		"pbx: CALLS: transport transport-float on n1 sets external_media_address",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("status lacks %q:\n%s", want, out.String())
		}
	}
	if strings.Contains(out.String(), "transport-n2") {
		t.Errorf("status warns of the standby's settings:\n%s", out.String())
	}

	// fanctl events --live prints the summaries readably.
	out.Reset()
	if code := fanctl.Main([]string{"--url", s.ClientURL(), "--cluster", "lab", "events", "--live", "--since", "all", "--type", "calls.summary"}, &out, &errb, "t"); code != 0 {
		t.Fatalf("events --live: exit %d: %s", code, errb.String())
	}
	if !strings.Contains(out.String(), "n1 (holder of pbx, epoch 3): 1 call up, 1 carriable; 2 channels, 2 carried; session timers on 2 endpoints") {
		t.Errorf("events --live:\n%s", out.String())
	}
}

// TestExplainAFailoverSaysWhatBecameOfTheCalls: explain of a failover
// prints its causes, the claim's result and the calls.adopted event that
// followed the deferred adoption, and a line with the calls up, survived
// and lost, and why.
func TestExplainAFailoverSaysWhatBecameOfTheCalls(t *testing.T) {
	s := bustest.Server(t)
	ctx := context.Background()
	arb := bustest.Connect(t, s, bus.Identity{Cluster: "lab", Service: "arbiter", Node: "ctl"})
	n1 := bustest.Connect(t, s, bus.Identity{Cluster: "lab", Service: "prober", Node: "n1"})
	repl := bustest.Connect(t, s, bus.Identity{Cluster: "lab", Service: "replicator", Node: "n1"})
	ip := bustest.Connect(t, s, bus.Identity{Cluster: "lab", Service: "ipmover", Node: "n2"})
	now := time.Now()
	sum := events.CallsSummary{Node: "n1", Group: "pbx", Holder: true, IntervalMS: 2000, Channels: 6, CarriedChannels: 4, Calls: 3,
		Carriable: 2, Anchored: 1, At: now}
	se, err := repl.Emit(ctx, sum)
	if err != nil {
		t.Fatal(err)
	}
	down, err := n1.Emit(ctx, events.HealthTransition{Check: "pbx", TargetNode: "n1", Role: events.RoleSelf, From: events.HealthUp,
		To: events.HealthDown, Reason: "3 consecutive failures", Consecutive: 3, Rise: 2, Fall: 3,
		Evidence: []events.Evidence{{At: now, Error: "refused", ErrorClass: events.ErrorRefused, DurationMS: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	hc := events.HolderCallsOf(se.ID, sum)
	claimID := "0193a1b2-0000-7000-8000-0000000000c1"
	dec, err := arb.Emit(ctx, events.ArbiterDecision{Group: "pbx", Action: events.ActionFailover, From: "n1", To: "n2",
		Reason: "holder n1 reports pbx down", CausedBy: []string{down.ID, se.ID}, Commands: []string{claimID}, Calls: &hc},
		events.CausedBy(down), events.WithEpoch(4))
	if err != nil {
		t.Fatal(err)
	}
	claim, err := arb.Emit(ctx, events.ClaimIP{Group: "pbx", Node: "n2", Addresses: []string{"198.51.100.10/24"}, NotAfter: now.Add(5 * time.Second)},
		events.WithID(claimID), events.CausedBy(dec), events.WithEpoch(4))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ip.Emit(ctx, events.CommandResult{CommandID: claim.ID, CommandType: events.TypeClaimIP, Node: "n2", Group: "pbx",
		Outcome: events.OutcomeApplied, Calls: &events.CallsAdoption{Deferred: true}}, events.CausedBy(claim)); err != nil {
		t.Fatal(err)
	}
	if _, err := ip.Emit(ctx, events.CallsAdopted{Group: "pbx", Node: "n2", CommandID: claim.ID, At: time.Now(),
		Calls: events.CallsAdoption{Adopted: 2, NotAdopted: map[string]int{events.NotAdoptedAnchored: 1}, From: []string{"n1"}}},
		events.CausedBy(claim)); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	waittest.Succeeds(t, 5*time.Second, "explain showing calls.adopted", func() error {
		out.Reset()
		code := fanctl.Main([]string{"--url", s.ClientURL(), "--cluster", "lab", "explain", dec.ID}, &out, &errb, "t")
		if code != 0 || !strings.Contains(out.String(), "calls.adopted") {
			return fmt.Errorf("exit %d: %s\n%s", code, errb.String(), out.String())
		}
		return nil
	})
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	want := []string{"FAILOVER n1->n2", "health.transition", "probe", "calls.summary replicator@n1 n1 (holder of pbx): 3 calls up, 2 carriable, 1 anchored",
		"what followed", "  => ", "  => ", "calls: 3 calls up on n1"}
	if len(lines) != len(want) {
		t.Fatalf("explain printed %d lines:\n%s", len(lines), out.String())
	}
	for i, w := range want {
		if !strings.Contains(lines[i], w) {
			t.Fatalf("line %d %q lacks %q:\n%s", i, lines[i], w, out.String())
		}
	}
	if !strings.Contains(lines[5], "command.result") || !strings.Contains(lines[6], "calls.adopted ipmover@n2 pbx on n2: adopted 2 from n1, not adopted: anchored 1") ||
		!strings.HasSuffix(lines[7], "n2 adopted 2 from n1, not adopted: anchored 1; 2 survived, 1 lost (anchored 1)") {
		t.Fatalf("what followed:\n%s", out.String())
	}
	// --json carries the same: the consequences marked, the outcome on the
	// decision's link.
	out.Reset()
	if code := fanctl.Main([]string{"--url", s.ClientURL(), "--cluster", "lab", "explain", "--json", dec.ID}, &out, &errb, "t"); code != 0 {
		t.Fatalf("explain --json: exit %d: %s", code, errb.String())
	}
	var chain []struct {
		ID          string `json:"id"`
		Consequence bool   `json:"consequence"`
		Calls       *struct {
			Survived *int           `json:"survived"`
			Lost     *int           `json:"lost"`
			LostWhy  map[string]int `json:"lost_why"`
		} `json:"calls"`
	}
	if err := json.Unmarshal(out.Bytes(), &chain); err != nil {
		t.Fatal(err)
	}
	if len(chain) != 5 || chain[0].Calls == nil || *chain[0].Calls.Survived != 2 || *chain[0].Calls.Lost != 1 ||
		chain[0].Calls.LostWhy[events.NotAdoptedAnchored] != 1 || !chain[3].Consequence || !chain[4].Consequence {
		t.Fatalf("explain --json:\n%s", out.String())
	}
}
