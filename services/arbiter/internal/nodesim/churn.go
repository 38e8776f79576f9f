package nodesim

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/fanpbx/fan/pkg/events"
)

// Layout names n nodes (n0001...) and puts them in groups of two and three
// alternately (the first of two, the second of three, ...), each node in
// one group, never leaving one node alone at the end (n = 1 aside).
func Layout(n int) (nodes []string, groups [][]string) {
	for i := range n {
		nodes = append(nodes, fmt.Sprintf("n%04d", i+1))
	}
	for rest := nodes; len(rest) > 0; {
		size := 2 + len(groups)%2
		if len(rest)-size == 1 {
			size = 5 - size // 3 left: take them; 4 left: two and two
		}
		size = min(size, len(rest))
		groups = append(groups, rest[:size])
		rest = rest[size:]
	}
	return nodes, groups
}

// GroupName is the name Layout's i-th group has in ArbiterConfig.
func GroupName(i int) string { return fmt.Sprintf("g%04d", i+1) }

// address is group i's floating address, from the documentation ranges:
// the arbiter only names it in commands, nothing binds it.
func address(i int) string {
	blocks := []string{"198.51.100", "203.0.113", "192.0.2"}
	return fmt.Sprintf("%s.%d/24", blocks[(i/254)%len(blocks)], i%254+1)
}

// ArbiterConfig renders an arbiter configuration for groups (Layout's),
// each deciding on check, with the policy defaults. extra is appended as
// top-level YAML (http_listen, policy).
func ArbiterConfig(cluster, node, url, check string, groups [][]string, extra string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "cluster: %s\nnode: %s\nbus:\n  url: %q\n", cluster, node, url)
	b.WriteString(extra)
	b.WriteString("groups:\n")
	for i, g := range groups {
		nodes, _ := json.Marshal(g)
		fmt.Fprintf(&b, "  - {name: %s, addresses: [%q], nodes: %s, health_check: %s}\n", GroupName(i), address(i), nodes, check)
	}
	return b.String()
}

// SetAll reports every node's check as h (each a transition, as probers
// starting up report their first verdict).
func (s *Sim) SetAll(h events.Health) error {
	for _, n := range s.order {
		if _, err := s.SetHealth(n.name, h); err != nil {
			return err
		}
	}
	return nil
}

// WaitPlaced waits until every group (Layout's, named by GroupName) has a
// holder and is steady: a claim the simulated executor applied, and the
// arbiter's group status naming that node as holder and every member as
// eligible. A fault of the holder is then a failover to another member,
// not a retry of a pending claim nor a hold for a node not heard yet.
func (s *Sim) WaitPlaced(ctx context.Context, groups [][]string) error {
	kv, err := s.ctrl.StateKV(ctx)
	if err != nil {
		return err
	}
	left := map[int]bool{}
	for i := range groups {
		left[i] = true
	}
	// why says what the first group still waiting lacks, for the error.
	var why string
	steady := func(i int) bool {
		h := s.Holder(GroupName(i))
		if h == "" {
			why = GroupName(i) + ": no claim applied"
			return false
		}
		e, err := kv.Get(ctx, events.GroupStatusKey(s.cfg.Cluster, GroupName(i)))
		if err != nil {
			why = fmt.Sprintf("%s: claim applied on %s, no group status: %v", GroupName(i), h, err)
			return false
		}
		var st events.GroupStatus
		if json.Unmarshal(e.Value(), &st) != nil || st.Holder != h {
			why = fmt.Sprintf("%s: claim applied on %s, status names %q (%s)", GroupName(i), h, st.Holder, st.Situation)
			return false
		}
		for _, n := range groups[i] {
			if !st.Nodes[n].Eligible {
				why = fmt.Sprintf("%s: %s not eligible in the status (%+v)", GroupName(i), n, st.Nodes[n])
				return false
			}
		}
		return true
	}
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		for i := range left {
			if steady(i) {
				delete(left, i)
			}
		}
		if len(left) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("nodesim: %d of %d groups not placed and steady (%s): %w", len(left), len(groups), why, ctx.Err())
		case <-t.C:
		}
	}
}

// Churn is the load of the benchmark: health transitions at Rate a second,
// spread over the nodes. Each turn either brings back a node taken down
// RecoverAfter ago, or takes down the holder of the next group in turn
// (whose members are all up), which the arbiter answers with a failover.
// Groups are visited round robin, so a group's next fault comes long after
// its last move.
type Churn struct {
	// Groups are Layout's, named by GroupName.
	Groups       [][]string
	Rate         float64
	RecoverAfter time.Duration
}

// Churn posts transitions as c says until ctx ends, then brings every node
// it took down back up.
func (s *Sim) Churn(ctx context.Context, c Churn) error {
	type down struct {
		node string
		at   time.Time
	}
	var downs []down
	next := 0
	t := time.NewTicker(time.Duration(float64(time.Second) / c.Rate))
	defer t.Stop()
	defer func() {
		for _, d := range downs {
			_, _ = s.SetHealth(d.node, events.HealthUp)
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return nil
		case now := <-t.C:
			if len(downs) > 0 && now.Sub(downs[0].at) >= c.RecoverAfter {
				if _, err := s.SetHealth(downs[0].node, events.HealthUp); err != nil {
					return err
				}
				downs = downs[1:]
				continue
			}
			for range c.Groups {
				i := next % len(c.Groups)
				next++
				h := s.Holder(GroupName(i))
				if h == "" || slices.ContainsFunc(c.Groups[i], func(n string) bool { return s.Health(n) != events.HealthUp }) {
					continue
				}
				if _, err := s.SetHealth(h, events.HealthDown); err != nil {
					return err
				}
				downs = append(downs, down{node: h, at: now})
				break
			}
		}
	}
}
