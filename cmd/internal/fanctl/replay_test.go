package fanctl_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fanpbx/fan/cmd/internal/fanctl"
	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/bus/bustest"
)

// TestReplayCommand runs `fanctl replay` against a trail on a real
// JetStream: without an arbiter start it refuses (the core's state would be
// unknown); with one, a recorded decision the policy would not make is
// flagged and the exit status says so. (That the arbiter's own decisions
// replay identically is tested where the arbiter runs: services/arbiter.)
func TestReplayCommand(t *testing.T) {
	s := bustest.Server(t)
	ctx := context.Background()
	cfg := filepath.Join(t.TempDir(), "arbiter.yaml")
	if err := os.WriteFile(cfg, []byte("cluster: lab\nnode: ctl\nbus:\n  url: "+s.ClientURL()+
		"\ngroups:\n  - name: pbx\n    addresses: [198.51.100.10/24]\n    nodes: [n1, n2]\n    health_check: pbx\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) (int, string, string) {
		var out, errb bytes.Buffer
		code := fanctl.Main(append([]string{"--url", s.ClientURL()}, args...), &out, &errb, "t")
		return code, out.String(), errb.String()
	}
	if code, _, _ := run("replay"); code != 2 {
		t.Fatalf("replay without --arbiter-config: exit %d, want 2", code)
	}
	if code, _, errs := run("--cluster", "other", "replay", "--arbiter-config", cfg); code != 1 || !strings.Contains(errs, "cluster lab") {
		t.Fatalf("replay for another cluster: exit %d, %s", code, errs)
	}

	arb := bustest.Connect(t, s, bus.Identity{Cluster: "lab", Service: "arbiter", Node: "ctl"})
	if code, _, errs := run("replay", "--arbiter-config", cfg, "--since", "all"); code != 1 || !strings.Contains(errs, "no arbiter start") {
		t.Fatalf("replay without an arbiter start: exit %d, %s", code, errs)
	}
	if _, err := arb.Emit(ctx, events.ServiceAnnounce{Service: "arbiter", Node: "ctl", Version: "t", State: events.ServiceStarted}); err != nil {
		t.Fatal(err)
	}
	var hbs []events.Envelope
	for _, n := range []string{"n1", "n2"} {
		p := bustest.Connect(t, s, bus.Identity{Cluster: "lab", Service: "prober", Node: n})
		hb, err := p.Emit(ctx, events.NodeHeartbeat{Node: n, Seq: 1, IntervalMS: 1000, Version: "t",
			Checks: map[string]events.CheckState{"pbx": {TargetNode: n, Role: events.RoleSelf, Health: events.HealthUp, Since: time.Now()}}})
		if err != nil {
			t.Fatal(err)
		}
		hbs = append(hbs, hb)
	}
	// Both nodes are up and n1 is preferred: the policy places on n1. A
	// recorded move to n2 is not what it would decide.
	if _, err := arb.Emit(ctx, events.ArbiterDecision{Group: "pbx", Action: events.ActionPlace, To: "n2",
		Reason: "no holder; n2 is the highest-priority eligible node", CausedBy: []string{hbs[1].ID},
		Trigger: events.TriggerTick, Input: hbs[1].ID}, events.WithEpoch(1), events.At(time.Now().Add(time.Second))); err != nil {
		t.Fatal(err)
	}
	code, out, errs := run("replay", "--arbiter-config", cfg, "--since", "all")
	if code != 4 {
		t.Fatalf("exit %d, want 4 (a difference)\n%s\n%s", code, out, errs)
	}
	for _, want := range []string{"! ", "recorded: PLACE ->n2", "replayed: PLACE ->n1", "to: recorded n2, replayed n1", "1 differ"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}
