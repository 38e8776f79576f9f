package decide

import (
	"fmt"
	"time"

	"github.com/fanpbx/fan/pkg/events"
)

// ClaimUnsent is told, by a new leader, that a restored claim never reached
// the bus: the previous leader persisted its state (which it does before
// publishing) and stopped before the claim was stored. The fence on the
// command stream guarantees it can no longer arrive, so waiting for its
// deadline would only leave the group without a holder for a whole claim
// timeout and then skip a node that was never asked. The move is issued
// again under this term, to the same node.
//
// Which of the previous leader's releases were published is just as
// unknown, so every other member is told to release before the claim:
// a release to a node that holds nothing changes nothing, a missing one
// could leave two nodes answering.
func (c *Core) ClaimUnsent(now time.Time, commandID string) Output {
	c.clock(now)
	c.trigger = events.TriggerTakeover
	var out Output
	if !c.leading {
		return out
	}
	for _, g := range c.groups {
		p := g.pending
		if p == nil || p.cmdID != commandID {
			continue
		}
		if !now.Before(p.deadline) || c.lost(g, p.node, now) {
			// The usual rules apply: evaluate retries with the next candidate.
			return out
		}
		from := p.prevHolder
		if p.action == events.ActionPlace {
			from = ""
		}
		var release []string
		if p.prevHolder != "" && p.prevHolder != p.node {
			release = append(release, p.prevHolder) // first, so move records it as fenced
		}
		for _, n := range g.cfg.Nodes {
			if n != p.node && n != p.prevHolder {
				release = append(release, n)
			}
		}
		g.pending = nil
		c.move(g, now, p.action, from, p.node,
			fmt.Sprintf("the previous leader's claim on %s never reached the bus (it stopped while publishing): %s again under this term",
				p.node, p.action),
			[]ref{{id: p.cmdID, corr: p.corr}}, release, p.prevHolder, p.prevFenced, &out)
		return out
	}
	return out
}
