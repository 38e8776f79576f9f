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
	"github.com/fanpbx/fan/pkg/platform/config"
	"github.com/fanpbx/fan/pkg/platform/daemon/metricstest"
	"github.com/fanpbx/fan/pkg/platform/waittest"
)

// TestSwitchoverStaysThroughAWindowAndANewLeader: a switchover pins its
// group; inside an open failback window, and after the leader that pinned
// it dies, the group stays where the operator put it; the status and
// /metrics show the pin; clearing it lets the window fail the group back.
func TestSwitchoverStaysThroughAWindowAndANewLeader(t *testing.T) {
	l := newLab(t, "n1", "n2")
	l.leaseTTL = operatorLeaseTTL
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	l.nodesUp(ctx)
	edit := func(c *Config) {
		c.Policy.HoldDown = config.Duration(time.Second)
		c.Groups[0].Failback = FailbackConfig{StableFor: config.Duration(time.Second), DrainMaxChannels: -1}
	}
	addrA, addrB := metricstest.Listen(t), metricstest.Listen(t)
	stopA := l.arbiterWith("ctlA", func(c *Config) { edit(c); c.HTTPListen = addrA })
	l.waitHolder("n1", 10*time.Second)
	l.arbiterWith("ctlB", func(c *Config) { edit(c); c.HTTPListen = addrB })
	ask := l.asker()

	sched := bustest.Connect(t, l.s, bus.Identity{Cluster: "lab", Service: "scheduler", Node: "ctl"})
	now := time.Now()
	if _, err := sched.Emit(ctx, events.FailbackPermit{Group: "pbx", Window: "nightly", ValidFrom: now, ValidUntil: now.Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	rep := ask("alice", events.OperatorRequest{Verb: events.OpSwitchover, Node: "n2", Reason: "rolling upgrade", ForMS: (2 * time.Hour).Milliseconds()})
	if !rep.Accepted || !strings.Contains(rep.Message, "pbx stays on n2 once moved: pinned for 2h0m0s from the move") {
		t.Fatalf("switchover: %+v", rep)
	}
	l.waitHolder("n2", 10*time.Second)
	status := func() events.GroupStatus {
		t.Helper()
		b := bustest.Connect(t, l.s, bus.Identity{Cluster: "lab", Service: "test", Node: "reader"})
		kv, err := b.StateKV(ctx)
		if err != nil {
			t.Fatal(err)
		}
		e, err := kv.Get(ctx, events.GroupStatusKey("lab", "pbx"))
		if err != nil {
			t.Fatal(err)
		}
		var st events.GroupStatus
		if err := json.Unmarshal(e.Value(), &st); err != nil {
			t.Fatal(err)
		}
		return st
	}
	waittest.Until(t, 10*time.Second, "the pin in the group status", func() bool {
		st := status()
		return st.Pin != nil && st.Pin.Node == "n2" && st.Pin.Operator == "alice" && st.Pin.Until.Sub(st.Pin.Since) == 2*time.Hour
	})
	metricstest.WaitFor(t, addrA, `fan_arbiter_group_pinned{group="pbx",node="n2"}`, metricstest.Is(1), 10*time.Second)
	metricstest.WaitFor(t, addrA, `fan_arbiter_group_pin_until_timestamp_seconds{group="pbx"}`,
		metricstest.AtLeast(float64(now.Add(2*time.Hour).Unix()-1)), 10*time.Second)

	// The window is open, n1 is the preferred node and healthy: without the
	// pin it would fail back within seconds.
	l.tickedPast(time.Now().Add(3 * time.Second))
	if h := l.holding(); len(h) != 1 || h[0] != "n2" {
		t.Fatalf("holders %v inside the window, want the pinned n2", h)
	}
	stopA()
	metricstest.WaitFor(t, addrB, "fan_arbiter_leader", metricstest.Is(1), 15*time.Second)
	l.tickedPast(time.Now().Add(3 * time.Second))
	if h := l.holding(); len(h) != 1 || h[0] != "n2" {
		t.Fatalf("holders %v after the new leader took over, want the pinned n2", h)
	}
	metricstest.WaitFor(t, addrB, `fan_arbiter_group_pinned{group="pbx",node="n2"}`, metricstest.Is(1), 10*time.Second)

	rep = ask("bob", events.OperatorRequest{Verb: events.OpUnpin, Reason: "n1 upgraded"})
	if !rep.Accepted || !strings.Contains(rep.Message, "cleared by bob (n1 upgraded)") {
		t.Fatalf("unpin: %+v", rep)
	}
	l.waitHolder("n1", 15*time.Second)
	metricstest.WaitFor(t, addrB, `fan_arbiter_group_pinned{group="pbx",node="n2"}`, metricstest.Is(0), 10*time.Second)
	// The trail holds the pin's start and end, the end citing bob's action.
	var started, ended int
	for _, env := range l.trail(ctx) {
		if env.Type != events.TypeGroupPin {
			continue
		}
		var p events.GroupPin
		_ = json.Unmarshal(env.Data, &p)
		switch {
		case p.Stage == events.PinStarted && p.Node == "n2" && p.Operator == "alice":
			started++
		case p.Stage == events.PinEnded && p.End == events.PinCleared && strings.Contains(p.Why, "cleared by bob"):
			ended++
		}
	}
	if started != 1 || ended != 1 {
		t.Fatalf("pin records: %d starts, %d ends in the trail", started, ended)
	}
}
