package app

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/daemon/metricstest"
)

// TestMetricsFollowRealEvents: the arbiter's /metrics moves with what
// happens on the bus: leadership and a placement, a failover caused by the
// holder's PBX going down (decision, claim result, holder, last move), a
// freeze by an operator, and a node falling silent.
func TestMetricsFollowRealEvents(t *testing.T) {
	l := newLab(t, "n1", "n2")
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	l.nodesUp(ctx)
	addr := metricstest.Listen(t)
	l.arbiterWith("ctl", func(c *Config) { c.HTTPListen = addr })
	ask := l.asker()
	series := func(name string, labels ...string) string {
		s := name + "{"
		for i := 0; i < len(labels); i += 2 {
			if i > 0 {
				s += ","
			}
			s += fmt.Sprintf("%s=%q", labels[i], labels[i+1])
		}
		return s + "}"
	}
	const within = 15 * time.Second
	l.waitHolder("n1", within)
	metricstest.WaitFor(t, addr, "fan_arbiter_leader", metricstest.Is(1), within)
	metricstest.WaitFor(t, addr, "fan_arbiter_epoch", metricstest.AtLeast(1), within)
	metricstest.WaitFor(t, addr, series("fan_arbiter_decisions_total", "action", "place", "group", "pbx"), metricstest.Is(1), within)
	metricstest.WaitFor(t, addr, series("fan_arbiter_group_holder", "group", "pbx", "node", "n1"), metricstest.Is(1), within)
	metricstest.WaitFor(t, addr, series("fan_arbiter_group_held", "group", "pbx"), metricstest.Is(1), within)
	// The standby could take over: healthy and eligible.
	metricstest.WaitFor(t, addr, series("fan_arbiter_node_healthy", "group", "pbx", "node", "n2"), metricstest.Is(1), within)
	metricstest.WaitFor(t, addr, series("fan_arbiter_node_eligible", "group", "pbx", "node", "n2"), metricstest.Is(1), within)

	before := time.Now()
	l.setPBX("n1", false)
	l.waitHolder("n2", within)
	metricstest.WaitFor(t, addr, series("fan_arbiter_failovers_total", "group", "pbx"), metricstest.Is(1), within)
	metricstest.WaitFor(t, addr, series("fan_arbiter_decisions_total", "action", "failover", "group", "pbx"), metricstest.Is(1), within)
	metricstest.WaitFor(t, addr, series("fan_arbiter_claim_results_total", "group", "pbx", "outcome", "applied"), metricstest.AtLeast(1), within)
	metricstest.WaitFor(t, addr, series("fan_arbiter_group_holder", "group", "pbx", "node", "n2"), metricstest.Is(1), within)
	metricstest.WaitFor(t, addr, series("fan_arbiter_group_holder", "group", "pbx", "node", "n1"), metricstest.Is(0), within)
	metricstest.WaitFor(t, addr, series("fan_arbiter_group_last_move_timestamp_seconds", "group", "pbx"),
		metricstest.AtLeast(float64(before.Unix())), within)
	metricstest.WaitFor(t, addr, series("fan_arbiter_failbacks_total", "group", "pbx"), metricstest.Is(0), time.Second)
	// The old holder is down: no longer a standby that could take over.
	metricstest.WaitFor(t, addr, series("fan_arbiter_node_healthy", "group", "pbx", "node", "n1"), metricstest.Is(0), within)
	metricstest.WaitFor(t, addr, series("fan_arbiter_node_eligible", "group", "pbx", "node", "n1"), metricstest.Is(0), within)

	metricstest.WaitFor(t, addr, series("fan_arbiter_group_frozen", "group", "pbx"), metricstest.Is(0), within)
	if rep := ask("alice", events.OperatorRequest{Verb: events.OpMaintenanceOn, Group: "pbx", Operator: "alice", Reason: "test"}); !rep.Accepted {
		t.Fatalf("maintenance on refused: %s", rep.Message)
	}
	metricstest.WaitFor(t, addr, series("fan_arbiter_group_frozen", "group", "pbx"), metricstest.Is(1), within)

	metricstest.WaitFor(t, addr, series("fan_arbiter_node_silent", "group", "pbx", "node", "n1"), metricstest.Is(0), within)
	l.mu.Lock()
	l.muted["n1"] = true
	l.mu.Unlock()
	metricstest.WaitFor(t, addr, series("fan_arbiter_node_silent", "group", "pbx", "node", "n1"), metricstest.Is(1), within)
}
