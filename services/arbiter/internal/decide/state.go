package decide

import (
	"fmt"
	"slices"
	"time"

	"github.com/fanpbx/fan/pkg/events"
)

// State is what the shell persists after every Output that carries
// commands (before publishing them, so a successor never forgets a claim
// that may be in flight) and what fanctl status shows. Restore reads the
// group fields marked as restored; the rest is informational.
type State struct {
	Cluster string       `json:"cluster"`
	Epoch   uint64       `json:"epoch"`
	Leading bool         `json:"leading"`
	At      time.Time    `json:"at"` // the last time the core was given
	Groups  []GroupState `json:"groups"`
}

// GroupState is one group's standing.
type GroupState struct {
	Name                 string       `json:"name"`                             // restored
	Holder               string       `json:"holder,omitempty"`                 // restored: confirmed holder
	PreviousHolder       string       `json:"previous_holder,omitempty"`        // restored
	PreviousHolderFenced bool         `json:"previous_holder_fenced,omitempty"` // restored
	Claim                *Claim       `json:"claim,omitempty"`                  // restored: outstanding claim
	LastMove             time.Time    `json:"last_move,omitzero"`               // restored
	HoldDownUntil        time.Time    `json:"hold_down_until,omitzero"`         // informational
	Situation            string       `json:"situation,omitempty"`              // the last hold explained
	Permit               *Permit      `json:"permit,omitempty"`                 // last failback permit seen (not acted on)
	Nodes                []NodeStatus `json:"nodes,omitempty"`                  // informational
}

// Claim is an outstanding claim: the shell must keep it across a change of
// leader so the successor waits for its result or gives it up and releases
// the claimant.
type Claim struct {
	CommandID            string        `json:"command_id"`
	CorrelationID        string        `json:"correlation_id,omitempty"`
	Node                 string        `json:"node"`
	Action               events.Action `json:"action"`
	Deadline             time.Time     `json:"deadline"`
	PreviousHolder       string        `json:"previous_holder,omitempty"`
	PreviousHolderFenced bool          `json:"previous_holder_fenced,omitempty"`
}

// Permit is the last failback permit seen for a group.
type Permit struct {
	Window     string    `json:"window"`
	ValidFrom  time.Time `json:"valid_from"`
	ValidUntil time.Time `json:"valid_until"`
	EventID    string    `json:"event_id"`
}

// NodeStatus is the arbiter's view of one node within a group.
type NodeStatus struct {
	Node          string        `json:"node"`
	Health        events.Health `json:"health"` // the group's HealthCheck as its own prober reports it
	LastHeartbeat time.Time     `json:"last_heartbeat,omitzero"`
	Silent        bool          `json:"silent"`
	Eligible      bool          `json:"eligible"`
	FailedUntil   time.Time     `json:"failed_until,omitzero"`
}

// Snapshot returns the state as of the last time the core was given.
func (c *Core) Snapshot() State {
	now := c.now
	s := State{Cluster: c.cfg.Cluster, Epoch: c.epoch, Leading: c.leading, At: now}
	for _, g := range c.groups {
		gs := GroupState{
			Name: g.cfg.Name, Holder: g.holder, PreviousHolder: g.lastHolder, PreviousHolderFenced: g.lastFenced,
			LastMove: g.lastMove, Situation: g.reason,
		}
		if !g.lastMove.IsZero() {
			gs.HoldDownUntil = g.lastMove.Add(c.cfg.HoldDown)
		}
		if p := g.pending; p != nil {
			gs.Claim = &Claim{CommandID: p.cmdID, CorrelationID: p.corr, Node: p.node, Action: p.action, Deadline: p.deadline,
				PreviousHolder: p.prevHolder, PreviousHolderFenced: p.prevFenced}
		}
		if p := g.permit; p != nil {
			gs.Permit = &Permit{Window: p.window, ValidFrom: p.from, ValidUntil: p.until, EventID: p.cause.id}
		}
		for _, n := range g.cfg.Nodes {
			st := NodeStatus{Node: n, Health: events.HealthUnknown, LastHeartbeat: c.nodes[n].lastHB}
			if o := c.selfObs(g, n); o != nil {
				st.Health = o.health
			}
			if !now.IsZero() {
				st.Silent = c.silent(n, now)
				st.Eligible = c.eligible(g, n, now)
			}
			if until, ok := g.failed[n]; ok && now.Before(until) {
				st.FailedUntil = until
			}
			gs.Nodes = append(gs.Nodes, st)
		}
		s.Groups = append(s.Groups, gs)
	}
	return s
}

// Restore loads what a previous leader persisted, so that this core
// continues from the same holder and outstanding claim. Groups no longer
// configured are skipped; a holder or claimant that is not a member of its
// group is an error (the configuration changed under the state, and
// guessing could put the address on two nodes).
func (c *Core) Restore(s State) error {
	if s.Cluster != "" && s.Cluster != c.cfg.Cluster {
		return fmt.Errorf("restore: state of cluster %q, this arbiter serves %q", s.Cluster, c.cfg.Cluster)
	}
	type restored struct {
		g  *groupState
		gs GroupState
	}
	var todo []restored
	for _, gs := range s.Groups {
		gi, ok := c.byName[gs.Name]
		if !ok {
			continue
		}
		g := c.groups[gi]
		for _, n := range []string{gs.Holder, gs.PreviousHolder, claimNode(gs.Claim)} {
			if n != "" && !slices.Contains(g.cfg.Nodes, n) {
				return fmt.Errorf("restore: group %s: node %s is not a member", gs.Name, n)
			}
		}
		if gs.Claim != nil && gs.Claim.CommandID == "" {
			return fmt.Errorf("restore: group %s: claim without a command id", gs.Name)
		}
		todo = append(todo, restored{g, gs})
	}
	// Validated first, applied after: a refused state leaves the core untouched.
	for _, r := range todo {
		g, gs := r.g, r.gs
		g.holder, g.lastHolder, g.lastFenced = gs.Holder, gs.PreviousHolder, gs.PreviousHolderFenced
		g.lastMove = gs.LastMove
		g.pending = nil
		if cl := gs.Claim; cl != nil {
			g.pending = &claim{node: cl.Node, cmdID: cl.CommandID, corr: cl.CorrelationID, deadline: cl.Deadline,
				action: cl.Action, prevHolder: cl.PreviousHolder, prevFenced: cl.PreviousHolderFenced}
			g.holder = ""
		}
		clear(g.failed)
		g.situation, g.reason = "", ""
	}
	if s.Epoch > c.maxEpoch {
		c.maxEpoch = s.Epoch // never lead under a term older than the one we restored from
	}
	return nil
}

func claimNode(cl *Claim) string {
	if cl == nil {
		return ""
	}
	return cl.Node
}
