package fanctl_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fanpbx/fan/cmd/internal/fanctl"
	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/bus/bustest"
	"github.com/fanpbx/fan/pkg/platform/waittest"
)

// TestExplainWalksBackToTheProbes builds the chain an auditor follows:
// result -> claim -> decision -> (transition with its probe evidence, heartbeat).
func TestExplainWalksBackToTheProbes(t *testing.T) {
	s := bustest.Server(t)
	b := bustest.Connect(t, s, bus.Identity{Cluster: "lab", Service: "prober", Node: "n1"})
	ctx := context.Background()
	now := time.Now()
	n2 := bustest.Connect(t, s, bus.Identity{Cluster: "lab", Service: "prober", Node: "n2"})
	hb, err := n2.Emit(ctx, events.NodeHeartbeat{Node: "n2", IntervalMS: 1000, Version: "t"})
	if err != nil {
		t.Fatal(err)
	}
	down, err := b.Emit(ctx, events.HealthTransition{Check: "pbx", TargetNode: "n1", Role: events.RoleSelf, From: events.HealthUp,
		To: events.HealthDown, Reason: "3 consecutive failures", Consecutive: 3, Rise: 2, Fall: 3,
		Evidence: []events.Evidence{{At: now, Error: "action Command: deadline exceeded", ErrorClass: events.ErrorTimeout, DurationMS: 200}}})
	if err != nil {
		t.Fatal(err)
	}
	dec, err := b.Emit(ctx, events.ArbiterDecision{Group: "pbx", Action: events.ActionFailover, From: "n1", To: "n2",
		Reason: "holder n1 reports pbx down", CausedBy: []string{down.ID, hb.ID}}, events.CausedBy(down), events.WithEpoch(4))
	if err != nil {
		t.Fatal(err)
	}
	claim, err := b.Emit(ctx, events.ClaimIP{Group: "pbx", Node: "n2", Addresses: []string{"198.51.100.10/24"}, NotAfter: now.Add(5 * time.Second)},
		events.CausedBy(dec), events.WithEpoch(4))
	if err != nil {
		t.Fatal(err)
	}
	res, err := b.Emit(ctx, events.CommandResult{CommandID: claim.ID, CommandType: events.TypeClaimIP, Node: "n2", Group: "pbx",
		Outcome: events.OutcomeApplied}, events.CausedBy(claim))
	if err != nil {
		t.Fatal(err)
	}
	// The command's copy reaches the audit stream through its source: wait for it.
	var out, errb bytes.Buffer
	waittest.Succeeds(t, 5*time.Second, "explain showing the FAILOVER", func() error {
		out.Reset()
		errb.Reset()
		code := fanctl.Main([]string{"--url", s.ClientURL(), "--cluster", "lab", "explain", res.ID}, &out, &errb, "t")
		if code != 0 || !strings.Contains(out.String(), "FAILOVER") {
			return fmt.Errorf("exit %d: %s\n%s", code, errb.String(), out.String())
		}
		return nil
	})
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	want := []struct {
		indent int
		has    string
	}{
		{0, "command.result"}, {1, "command.claim_ip"}, {2, "FAILOVER n1->n2"}, {3, "health.transition"},
		{4, "probe"}, {3, "node.heartbeat"},
	}
	if len(lines) != len(want) {
		t.Fatalf("explain printed %d lines:\n%s", len(lines), out.String())
	}
	for i, w := range want {
		ind := len(lines[i]) - len(strings.TrimLeft(lines[i], " "))
		if ind != 2*w.indent || !strings.Contains(lines[i], w.has) {
			t.Fatalf("line %d %q: want indent %d and %q\n%s", i, lines[i], w.indent, w.has, out.String())
		}
	}
	if !strings.Contains(lines[4], "deadline exceeded") {
		t.Fatalf("probe evidence missing: %q", lines[4])
	}
	// The heartbeat came from the live stream. Once that no longer keeps it
	// (its max age passed; purged here), the chain still reaches the
	// transition and its probe evidence in the audit stream, and says what
	// the missing cause probably was.
	live, err := b.JS.Stream(ctx, bus.LiveStream)
	if err != nil {
		t.Fatal(err)
	}
	if err := live.Purge(ctx); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if code := fanctl.Main([]string{"--url", s.ClientURL(), "--cluster", "lab", "explain", res.ID}, &out, &errb, "t"); code != 0 {
		t.Fatalf("explain after the live stream forgot the heartbeat: exit %d: %s", code, errb.String())
	}
	after := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(after) != len(want) || !strings.Contains(after[3], "health.transition") || !strings.Contains(after[4], "deadline exceeded") ||
		!strings.Contains(after[5], "? "+hb.ID) || !strings.Contains(after[5], "live stream") {
		t.Fatalf("explain once the heartbeat expired:\n%s", out.String())
	}
	if code := fanctl.Main([]string{"--url", s.ClientURL(), "explain", "not-an-id"}, &out, &errb, "t"); code == 0 {
		t.Fatal("a bad id was accepted")
	}
}

func TestWindowsPrintsThePlan(t *testing.T) {
	s := bustest.Server(t)
	b := bustest.Connect(t, s, bus.Identity{Cluster: "lab", Service: "scheduler", Node: "ctl"})
	ctx := context.Background()
	var out, errb bytes.Buffer
	if code := fanctl.Main([]string{"--url", s.ClientURL(), "windows"}, &out, &errb, "t"); code != 0 || !strings.Contains(out.String(), "nothing fails back") {
		t.Fatalf("no plan: exit %d %q", code, out.String())
	}
	start := time.Now().Add(3 * time.Hour)
	plan := events.SchedulePlan{Cluster: "lab", UpdatedAt: time.Now(), UpdatedBy: "ctl", Groups: []events.GroupSchedule{{Group: "pbx",
		Windows: []events.PlannedWindow{{Window: "nightly", Start: start, End: start.Add(3 * time.Hour), TimeZone: "Europe/Berlin", Kind: "weekly"}}}}}
	v, _ := json.Marshal(plan)
	kv, err := b.StateKV(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, events.ScheduleKey("lab"), v); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if code := fanctl.Main([]string{"--url", s.ClientURL(), "--cluster", "lab", "windows"}, &out, &errb, "t"); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	for _, want := range []string{"pbx", "nightly", "Europe/Berlin", "opens in 3h0m"} {
		if !strings.Contains(out.String(), want) {
			t.Fatalf("windows lacks %q:\n%s", want, out.String())
		}
	}
}

// TestOperatorCommands checks fanctl's side of the request-reply: what it
// sends (verb, target, reason, who), how it reports an accepted and a
// refused action, and that it fails clearly when no arbiter answers.
func TestOperatorCommands(t *testing.T) {
	s := bustest.Server(t)
	b := bustest.Connect(t, s, bus.Identity{Cluster: "lab", Service: "arbiter", Node: "ctl"})
	got := make(chan events.OperatorRequest, 8)
	sub := standInArbiter(t, b, func(r events.OperatorRequest, subject string) events.OperatorReply {
		// The subject names the sender; the test checks the body agrees.
		if op, err := events.OperatorFromSubject("lab", subject); err != nil || op != r.Operator {
			r.Operator = "subject " + subject
		}
		got <- r
		return events.OperatorReply{Accepted: r.Node != "n9", Message: "ok", EventID: "0193a1b2-0000-7000-8000-000000000001", Epoch: 3}
	})
	// fanctl sends only names the cluster's status knows.
	putStatus(t, s, events.GroupStatus{Group: "pbx", Holder: "n1", UpdatedAt: time.Now(),
		Nodes: map[string]events.NodeStatus{"n1": {}, "n2": {}, "n9": {}}})
	cfgFile := filepath.Join(t.TempDir(), "fanctl.yaml")
	if err := os.WriteFile(cfgFile, []byte("url: "+s.ClientURL()+"\ncluster: lab\noperator: erin\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) (int, string) {
		var out, errb bytes.Buffer
		if len(args) > 0 && args[0] == "--config" {
			code := fanctl.Main(args, &out, &errb, "t")
			return code, out.String() + errb.String()
		}
		code := fanctl.Main(append([]string{"--url", s.ClientURL(), "--cluster", "lab"}, args...), &out, &errb, "t")
		return code, out.String() + errb.String()
	}
	cases := []struct {
		args []string
		want events.OperatorRequest
	}{
		{[]string{"--operator", "alice", "switchover", "--to", "n2", "--reason", "patching"}, events.OperatorRequest{Verb: events.OpSwitchover, Node: "n2", Reason: "patching", Operator: "alice"}},
		{[]string{"--operator", "bob", "failback", "--now", "--reason", "customer asked", "--group", "pbx"}, events.OperatorRequest{Verb: events.OpFailback, Group: "pbx", Reason: "customer asked", Operator: "bob"}},
		{[]string{"--operator", "carol", "maintenance", "on"}, events.OperatorRequest{Verb: events.OpMaintenanceOn, Operator: "carol"}},
		{[]string{"--operator", "carol", "maintenance", "off", "--group", "pbx"}, events.OperatorRequest{Verb: events.OpMaintenanceOff, Group: "pbx", Operator: "carol"}},
		{[]string{"--operator", "dave", "node", "standby", "n1", "--reason", "disk"}, events.OperatorRequest{Verb: events.OpNodeStandby, Node: "n1", Reason: "disk", Operator: "dave"}},
		{[]string{"--operator", "dave", "node", "active", "n1"}, events.OperatorRequest{Verb: events.OpNodeActive, Node: "n1", Operator: "dave"}},
		// --as is a comment; who asks is the operator.
		{[]string{"--operator", "alice", "switchover", "--to", "n2", "--as", "ceo@finance"}, events.OperatorRequest{Verb: events.OpSwitchover, Node: "n2", Operator: "alice", Comment: "ceo@finance"}},
		// Planned moves: the drain policy travels with the request.
		{[]string{"--operator", "alice", "switchover", "--to", "n2", "--within", "10m", "--force-after"},
			events.OperatorRequest{Verb: events.OpSwitchover, Node: "n2", Operator: "alice", Drain: events.DrainForceAfter, WithinMS: 600_000}},
		{[]string{"--operator", "alice", "switchover", "--to", "n2", "--now"}, events.OperatorRequest{Verb: events.OpSwitchover, Node: "n2", Operator: "alice", Drain: events.DrainNow}},
		{[]string{"--operator", "bob", "switchover", "--cancel", "--group", "pbx"}, events.OperatorRequest{Verb: events.OpSwitchover, Group: "pbx", Operator: "bob", Cancel: true}},
		{[]string{"--operator", "dave", "node", "standby", "n1", "--within", "45m"}, events.OperatorRequest{Verb: events.OpNodeStandby, Node: "n1", Operator: "dave", WithinMS: 2_700_000}},
		{[]string{"--operator", "dave", "node", "standby", "n1", "--now"}, events.OperatorRequest{Verb: events.OpNodeStandby, Node: "n1", Operator: "dave", Drain: events.DrainNow}},
		// The configuration file names the operator (and can carry the cluster and bus).
		{[]string{"--config", cfgFile, "maintenance", "on"}, events.OperatorRequest{Verb: events.OpMaintenanceOn, Operator: "erin"}},
	}
	for _, c := range cases {
		code, out := run(c.args...)
		if code != 0 || !strings.Contains(out, "accepted") {
			t.Fatalf("%v: exit %d %s", c.args, code, out)
		}
		if r := <-got; r != c.want {
			t.Fatalf("%v sent %+v, want %+v", c.args, r, c.want)
		}
	}
	if code, out := run("--operator", "x", "switchover", "--to", "n9"); code != 3 || !strings.Contains(out, "REFUSED") {
		t.Fatalf("refused action: exit %d %s", code, out)
	}
	<-got
	for _, bad := range [][]string{{"failback", "--reason", "x"}, {"failback", "--now"}, {"maintenance", "maybe"}, {"node", "standby"}, {"switchover"},
		{"switchover", "--to", "n2", "--now", "--within", "5m"}, {"switchover", "--to", "n2", "--now", "--force-after"},
		{"switchover", "--to", "n2", "--within", "25h"}, {"switchover", "--to", "n2", "--within", "10ms"}, {"switchover", "--cancel", "--to", "n2"},
		{"node", "active", "n1", "--now"}, {"failback", "--now", "--reason", "x", "--within", "5m"},
		{"--operator", "alice@ops1", "maintenance", "on"}} { // an operator name is one subject token
		if code, _ := run(append([]string{"--operator", "alice"}, bad...)...); code == 0 {
			t.Errorf("%v: exit 0", bad)
		}
	}
	// Nothing is sent without an operator identity, nor with a reason the
	// arbiter would refuse.
	if code, out := run("maintenance", "on", "--as", "alice"); code == 0 || !strings.Contains(out, "no operator identity") {
		t.Fatalf("no operator: exit %d %s", code, out)
	}
	if code, out := run("--operator", "alice", "maintenance", "on", "--reason", strings.Repeat("x", 70000)); code == 0 || !strings.Contains(out, "at most 500") {
		t.Fatalf("70,000-character reason: exit %d %s", code, out)
	}
	select {
	case r := <-got:
		t.Fatalf("sent %+v", r)
	default:
	}
	sub.Unsubscribe()
	if code, out := run("--operator", "alice", "maintenance", "on", "--wait", "500ms"); code == 0 || !strings.Contains(out, "no arbiter") {
		t.Fatalf("nobody listening: exit %d %s", code, out)
	}
}
