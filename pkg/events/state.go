package events

import "time"

// GroupStatus is the arbiter leader's view of one group, kept in the state
// bucket under GroupStatusKey so that fanctl, executors and a new leader can
// read it without replaying the stream.
type GroupStatus struct {
	Group     string    `json:"group"`
	Addresses []string  `json:"addresses"`
	Holder    string    `json:"holder,omitempty"`
	Epoch     uint64    `json:"epoch"`
	Since     time.Time `json:"since,omitzero"`
	// LastDecision is the id of the decision that set the holder.
	LastDecision string                `json:"last_decision,omitempty"`
	Nodes        map[string]NodeStatus `json:"nodes"`
	UpdatedAt    time.Time             `json:"updated_at"`
	// Frozen is why the arbiter makes no automatic move in this group
	// (maintenance, or too many moves in an hour); empty when it may.
	Frozen string `json:"frozen,omitempty"`
	// Situation is the last "decided not to move" explained.
	Situation string `json:"situation,omitempty"`
	// NeedsHuman is set while the standing hold is one the arbiter cannot
	// resolve alone (the situation says why).
	NeedsHuman bool `json:"needs_human,omitempty"`
	// PermitUntil is the end of the failback permit in force, if any.
	PermitUntil time.Time `json:"permit_until,omitzero"`
	// MovesLastHour counts the automatic moves the flap cap looks at.
	MovesLastHour int `json:"moves_last_hour,omitempty"`
	// Planned is the operator's planned move waiting for the holder to
	// drain (or, for a standby, one that gave up), if any.
	Planned *PlannedStatus `json:"planned,omitempty"`
	// Pin is the operator's pin of the group to a node, if one is in
	// force: no automatic failback moves the group off it (pin.go).
	Pin *PinStatus `json:"pin,omitempty"`
}

// NodeStatus is one node as the arbiter sees it.
type NodeStatus struct {
	Health        Health    `json:"health"`
	HealthSince   time.Time `json:"health_since,omitzero"`
	LastHeartbeat time.Time `json:"last_heartbeat,omitzero"`
	Silent        bool      `json:"silent"`
	Priority      int       `json:"priority"`
	// Standby: an operator barred the node from holding anything.
	Standby bool `json:"standby,omitempty"`
	// Eligible: healthy, heard and not in standby (may be given the group).
	Eligible bool `json:"eligible,omitempty"`
}

// StateKeyPrefix starts every key of the state bucket written by fan.
const StateKeyPrefix = "group"

// GroupStatusKey is the state-bucket key of one group's status.
func GroupStatusKey(cluster, group string) string {
	return StateKeyPrefix + "." + cluster + "." + group
}

// AllGroupStatusKeys matches every group's status key in a cluster.
func AllGroupStatusKeys(cluster string) string { return StateKeyPrefix + "." + cluster + ".*" }

// ArbiterStateKey is where the arbiter leader keeps its full decision state,
// so that a successor continues from the same holder and outstanding claim.
func ArbiterStateKey(cluster string) string { return "arbiter." + cluster + ".state" }
