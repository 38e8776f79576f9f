package fanctl_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fanpbx/fan/cmd/internal/fanctl"
	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/bus/bustest"
	"github.com/nats-io/nats-server/v2/server"
)

// TestUsageErrorsAreOneLine: what an operator scripting fanctl gets for a
// mistake in the command line: exit 2, nothing on standard output, and
// one line on standard error naming the flag or argument (never the whole
// usage). Nothing here reaches a bus (the URL refuses): each is refused
// before connecting.
func TestUsageErrorsAreOneLine(t *testing.T) {
	base := []string{"--url", "nats://127.0.0.1:1", "--timeout", "200ms", "--cluster", "lab", "--operator", "alice"}
	cases := []struct {
		args  []string
		names []string
	}{
		{[]string{"status", "--url"}, []string{"--url"}},
		{[]string{"status", "--url", "--json"}, []string{"--url"}},
		{[]string{"--timeout"}, []string{"--timeout"}},
		{[]string{"status", "--timeout", "soon"}, []string{"-timeout", "soon"}},
		{nil, []string{"no command"}},
		{[]string{"stauts"}, []string{`"stauts"`, "did you mean status?"}},
		{[]string{"status", "--bogus"}, []string{"-bogus"}},
		{[]string{"--cluster", "a.b", "status"}, []string{"--cluster", "a.b"}},
		{[]string{"events", "--since"}, []string{"-since"}},
		{[]string{"events", "--since", "yesterday"}, []string{"--since", "yesterday"}},
		{[]string{"events", "--type", "health.transtion"}, []string{"--type", "health.transtion", "did you mean health.transition?"}},
		{[]string{"events", "--type", "decision"}, []string{"did you mean arbiter.decision?"}},
		{[]string{"events", "--type", "node.heartbeat"}, []string{"--type node.heartbeat", "add --live"}},
		{[]string{"events", "--live", "--type", "arbiter.decision"}, []string{"--type arbiter.decision", "drop --live"}},
		{[]string{"events", "health.transition"}, []string{`"health.transition"`, "takes no arguments"}},
		{[]string{"status", "extra"}, []string{`"extra"`}},
		{[]string{"windows", "extra"}, []string{`"extra"`}},
		{[]string{"serve", "extra"}, []string{`"extra"`}},
		{[]string{"provision", "extra"}, []string{`"extra"`}},
		{[]string{"nats-config", "extra"}, []string{`"extra"`}},
		{[]string{"replay"}, []string{"--arbiter-config"}},
		{[]string{"replay", "--arbiter-config", "arbiter.yaml", "extra"}, []string{`"extra"`}},
		{[]string{"explain"}, []string{"missing EVENT_ID"}},
		{[]string{"explain", "not-an-id"}, []string{"EVENT_ID", "not-an-id"}},
		{[]string{"explain", "0193a1b2-0000-7000-8000-000000000001", "extra"}, []string{`"extra"`}},
		{[]string{"switchover"}, []string{"--to"}},
		{[]string{"switchover", "n2"}, []string{`"n2"`, "takes no arguments"}},
		{[]string{"switchover", "--to", "n2", "--within", "25h"}, []string{"--within"}},
		{[]string{"switchover", "--to", "n2", "--now", "--force-after"}, []string{"--now"}},
		{[]string{"switchover", "--cancel", "--to", "n2"}, []string{"--cancel"}},
		{[]string{"failback", "--reason", "x"}, []string{"--now"}},
		{[]string{"failback", "--now", "--reason", "x", "extra"}, []string{`"extra"`}},
		{[]string{"maintenance"}, []string{"missing on|off"}},
		{[]string{"maintenance", "maybe"}, []string{`"maybe"`, "on or off"}},
		{[]string{"maintenance", "on", "extra"}, []string{`"extra"`}},
		{[]string{"maintenance", "on", "--reason", strings.Repeat("x", 600)}, []string{"reason", "500"}},
		{[]string{"node", "standby"}, []string{"missing NODE"}},
		{[]string{"node", "reboot", "n1"}, []string{`"reboot"`}},
		{[]string{"node", "standby", "n1", "extra"}, []string{`"extra"`}},
		{[]string{"node", "active", "n1", "--now"}, []string{"--now"}},
		{[]string{"--operator", "alice@ops1", "maintenance", "on"}, []string{"operator", "alice@ops1"}},
		{[]string{"version", "extra"}, []string{`"extra"`}},
		{[]string{"completion"}, []string{"missing bash|zsh"}},
		{[]string{"completion", "fish"}, []string{`"fish"`}},
		{[]string{"completion", "bash", "extra"}, []string{`"extra"`}},
		{[]string{"help", "stauts"}, []string{`"stauts"`, "did you mean status?"}},
		{[]string{"help", "status", "extra"}, []string{`"extra"`}},
	}
	for _, c := range cases {
		code, out, errOut := run(append(slices.Clone(base), c.args...)...)
		if code != 2 || out != "" || strings.Count(errOut, "\n") != 1 || !strings.HasPrefix(errOut, "fanctl: ") ||
			strings.Contains(errOut, "usage:") || strings.Contains(errOut, "flags:") {
			t.Errorf("%q: exit %d, stdout %q, stderr %q: want exit 2 and one line on stderr", c.args, code, out, errOut)
			continue
		}
		for _, n := range c.names {
			if !strings.Contains(errOut, n) {
				t.Errorf("%q: %q does not say %q", c.args, errOut, n)
			}
		}
	}
	// Without an operator identity nothing can be sent: also the command line's.
	if code, _, errOut := run("--url", "nats://127.0.0.1:1", "--cluster", "lab", "maintenance", "on"); code != 2 || !strings.Contains(errOut, "no operator identity") {
		t.Errorf("no operator: exit %d %q", code, errOut)
	}
}

// TestHelpOnStdout: -h, --help and help CMD are asked for: standard output,
// exit 0, the command's usage line with its arguments, its flags and at
// least one example, for every command fanctl has.
func TestHelpOnStdout(t *testing.T) {
	specs := fanctl.Specs()
	flags := fanctl.CommandFlags()
	for _, cmd := range fanctl.Commands() {
		for _, args := range [][]string{{cmd, "-h"}, {cmd, "--help"}, {"help", cmd}, {"--cluster", "lab", cmd, "--help"}} {
			code, out, errOut := run(args...)
			if code != 0 || errOut != "" {
				t.Errorf("%q: exit %d, stderr %q", args, code, errOut)
				continue
			}
			if !strings.HasPrefix(out, "usage: fanctl [global flags] "+cmd) {
				t.Errorf("%q does not start with its usage line:\n%s", args, out)
			}
			_, examples, ok := strings.Cut(out, "\nexamples:\n")
			if !ok || !regexp.MustCompile(`(?m)^  .*fanctl`).MatchString(examples) {
				t.Errorf("%q shows no example:\n%s", args, out)
			}
			for _, f := range flags[cmd] {
				if !strings.Contains(out, "\n  -"+f+" ") && !strings.Contains(out, "\n  -"+f+"\n") {
					t.Errorf("%q does not list -%s:\n%s", args, f, out)
				}
			}
		}
		s, ok := specs[cmd]
		if !ok || s.Summary == "" || len(s.Examples) == 0 {
			t.Errorf("%s has no help registered (registerCommand with a summary and an example; see help.go)", cmd)
			continue
		}
		// Examples use only flags the command or fanctl has.
		for _, e := range s.Examples {
			for _, m := range regexp.MustCompile(`(?:^| )--([a-z-]+)`).FindAllStringSubmatch(e, -1) {
				if !slices.Contains(flags[cmd], m[1]) && !slices.Contains(globalFlags(t), m[1]) {
					t.Errorf("%s: example %q uses --%s, which neither %s nor fanctl has", cmd, e, m[1], cmd)
				}
			}
		}
	}
	for _, args := range [][]string{{"-h"}, {"--help"}, {"help"}} {
		code, out, errOut := run(args...)
		if code != 0 || errOut != "" || !strings.Contains(out, "commands:") || !strings.Contains(out, "exit status") {
			t.Errorf("%q: exit %d, stderr %q:\n%s", args, code, errOut, out)
		}
		for _, cmd := range fanctl.Commands() {
			if !strings.Contains(out, "\n  "+cmd) {
				t.Errorf("%q does not list %s", args, cmd)
			}
		}
	}
}

// globalFlags are fanctl's own flags, as fanctl help lists them.
func globalFlags(t *testing.T) []string {
	t.Helper()
	_, out, _ := run("help")
	_, flags, _ := strings.Cut(out, "global flags:\n")
	var names []string
	for _, m := range regexp.MustCompile(`(?m)^  -([a-z-]+)`).FindAllStringSubmatch(flags, -1) {
		names = append(names, m[1])
	}
	if len(names) < 10 {
		t.Fatalf("fanctl help lists %d global flags:\n%s", len(names), out)
	}
	return names
}

// TestFileFlagsComplete: every flag whose help names a file or a directory
// completes files (or directories), and every flag a command's help data
// gives a kind of value exists.
func TestFileFlagsComplete(t *testing.T) {
	kinds := fanctl.FlagValueKinds()
	files := regexp.MustCompile(`\b(file|directory)\b`)
	for cmd, flags := range kinds {
		for name, kv := range flags {
			kind, usage := kv[0], kv[1]
			if files.MatchString(usage) && kind != "file" && kind != "dir" {
				t.Errorf("%s --%s (%q) completes %q, not files: mark it kindFile or kindDir in its commandSpec.Values", cmd, name, usage, kind)
			}
		}
	}
	for cmd, s := range fanctl.Specs() {
		for _, f := range s.Values {
			if _, ok := kinds[cmd][f]; !ok {
				t.Errorf("%s: its help data gives --%s a kind of value, but the command has no such flag", cmd, f)
			}
		}
	}
	if len(kinds["nats-config"]) == 0 || kinds["nats-config"]["out"][0] != "dir" || kinds["replay"]["arbiter-config"][0] != "file" {
		t.Errorf("nats-config --out and replay --arbiter-config: %v %v", kinds["nats-config"], kinds["replay"])
	}
}

// TestJSONWhenEmpty: --json prints JSON with nothing to show: [] for
// status and windows, no line for events (one envelope a line).
func TestJSONWhenEmpty(t *testing.T) {
	s := bustest.Server(t)
	bustest.Connect(t, s, bus.Identity{Cluster: "lab", Service: "arbiter", Node: "ctl"})
	for _, args := range [][]string{{"status", "--json"}, {"--cluster", "lab", "status", "--json"}, {"windows", "--json"}, {"--cluster", "lab", "windows", "--json"}} {
		code, out, errOut := run(append([]string{"--url", s.ClientURL()}, args...)...)
		var v []any
		if err := json.Unmarshal([]byte(out), &v); code != 0 || err != nil || v == nil || len(v) != 0 {
			t.Errorf("%q: exit %d (%v), stdout %q, stderr %q: want []", args, code, err, out, errOut)
		}
	}
	if code, out, errOut := run("--url", s.ClientURL(), "events", "--since", "all", "--json"); code != 0 || out != "" {
		t.Errorf("events --json on an empty trail: exit %d %q %q", code, out, errOut)
	}
}

// finishes runs fanctl and fails the test if it is still running after a
// minute, however long its --timeout.
func finishes(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	type result struct {
		code     int
		out, err string
	}
	done := make(chan result, 1)
	go func() {
		code, out, errOut := run(args...)
		done <- result{code, out, errOut}
	}()
	select {
	case r := <-done:
		return r.code, r.out, r.err
	case <-time.After(time.Minute):
		t.Fatalf("%q still running after a minute", args)
		return 0, "", ""
	}
}

// TestUnprovisionedBus: a bus without fan's streams (nobody ran provision)
// fails every command that reads it at once, saying what to do, instead
// of waiting for a stream (events used to hang past --timeout).
func TestUnprovisionedBus(t *testing.T) {
	s := bustest.Server(t)
	cfg := filepath.Join(t.TempDir(), "arbiter.yaml")
	if err := os.WriteFile(cfg, []byte("cluster: lab\nnode: ctl\nbus:\n  url: "+s.ClientURL()+
		"\ngroups:\n  - name: pbx\n    addresses: [198.51.100.10/24]\n    nodes: [n1, n2]\n    health_check: pbx\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	base := []string{"--url", s.ClientURL(), "--timeout", "10m", "--cluster", "lab", "--operator", "alice"}
	for _, args := range [][]string{
		{"events"}, {"events", "--live"}, {"events", "--follow"}, {"status"}, {"status", "--json"}, {"windows"},
		{"explain", "0193a1b2-0000-7000-8000-000000000001"}, {"replay", "--arbiter-config", cfg},
		{"switchover", "--to", "n1"}, {"node", "standby", "n1"},
	} {
		code, out, errOut := finishes(t, append(slices.Clone(base), args...)...)
		if code != 1 || out != "" || !strings.Contains(errOut, "not provisioned") || !strings.Contains(errOut, "fanctl provision") ||
			!strings.Contains(errOut, "admin") {
			t.Errorf("%q on an unprovisioned bus: exit %d, stdout %q, stderr %q", args, code, out, errOut)
		}
	}
	// Completion asks the bus for names: nothing, at once.
	if code, out, _ := finishes(t, append(slices.Clone(base), "__complete", "node")...); code == 0 || out != "" {
		t.Errorf("__complete node on an unprovisioned bus: exit %d %q", code, out)
	}
}

// TestTimeoutBoundsTheCommand: a server that takes the connection and
// never answers fanctl's reads (here its credentials may not create the
// consumers and gets they need, so the requests go unanswered) does not
// keep fanctl past --timeout: connect plus reads are bounded as a whole.
func TestTimeoutBoundsTheCommand(t *testing.T) {
	allow := func(subjects ...string) *server.SubjectPermission { return &server.SubjectPermission{Allow: subjects} }
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, JetStream: true, StoreDir: t.TempDir(),
		NoLog: true, NoSigs: true,
		Users: []*server.User{
			{Username: "admin", Password: "admin"},
			// Enough to connect and see that the streams exist, nothing to read them.
			{Username: "mute", Password: "mute", Permissions: &server.Permissions{
				Publish:   allow("$JS.API.INFO", "$JS.API.STREAM.INFO.>", "_INBOX.>"),
				Subscribe: allow(">")}},
		}})
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats server not ready")
	}
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	addr := s.Addr().String()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	admin, err := bus.Connect(ctx, bus.Config{URL: "nats://admin:admin@" + addr}, bus.Identity{Cluster: "lab", Service: "fanctl", Node: "t"},
		slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	if err := admin.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Emit(ctx, events.ServiceAnnounce{Service: "arbiter", Node: "ctl", Version: "t", State: events.ServiceStarted}); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"events", "--since", "all"}, {"status"}, {"windows"}, {"explain", "0193a1b2-0000-7000-8000-000000000001"}} {
		start := time.Now()
		code, out, errOut := finishes(t, append([]string{"--url", "nats://mute:mute@" + addr, "--timeout", "1s"}, args...)...)
		if code != 1 || !strings.Contains(errOut, "--timeout 1s") {
			t.Errorf("%q with reads nobody answers: exit %d after %v, stdout %q, stderr %q", args, code, time.Since(start), out, errOut)
		}
	}
}

// TestNamesAreChecked: --group, --to and NODE must name what the cluster's
// status records hold; a typo is refused with the nearest name before
// anything is sent. With no status at all the names cannot be checked and
// nothing is sent either.
func TestNamesAreChecked(t *testing.T) {
	s := bustest.Server(t)
	b := bustest.Connect(t, s, bus.Identity{Cluster: "lab", Service: "arbiter", Node: "ctl"})
	sent := make(chan events.OperatorRequest, 8)
	standInArbiter(t, b, func(r events.OperatorRequest, _ string) events.OperatorReply {
		sent <- r
		return events.OperatorReply{Accepted: true, Message: "ok"}
	})
	action := func(args ...string) (int, string) {
		code, out, errOut := run(append([]string{"--url", s.ClientURL(), "--cluster", "lab", "--operator", "alice"}, args...)...)
		return code, out + errOut
	}
	if code, out := action("node", "standby", "n1"); code != 1 || !strings.Contains(out, "no group status") {
		t.Errorf("no status yet: exit %d %s", code, out)
	}
	putStatus(t, s, events.GroupStatus{Group: "pbx", Holder: "n1", UpdatedAt: time.Now(),
		Nodes: map[string]events.NodeStatus{"n1": {}, "n2": {}}})
	putStatus(t, s, events.GroupStatus{Group: "fax", Holder: "n3", UpdatedAt: time.Now(),
		Nodes: map[string]events.NodeStatus{"n3": {}, "n4": {}}})
	for _, c := range []struct {
		args []string
		says []string
	}{
		{[]string{"switchover", "--to", "n5"}, []string{`--to "n5"`, "cluster lab has no such node", "(n1, n2, n3, n4)"}},
		{[]string{"switchover", "--to", "n3", "--group", "pbx"}, []string{`--to "n3"`, "group pbx has no such node", "(n1, n2)"}},
		{[]string{"switchover", "--to", "n2", "--group", "pbxx"}, []string{`--group "pbxx"`, "did you mean pbx?", "(fax, pbx)"}},
		{[]string{"switchover", "--cancel", "--group", "pdx"}, []string{`--group "pdx"`, "did you mean pbx?"}},
		{[]string{"failback", "--now", "--reason", "x", "--group", "fox"}, []string{`--group "fox"`, "did you mean fax?"}},
		{[]string{"maintenance", "on", "--group", "voip"}, []string{`--group "voip"`, "(fax, pbx)"}},
		{[]string{"node", "standby", "n11"}, []string{`NODE "n11"`, "did you mean n1?"}},
		{[]string{"node", "active", "m2"}, []string{`NODE "m2"`, "did you mean n2?"}},
	} {
		code, out := action(c.args...)
		if code != 2 || strings.Count(out, "\n") != 1 {
			t.Errorf("%q: exit %d %q: want 2 and one line", c.args, code, out)
		}
		for _, w := range c.says {
			if !strings.Contains(out, w) {
				t.Errorf("%q: %q does not say %q", c.args, out, w)
			}
		}
	}
	select {
	case r := <-sent:
		t.Fatalf("a refused name was sent: %+v", r)
	default:
	}
	for _, args := range [][]string{{"switchover", "--to", "n2", "--group", "pbx"}, {"node", "standby", "n4"}, {"maintenance", "on", "--group", "fax"}} {
		if code, out := action(args...); code != 0 || !strings.Contains(out, "accepted") {
			t.Errorf("%q: exit %d %s", args, code, out)
		}
		<-sent
	}
}

// TestCompleteCommand: the hidden command the completion scripts call
// prints names one a line; nothing on a bus it cannot reach.
func TestCompleteCommand(t *testing.T) {
	s := bustest.Server(t)
	putStatus(t, s, events.GroupStatus{Group: "pbx", UpdatedAt: time.Now(), Nodes: map[string]events.NodeStatus{"n2": {}, "n1": {}}})
	putStatus(t, s, events.GroupStatus{Group: "fax", UpdatedAt: time.Now(), Nodes: map[string]events.NodeStatus{"n1": {}, "n3": {}}})
	for kind, want := range map[string]string{"node": "n1\nn2\nn3\n", "group": "fax\npbx\n", "cluster": "lab\n"} {
		if code, out, errOut := run("--url", s.ClientURL(), "--timeout", "1s", "__complete", kind); code != 0 || out != want {
			t.Errorf("__complete %s: exit %d %q %q, want %q", kind, code, out, errOut, want)
		}
	}
	if code, out, _ := run("--url", s.ClientURL(), "--cluster", "other", "__complete", "node"); code != 0 || out != "" {
		t.Errorf("__complete node of another cluster: exit %d %q", code, out)
	}
	code, out, _ := run("__complete", "type")
	types := strings.Fields(out)
	if code != 0 || !sort.StringsAreSorted(types) || !slices.Contains(types, "health.transition") || len(types) != len(events.Types()) {
		t.Errorf("__complete type: exit %d %q", code, out)
	}
	if code, out, _ := finishes(t, "--url", "nats://127.0.0.1:1", "--timeout", "1s", "__complete", "node"); code == 0 || out != "" {
		t.Errorf("__complete node with no bus: exit %d %q", code, out)
	}
	// Hidden: neither help nor completion offers it.
	if _, out, _ := run("help"); strings.Contains(out, "__complete") {
		t.Error("fanctl help lists __complete")
	}
}

func TestNearest(t *testing.T) {
	for word, want := range map[string]string{"health.transtion": "health.transition", "decision": "arbiter.decision",
		"heartbeat": "node.heartbeat", "comand.result": "command.result"} {
		var types []string
		for _, ty := range events.Types() {
			types = append(types, string(ty))
		}
		if got := fanctl.Nearest(word, types); got != want {
			t.Errorf("nearest %q = %q, want %q", word, got, want)
		}
	}
}

// BenchmarkEventsReadAll: how fast `fanctl events --since all --json` reads
// a trail (events a second), which says how long a trail the default
// --timeout (10s) reads whole: go test -run '^$' -bench EventsReadAll
// ./internal/fanctl (FANCTL_BENCH_EVENTS, default 20000).
func BenchmarkEventsReadAll(b *testing.B) {
	n := 20000
	if v, err := strconv.Atoi(os.Getenv("FANCTL_BENCH_EVENTS")); err == nil && v > 0 {
		n = v
	}
	s := bustest.Server(b)
	p := bustest.Connect(b, s, bus.Identity{Cluster: "lab", Service: "arbiter", Node: "ctl"})
	ctx := context.Background()
	for i := range n {
		if _, err := p.Emit(ctx, events.ArbiterDecision{Group: "pbx", Action: events.ActionHold, Reason: "hold " + strconv.Itoa(i),
			CausedBy: []string{"0193a1b2-0000-7000-8000-000000000001"}}); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		code, out, errOut := run("--url", s.ClientURL(), "--timeout", "10m", "events", "--since", "all", "--json")
		if code != 0 || strings.Count(out, "\n") != n {
			b.Fatalf("exit %d, %d lines: %s", code, strings.Count(out, "\n"), errOut)
		}
		b.ReportMetric(float64(n)/time.Since(start).Seconds(), "events/s")
	}
}
