package decide

import (
	"fmt"
	"maps"
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
	// Maintenance is the operator's cluster-wide freeze (its reason). Restored.
	Maintenance string `json:"maintenance,omitempty"`
	// Standby lists the nodes an operator put in standby. Restored.
	Standby []StandbyNode `json:"standby,omitempty"`
}

// StandbyNode is a node in standby and the operator action that put it there.
type StandbyNode struct {
	Node    string `json:"node"`
	EventID string `json:"event_id"`
}

// GroupState is one group's standing.
type GroupState struct {
	Name                 string        `json:"name"`                             // restored
	Holder               string        `json:"holder,omitempty"`                 // restored: confirmed holder
	PreviousHolder       string        `json:"previous_holder,omitempty"`        // restored
	PreviousHolderFenced bool          `json:"previous_holder_fenced,omitempty"` // restored
	Claim                *Claim        `json:"claim,omitempty"`                  // restored: outstanding claim
	LastMove             time.Time     `json:"last_move,omitzero"`               // restored
	HoldDownUntil        time.Time     `json:"hold_down_until,omitzero"`         // informational
	Situation            string        `json:"situation,omitempty"`              // the last hold explained
	NeedsHuman           bool          `json:"needs_human,omitempty"`            // informational: the standing hold asks for a human
	Permit               *Permit       `json:"permit,omitempty"`                 // restored: last failback permit seen
	Maintenance          string        `json:"maintenance,omitempty"`            // restored: operator's freeze of the group
	FlapFrozen           string        `json:"flap_frozen,omitempty"`            // restored: the move cap's freeze
	Moves                []time.Time   `json:"moves,omitempty"`                  // restored: automatic moves in the last hour
	Frozen               string        `json:"frozen,omitempty"`                 // informational: why no automatic move, if frozen
	Planned              *PlannedState `json:"planned,omitempty"`                // restored: the operator's planned move
	Pin                  *PinState     `json:"pin,omitempty"`                    // restored: the operator's pin (pin.go)
	PinAsked             *PinAskState  `json:"pin_asked,omitempty"`              // restored: the pin of a switchover waiting to move
	Nodes                []NodeStatus  `json:"nodes,omitempty"`                  // informational
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
	Health        events.Health `json:"health"`                // the group's HealthCheck as its own prober reports it
	HealthSince   time.Time     `json:"health_since,omitzero"` // when Health took its value (arbiter's clock)
	LastHeartbeat time.Time     `json:"last_heartbeat,omitzero"`
	Silent        bool          `json:"silent"`
	Eligible      bool          `json:"eligible"`
	Standby       bool          `json:"standby,omitempty"`
	StableSince   time.Time     `json:"stable_since,omitzero"` // healthy and heard since (arbiter's clock)
	FailedUntil   time.Time     `json:"failed_until,omitzero"`
}

// Snapshot returns the state as of the last time the core was given.
func (c *Core) Snapshot() State {
	now := c.now
	s := State{Cluster: c.cfg.Cluster, Epoch: c.epoch, Leading: c.leading, At: now, Maintenance: c.maintenance}
	for _, n := range slices.Sorted(maps.Keys(c.standby)) {
		s.Standby = append(s.Standby, StandbyNode{Node: n, EventID: c.standby[n].id})
	}
	for _, g := range c.groups {
		gs := GroupState{
			Name: g.cfg.Name, Holder: g.holder, PreviousHolder: g.lastHolder, PreviousHolderFenced: g.lastFenced,
			LastMove: g.lastMove, Situation: g.reason, NeedsHuman: g.human,
			Maintenance: g.maintenance, FlapFrozen: g.flapFrozen, Moves: slices.Clone(g.moves), Frozen: c.frozenWhy(g),
		}
		if !g.lastMove.IsZero() {
			gs.HoldDownUntil = g.lastMove.Add(c.cfg.HoldDown)
		}
		if p := g.pending; p != nil {
			gs.Claim = &Claim{CommandID: p.cmdID, CorrelationID: p.corr, Node: p.node, Action: p.action, Deadline: p.deadline,
				PreviousHolder: p.prevHolder, PreviousHolderFenced: p.prevFenced}
		}
		if p := g.planned; p != nil {
			gs.Planned = p.state(c, g)
		}
		gs.Pin, gs.PinAsked = g.pinStates()
		if p := g.permit; p != nil {
			gs.Permit = &Permit{Window: p.window, ValidFrom: p.from, ValidUntil: p.until, EventID: p.cause.id}
		}
		for _, n := range g.cfg.Nodes {
			st := NodeStatus{Node: n, Health: events.HealthUnknown, LastHeartbeat: c.presence(n).lastHB, Standby: c.isStandby(n)}
			if o := c.selfObs(g, n); o != nil {
				st.Health, st.HealthSince = o.health, o.at
			}
			if !now.IsZero() {
				st.Silent = c.silent(n, now)
				st.Eligible = c.eligible(g, n, now) && !st.Standby
				if st.Eligible {
					st.StableSince = c.stableSince(g, n)
				}
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
		if gs.Planned != nil {
			if err := gs.Planned.validate(g); err != nil {
				return fmt.Errorf("restore: group %s: %w", gs.Name, err)
			}
		}
		if err := g.checkPins(gs); err != nil {
			return fmt.Errorf("restore: group %s: %w", gs.Name, err)
		}
		if !slices.IsSortedFunc(gs.Moves, func(a, b time.Time) int { return a.Compare(b) }) {
			return fmt.Errorf("restore: group %s: move history out of order", gs.Name)
		}
		todo = append(todo, restored{g, gs})
	}
	for _, sb := range s.Standby {
		if c.nodes[sb.Node] == nil {
			continue // no longer configured: nothing to keep off
		}
		if sb.EventID == "" {
			return fmt.Errorf("restore: standby node %s without its cause", sb.Node)
		}
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
			// Confirmed while this core was following: take it as confirmed.
			if r, ok := c.results[cl.CommandID]; ok && r.node == cl.Node &&
				(r.outcome == events.OutcomeApplied || r.outcome == events.OutcomeDuplicate) {
				g.holder, g.pending = cl.Node, nil
			}
		}
		clear(g.failed)
		clear(g.told)
		g.situation, g.reason, g.human = "", "", false
		g.maintenance, g.flapFrozen, g.moves = gs.Maintenance, gs.FlapFrozen, slices.Clone(gs.Moves)
		g.planned = nil
		if gs.Planned != nil {
			g.planned = gs.Planned.restore()
		}
		g.restorePins(gs)
		g.permit = nil
		if p := gs.Permit; p != nil && p.EventID != "" {
			g.permit = &permit{window: p.Window, from: p.ValidFrom, until: p.ValidUntil, cause: ref{id: p.EventID}}
		}
	}
	c.maintenance = s.Maintenance
	clear(c.standby)
	for _, sb := range s.Standby {
		if c.nodes[sb.Node] != nil {
			c.standby[sb.Node] = ref{id: sb.EventID}
		}
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
