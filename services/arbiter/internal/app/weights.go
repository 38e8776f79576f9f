package app

import (
	"context"
	"slices"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/services/arbiter/internal/weights"
)

// runWeights ranks the nodes of every group with weights enabled from
// their heartbeats and, while this replica leads, publishes a weight set
// when the hysteresis lets one through. It has its own watch, so ranking
// never delays a decision. Followers track too, so a new leader starts warm.
func (a *arbiter) runWeights(ctx context.Context) {
	type tracked struct {
		group string
		nodes []string
		tr    *weights.Tracker
	}
	var groups []tracked
	for _, g := range a.cfg.Groups {
		if g.Weights.Enabled {
			groups = append(groups, tracked{g.Name, g.Nodes, weights.New(g.Weights.Threshold, g.Weights.Confirm)})
		}
	}
	if len(groups) == 0 {
		return
	}
	_ = a.bus.Watch(ctx, bus.WatchOptions{Subjects: []string{events.AllHeartbeats(a.cfg.Cluster)}},
		func(env events.Envelope, p events.Decoded, _ uint64) {
			hb, ok := p.(*events.NodeHeartbeat)
			if !ok {
				return
			}
			load, ok := weights.Load(hb)
			if !ok {
				return
			}
			for _, g := range groups {
				if !slices.Contains(g.nodes, hb.Node) {
					continue
				}
				changed, reason := g.tr.Observe(hb.Node, load)
				if !changed || !a.lease.Leading() {
					continue
				}
				// A newer set for the group supersedes one still waiting.
				_, err := a.ob.Post("weights/"+g.group, g.tr.Set(g.group, reason), events.CausedBy(env))
				if err != nil {
					a.log.Warn("publish dispatcher weights failed", "group", g.group, "err", err)
					continue
				}
				a.log.Info("dispatcher weights", "group", g.group, "weights", g.tr.String(), "reason", reason)
			}
		})
}
