package decide

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/events"
)

func benchEnv(node string) events.Envelope {
	return events.Envelope{ID: "0193a1b2-0000-7000-9000-000000000001", Time: t0,
		Source: events.Source{Service: "prober", Node: node}, Cluster: "lab"}
}

func selfTransition(n string, from, to events.Health) *events.HealthTransition {
	return &events.HealthTransition{Check: "pbx", TargetNode: n, Role: events.RoleSelf, From: from, To: to, Reason: "bench",
		Consecutive: 3, Rise: 2, Fall: 3, Evidence: []events.Evidence{{At: t0}}}
}

func benchHeartbeat(n string, peers ...string) *events.NodeHeartbeat {
	hb := &events.NodeHeartbeat{Node: n, IntervalMS: 1000, Version: "bench", Checks: map[string]events.CheckState{
		"pbx": {TargetNode: n, Role: events.RoleSelf, Health: events.HealthUp, Since: t0},
	}}
	for _, p := range peers {
		hb.Checks["peer-"+p] = events.CheckState{TargetNode: p, Role: events.RolePeer, Health: events.HealthUp, Since: t0}
	}
	return hb
}

func lastClaim(out Output) (string, string) {
	for _, e := range slices.Backward(out.Emits) {
		if c, ok := e.Payload.(events.ClaimIP); ok {
			return e.ID, c.Node
		}
	}
	return "", ""
}

// BenchmarkHandleTransition measures decision latency: a holder's "down"
// transition in, decision + release + claim out. Each op is one failover
// cycle (down, the claim's confirmation, the old holder back up); the
// decision itself is timed separately and reported as decide-ns/op and its
// p99, the figure fan's 5 ms p99 decision target is about.
func BenchmarkHandleTransition(b *testing.B) {
	cfg := testConfig()
	cfg.MaxMovesPerHour = -1 // the clock stands still here: the flap cap would freeze the group
	c, err := New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	if err := c.SetLeadership(1, true); err != nil {
		b.Fatal(err)
	}
	for _, n := range []string{"n1", "n2", "n3"} {
		c.Handle(t0, benchEnv(n), benchHeartbeat(n))
	}
	id, node := lastClaim(c.Tick(t0))
	if id == "" {
		// Placement already happened on n1's heartbeat.
		id, node = c.groups[0].pending.cmdID, c.groups[0].pending.node
	}
	c.Handle(t0, benchEnv(node), &events.CommandResult{CommandID: id, CommandType: events.TypeClaimIP, Node: node, Group: "pbx", Outcome: events.OutcomeApplied})
	holder := node
	downs := map[string]*events.HealthTransition{}
	ups := map[string]*events.HealthTransition{}
	for _, n := range []string{"n1", "n2", "n3"} {
		downs[n] = selfTransition(n, events.HealthUp, events.HealthDown)
		ups[n] = selfTransition(n, events.HealthDown, events.HealthUp)
	}
	lat := make([]time.Duration, 0, b.N)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		out := c.Handle(t0, benchEnv(holder), downs[holder])
		lat = append(lat, time.Since(start))
		id, node := lastClaim(out)
		if id == "" {
			b.Fatalf("no claim after %s went down: %q", holder, summary(out))
		}
		c.Handle(t0, benchEnv(node), &events.CommandResult{CommandID: id, CommandType: events.TypeClaimIP, Node: node, Group: "pbx", Outcome: events.OutcomeApplied})
		c.Handle(t0, benchEnv(holder), ups[holder])
		holder = node
	}
	b.StopTimer()
	slices.Sort(lat)
	var sum time.Duration
	for _, d := range lat {
		sum += d
	}
	b.ReportMetric(float64(sum.Nanoseconds())/float64(len(lat)), "decide-ns/op")
	b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds()), "decide-p50-ns")
	b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds()), "decide-p99-ns")
}

// BenchmarkHeartbeats1000 follows 1,000 nodes (500 groups of two, each
// node also reporting its peer) beating once a second, with a Tick every
// 100 heartbeats (10 per second). ns/op is the cost of one heartbeat;
// core-share is the fraction of one core the steady load would use.
func BenchmarkHeartbeats1000(b *testing.B) {
	const nodes = 1000
	var groups []Group
	name := func(i int) string { return fmt.Sprintf("n%d", i) }
	for i := 0; i < nodes; i += 2 {
		groups = append(groups, Group{Name: fmt.Sprintf("g%d", i/2), Addresses: []string{"198.51.100.10/24"},
			Nodes: []string{name(i), name(i + 1)}, HealthCheck: "pbx"})
	}
	c, err := New(testConfig(groups...))
	if err != nil {
		b.Fatal(err)
	}
	if err := c.SetLeadership(1, true); err != nil {
		b.Fatal(err)
	}
	envs := make([]events.Envelope, nodes)
	hbs := make([]*events.NodeHeartbeat, nodes)
	for i := range nodes {
		envs[i] = benchEnv(name(i))
		hbs[i] = benchHeartbeat(name(i), name(i^1))
	}
	now := t0
	for i := range nodes {
		c.Handle(now, envs[i], hbs[i])
	}
	for _, g := range c.groups {
		p := g.pending
		c.Handle(now, envs[0], &events.CommandResult{CommandID: p.cmdID, CommandType: events.TypeClaimIP, Node: p.node, Group: g.cfg.Name, Outcome: events.OutcomeApplied})
		if g.holder == "" {
			b.Fatalf("group %s not placed", g.cfg.Name)
		}
	}
	lat := make([]time.Duration, 0, b.N)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		now = now.Add(time.Millisecond) // 1,000 heartbeats per second in all
		start := time.Now()
		out := c.Handle(now, envs[i%nodes], hbs[i%nodes])
		if i%100 == 99 {
			out = c.Tick(now)
		}
		lat = append(lat, time.Since(start))
		if len(out.Emits) != 0 {
			b.Fatalf("steady heartbeats caused %q", summary(out))
		}
	}
	b.StopTimer()
	perOp := float64(b.Elapsed().Nanoseconds()) / float64(b.N)
	b.ReportMetric(perOp*nodes/1e9, "core-share")
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds()), "p50-ns")
	b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds()), "p99-ns")
}
