package nodesim

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus/bustest"
	"github.com/fanpbx/fan/pkg/platform/daemon"
	"github.com/fanpbx/fan/pkg/platform/logtest"
	"github.com/fanpbx/fan/services/arbiter/internal/app"
)

func TestLayout(t *testing.T) {
	for n, want := range map[int][]int{2: {2}, 3: {3}, 4: {2, 2}, 5: {2, 3}, 6: {2, 2, 2}, 7: {2, 3, 2}, 8: {2, 3, 3}, 10: {2, 3, 2, 3}} {
		nodes, groups := Layout(n)
		var sizes []int
		var all []string
		for _, g := range groups {
			sizes = append(sizes, len(g))
			all = append(all, g...)
		}
		if !slices.Equal(sizes, want) || !slices.Equal(all, nodes) || len(nodes) != n {
			t.Errorf("Layout(%d): sizes %v, want %v; nodes %v in groups %v", n, sizes, want, nodes, groups)
		}
	}
	_, groups := Layout(1000)
	if len(groups) != 400 {
		t.Errorf("1000 nodes: %d groups, want 400", len(groups))
	}
}

// TestCommandFollowsTransition runs the real arbiter (in this process, from
// the configuration the benchmark gives the binary) on an embedded
// JetStream with five simulated nodes in two groups: every group is placed
// on a node the simulated executor answered for, and a holder's health
// going down makes the arbiter claim the group's other node, the claim
// carrying the transition's id as its correlation id.
func TestCommandFollowsTransition(t *testing.T) {
	srv := bustest.Server(t)
	nodes, groups := Layout(5)
	names := []string{GroupName(0), GroupName(1)}
	path := filepath.Join(t.TempDir(), "arbiter.yaml")
	cfg := ArbiterConfig("sim", "arb1", srv.ClientURL(), "pbx", groups, "lease_ttl: 1s\npolicy:\n  settle_after: 300ms\n")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	var logs logtest.Buffer
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	svc, err := app.Build(daemon.Options{ConfigPath: path, Logger: log, Version: "test"})
	if err != nil {
		t.Fatalf("%v\n%s", err, cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sim, err := Start(ctx, Config{Cluster: "sim", URL: srv.ClientURL(), Nodes: nodes, Check: "pbx", Log: log})
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	arbCtx, stopArb := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { _ = svc.Run(arbCtx); close(done) }()
	defer func() { stopArb(); <-done }()

	if err := sim.SetAll(events.HealthUp); err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	defer wcancel()
	if err := sim.WaitPlaced(wctx, groups); err != nil {
		t.Fatalf("%v\narbiter log:\n%s", err, logs.String())
	}
	// Placed on whichever member was heard first within the short settle.
	holder := sim.Holder(names[0])
	i := slices.Index(groups[0], holder)
	if i < 0 {
		t.Fatalf("group %s placed on %s, not one of its nodes %v", names[0], holder, groups[0])
	}
	sim.Reset()
	env, err := sim.SetHealth(holder, events.HealthDown)
	if err != nil {
		t.Fatal(err)
	}
	other := groups[0][1-i]
	for sim.Holder(names[0]) != other || len(sim.Stats().Latencies) == 0 {
		select {
		case <-wctx.Done():
			t.Fatalf("no claim of %s on %s after %s went down (transition %s); stats %+v\narbiter log:\n%s",
				names[0], other, holder, env.ID, sim.Stats(), logs.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
	st := sim.Stats()
	// The failover is a release of the old holder and a claim of the new.
	if st.Transitions != 1 || st.Claims != 1 || st.Commands != 2 || len(st.Latencies) != 1 || st.Latencies[0] <= 0 {
		t.Fatalf("after one transition: %+v, want 1 transition, 1 claim, 2 commands, one positive latency", st)
	}
	if _, err := sim.SetHealth(holder, events.HealthDown); err == nil {
		t.Fatal("a second transition to the same health was posted")
	}
}
