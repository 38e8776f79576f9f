package fanctl_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/fanpbx/fan/cmd/internal/fanctl"
	"github.com/fanpbx/fan/lab/prereq"
	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/bus/bustest"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

func run(args ...string) (code int, stdout, stderr string) {
	var out, errb bytes.Buffer
	code = fanctl.Main(args, &out, &errb, "v1.2.3")
	return code, out.String(), errb.String()
}

func TestHelpAndVersion(t *testing.T) {
	fanctl.Commit = "0123456789ab"
	defer func() { fanctl.Commit = "" }()
	code, out, errOut := run("help")
	if code != 0 || !strings.Contains(out, "commands:") || !strings.Contains(out, "completion bash|zsh") || errOut != "" {
		t.Fatalf("help: exit %d\nstdout %q\nstderr %q", code, out, errOut)
	}
	if code, out, _ := run("help", "status"); code != 0 || !strings.Contains(out, "-json") {
		t.Fatalf("help status: exit %d %q", code, out)
	}
	for _, args := range [][]string{{"--version"}, {"version"}, {"-version"}} {
		code, out, _ := run(args...)
		if code != 0 || !strings.HasPrefix(out, "fanctl v1.2.3 (commit 0123456789ab, go") {
			t.Fatalf("%v: exit %d %q", args, code, out)
		}
	}
	if code, _, errOut := run("bogus"); code != 2 || strings.Count(errOut, "bogus") != 1 {
		t.Fatalf("unknown command: exit %d %q", code, errOut)
	}
}

// TestFlagsAfterTheCommand: fanctl's own flags work after the command, and a
// flag nobody knows is reported once, not twice.
func TestFlagsAfterTheCommand(t *testing.T) {
	s := bustest.Server(t)
	putStatus(t, s, events.GroupStatus{Group: "pbx", Holder: "n1", Epoch: 2, UpdatedAt: time.Now(),
		Nodes: map[string]events.NodeStatus{"n1": {Health: events.HealthUp}}})
	for _, args := range [][]string{
		{"status", "--url", s.ClientURL(), "--cluster", "lab"},
		{"status", "--url=" + s.ClientURL(), "--json", "--cluster=lab"},
		{"--cluster", "lab", "status", "--timeout", "5s", "--url", s.ClientURL()},
	} {
		code, out, errOut := run(args...)
		if code != 0 || !strings.Contains(out, "n1") {
			t.Fatalf("%v: exit %d\n%s%s", args, code, out, errOut)
		}
	}
	code, _, errOut := run("status", "--url", s.ClientURL(), "--bogus")
	if code != 2 || strings.Count(errOut, "-bogus") != 1 {
		t.Fatalf("unknown flag: exit %d, reported %d times:\n%s", code, strings.Count(errOut, "-bogus"), errOut)
	}
}

// TestRefusedPortFailsAtOnce: a server that refuses the port is reported
// right away, not after --timeout.
func TestRefusedPortFailsAtOnce(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // nothing listens there now: connections are refused
	done := make(chan struct{})
	var code int
	var errOut string
	go func() {
		defer close(done)
		code, _, errOut = run("--url", "nats://"+addr, "--timeout", "10m", "status")
	}()
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("fanctl still waiting a minute after the port refused (it should fail at once, not after --timeout 10m)")
	}
	if code != 1 || !strings.Contains(errOut, "bus connect nats://"+addr) || !strings.Contains(errOut, "connection refused") ||
		strings.Count(errOut, "fanctl:") != 1 {
		t.Fatalf("exit %d: %q", code, errOut)
	}
}

func TestEventsPrintDateAndZone(t *testing.T) {
	s := bustest.Server(t)
	b := bustest.Connect(t, s, bus.Identity{Cluster: "lab", Service: "arbiter", Node: "ctl"})
	env, err := b.Emit(context.Background(), events.ArbiterDecision{Group: "pbx", Action: events.ActionHold,
		Reason: "no eligible node: n1 never heard, n2 never heard", CausedBy: []string{"0193a1b2-0000-7000-8000-000000000001"}})
	if err != nil {
		t.Fatal(err)
	}
	code, out, errOut := run("--url", s.ClientURL(), "events", "--since", "all")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	first, _, _ := strings.Cut(strings.TrimSpace(out), " ")
	at, err := time.Parse(time.RFC3339, first)
	if err != nil {
		t.Fatalf("the line does not start with an RFC 3339 time: %q (%v)", out, err)
	}
	if !at.Equal(env.Time.Truncate(time.Millisecond)) {
		t.Fatalf("printed %s, the event is of %s", at, env.Time)
	}
	// A hold with nobody moving says so instead of "pbx HOLD ->:".
	if !strings.Contains(out, "pbx HOLD (no holder): no eligible node") || strings.Contains(out, "->:") {
		t.Fatalf("hold printed as %q", out)
	}
}

func TestWindowsAbsoluteAndHuman(t *testing.T) {
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Skip("no time zone database:", err)
	}
	now := time.Date(2026, 12, 1, 9, 25, 0, 0, time.UTC)
	start := now.Add(112*time.Hour + 35*time.Minute)
	openEnd := now.Add(80 * time.Minute)
	plans := []events.SchedulePlan{{Cluster: "lab", UpdatedAt: now.Add(-3 * time.Second), UpdatedBy: "ctl", Groups: []events.GroupSchedule{
		{Group: "pbx",
			Open:    &events.PlannedWindow{Window: "nightly", Start: now.Add(-time.Hour), End: openEnd, TimeZone: "Europe/Berlin"},
			Windows: []events.PlannedWindow{{Window: "nightly", Start: start, End: start.Add(3 * time.Hour), TimeZone: "Europe/Berlin"}}},
		{Group: "fax"},
	}}}
	var out bytes.Buffer
	if err := fanctl.PrintWindows(&out, plans, now); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"opens in 4d16h35m", "open, closes in 1h20m",
		start.In(berlin).Format("Mon 2006-01-02 15:04 -07:00"),
		"fax", "never fails back automatically", "plan written 3s ago",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("windows lacks %q:\n%s", want, out.String())
		}
	}
	if strings.Contains(out.String(), "112h") {
		t.Errorf("windows prints hours past a day:\n%s", out.String())
	}
}

// TestStatusLastHeardAndHealthSince: LAST HEARD is when the bus last stored
// the node's heartbeat, not when the arbiter last rewrote the record; HEALTH
// SINCE is the record's; a situation from before a node was heard says so.
func TestStatusLastHeardAndHealthSince(t *testing.T) {
	s := bustest.Server(t)
	n2 := bustest.Connect(t, s, bus.Identity{Cluster: "lab", Service: "prober", Node: "n2"})
	now := time.Now()
	healthSince := now.Add(-90 * time.Minute).Truncate(time.Second)
	putStatus(t, s, events.GroupStatus{Group: "pbx", Holder: "n1", Epoch: 4, UpdatedAt: now, Situation: "failback waits: n2 never heard",
		Nodes: map[string]events.NodeStatus{
			"n1": {Health: events.HealthUp, HealthSince: healthSince, Priority: 1},
			// The record's own heartbeat time is an hour old.
			"n2": {Health: events.HealthUp, Priority: 0, LastHeartbeat: now.Add(-time.Hour)},
		}})
	if _, err := n2.Emit(context.Background(), events.NodeHeartbeat{Node: "n2", IntervalMS: 1000, Version: "t"}); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := run("--url", s.ClientURL(), "status", "--cluster", "lab")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	row := func(node string) string {
		_, nodes, _ := strings.Cut(out, "LAST HEARD")
		for _, l := range strings.Split(nodes, "\n") {
			if f := strings.Fields(l); len(f) > 2 && f[0] == "pbx" && f[1] == node {
				return l
			}
		}
		t.Fatalf("no row for %s:\n%s", node, out)
		return ""
	}
	if r := row("n2"); strings.Contains(r, "1h0m") || !regexp.MustCompile(`\d+(\.\d+)?(ms|s) ago`).MatchString(r) {
		t.Fatalf("n2's LAST HEARD is not its stored heartbeat:\n%s", out)
	}
	if r := row("n1"); !strings.Contains(r, "never") || !strings.Contains(r, healthSince.Local().Format(time.RFC3339)) {
		t.Fatalf("n1: want never heard and HEALTH SINCE %s:\n%s", healthSince.Local().Format(time.RFC3339), out)
	}
	if !strings.Contains(out, "n2 never heard (as of the arbiter's last decision; since then n2 heard") {
		t.Fatalf("the situation contradicts the table without saying so:\n%s", out)
	}
}

func TestExplainJSON(t *testing.T) {
	s := bustest.Server(t)
	b := bustest.Connect(t, s, bus.Identity{Cluster: "lab", Service: "prober", Node: "n1"})
	ctx := context.Background()
	down := emitDown(t, b)
	dec, err := b.Emit(ctx, events.ArbiterDecision{Group: "pbx", Action: events.ActionFailover, From: "n1", To: "n2",
		Reason: "holder down", CausedBy: []string{down.ID, "0193a1b2-0000-7000-8000-00000000dead"}}, events.CausedBy(down))
	if err != nil {
		t.Fatal(err)
	}
	code, out, errOut := run("--url", s.ClientURL(), "--cluster", "lab", "explain", dec.ID, "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var chain []struct {
		Depth int              `json:"depth"`
		ID    string           `json:"id"`
		Event *events.Envelope `json:"event"`
	}
	if err := json.Unmarshal([]byte(out), &chain); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, out)
	}
	if len(chain) != 3 || chain[0].ID != dec.ID || chain[0].Depth != 0 || chain[1].ID != down.ID || chain[1].Depth != 1 ||
		chain[1].Event == nil || chain[1].Event.Type != events.TypeHealthTransition || chain[2].Event != nil {
		t.Fatalf("chain:\n%s", out)
	}
	if _, p, err := events.Decode(mustJSON(t, chain[1].Event)); err != nil || p.(*events.HealthTransition).Evidence[0].Error != "timeout" {
		t.Fatalf("the transition's payload (with its probe evidence) is not in the JSON: %v", err)
	}
}

func TestActionJSON(t *testing.T) {
	s := bustest.Server(t)
	b := bustest.Connect(t, s, bus.Identity{Cluster: "lab", Service: "arbiter", Node: "ctl"})
	// fanctl sends only names the cluster's status knows.
	putStatus(t, s, events.GroupStatus{Group: "pbx", Holder: "n1", UpdatedAt: time.Now(),
		Nodes: map[string]events.NodeStatus{"n1": {}, "n2": {}, "n9": {}}})
	standInArbiter(t, b, func(r events.OperatorRequest, _ string) events.OperatorReply {
		return events.OperatorReply{Accepted: r.Node != "n9", Message: "moving", EventID: "0193a1b2-0000-7000-8000-000000000001",
			Decisions: []string{"0193a1b2-0000-7000-8000-000000000002"}, Leader: "ctl", Epoch: 3}
	})
	for node, wantCode := range map[string]int{"n2": 0, "n9": 3} {
		code, out, errOut := run("switchover", "--to", node, "--json", "--url", s.ClientURL(), "--cluster", "lab", "--operator", "alice")
		var rep events.OperatorReply
		if err := json.Unmarshal([]byte(out), &rep); err != nil || code != wantCode || rep.Accepted != (wantCode == 0) || rep.Epoch != 3 || len(rep.Decisions) != 1 {
			t.Fatalf("--to %s: exit %d (%v)\n%s%s", node, code, err, out, errOut)
		}
	}
}

// TestCompletion runs the generated scripts in the real shells: bash
// completes commands, a command's flags and words; zsh parses its script.
// Every command's flags in the script are the ones its -h lists (on
// standard output).
func TestCompletion(t *testing.T) {
	for cmd, want := range fanctl.CommandFlags() {
		_, helpOut, _ := run(cmd, "-h")
		var got []string
		for _, m := range regexp.MustCompile(`(?m)^  -([a-z-]+)`).FindAllStringSubmatch(helpOut, -1) {
			got = append(got, m[1])
		}
		sort.Strings(got)
		sort.Strings(want)
		if strings.Join(got, " ") != strings.Join(want, " ") {
			t.Errorf("%s: completion offers %v, -h lists %v", cmd, want, got)
		}
	}
	code, script, errOut := run("completion", "bash")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "fanctl.bash")
	if err := os.WriteFile(path, []byte(script), 0o600); err != nil {
		t.Fatal(err)
	}
	complete := func(words ...string) []string {
		t.Helper()
		var quoted []string
		for _, w := range words {
			quoted = append(quoted, "'"+w+"'")
		}
		prog := "source " + path + "; COMP_WORDS=(" + strings.Join(quoted, " ") + "); COMP_CWORD=" +
			string(rune('0'+len(words)-1)) + "; _fanctl; printf '%s\\n' \"${COMPREPLY[@]}\""
		out, err := exec.Command("bash", "-c", prog).CombinedOutput()
		if err != nil {
			t.Fatalf("bash: %v\n%s", err, out)
		}
		return strings.Fields(string(out))
	}
	has := func(list []string, w string) bool {
		for _, x := range list {
			if x == w {
				return true
			}
		}
		return false
	}
	if got := complete("fanctl", "sta"); len(got) != 1 || got[0] != "status" {
		t.Errorf("fanctl sta<TAB> = %v", got)
	}
	if got := complete("fanctl", "--cluster", "lab", "maintenance", ""); !has(got, "on") || !has(got, "off") || !has(got, "--group") || has(got, "status") {
		t.Errorf("fanctl --cluster lab maintenance <TAB> = %v", got)
	}
	if got := complete("fanctl", "explain", "--j"); len(got) != 1 || got[0] != "--json" {
		t.Errorf("fanctl explain --j<TAB> = %v", got)
	}
	if code, _, _ := run("completion", "fish"); code != 2 {
		t.Errorf("completion fish: exit %d", code)
	}
	code, script, _ = run("completion", "zsh")
	if code != 0 || !strings.HasPrefix(script, "#compdef fanctl") {
		t.Fatalf("zsh: exit %d %q", code, script)
	}
	zsh, err := exec.LookPath("zsh")
	if err != nil {
		prereq.SkipOrFail(t, "zsh not installed (Debian package zsh)")
	}
	zpath := filepath.Join(dir, "_fanctl")
	if err := os.WriteFile(zpath, []byte(script), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(zsh, "-n", zpath).CombinedOutput(); err != nil {
		t.Fatalf("zsh -n: %v\n%s", err, out)
	}
}

func putStatus(t *testing.T, s *server.Server, g events.GroupStatus) {
	t.Helper()
	b := bustest.Connect(t, s, bus.Identity{Cluster: "lab", Service: "arbiter", Node: "ctl"})
	ctx := context.Background()
	kv, err := b.StateKV(ctx)
	if err != nil {
		t.Fatal(err)
	}
	v, _ := json.Marshal(g)
	if _, err := kv.Put(ctx, events.GroupStatusKey("lab", g.Group), v); err != nil {
		t.Fatal(err)
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// emitDown stores n1's pbx check going down, with its probe evidence.
func emitDown(t *testing.T, b *bus.Bus) events.Envelope {
	t.Helper()
	down, err := b.Emit(context.Background(), events.HealthTransition{Check: "pbx", TargetNode: "n1", Role: events.RoleSelf, From: events.HealthUp,
		To: events.HealthDown, Reason: "3 consecutive failures", Consecutive: 3, Rise: 2, Fall: 3,
		Evidence: []events.Evidence{{At: time.Now(), Error: "timeout", ErrorClass: events.ErrorTimeout}}})
	if err != nil {
		t.Fatal(err)
	}
	return down
}

// standInArbiter answers every operator request of cluster lab with what
// answer returns (given the request and the subject it came on), until the
// test ends or the subscription is dropped.
func standInArbiter(t *testing.T, b *bus.Bus, answer func(events.OperatorRequest, string) events.OperatorReply) *nats.Subscription {
	t.Helper()
	sub, err := b.NC.Subscribe(events.AllOperatorRequests("lab"), func(m *nats.Msg) {
		var r events.OperatorRequest
		_ = json.Unmarshal(m.Data, &r)
		data, _ := json.Marshal(answer(r, m.Subject))
		_ = m.Respond(data)
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	// Subscribe returns before the server has the interest; fanctl's first
	// request, on another connection, would find no responder (seen on a loaded machine).
	if err := b.NC.Flush(); err != nil {
		t.Fatal(err)
	}
	return sub
}
