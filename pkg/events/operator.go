package events

import (
	"fmt"
	"strings"
)

// Operator actions: an operator asks the arbiter leader over NATS
// request-reply (core NATS, never stored: a request nobody leads to answer
// fails at once instead of being applied late), and the leader records what
// was asked, by whom, and what it did as an OperatorAction event, which the
// decisions it causes cite.

// RequestRoot starts the request-reply subjects. Nothing under it is stored
// in a stream.
const RequestRoot = "fan.req"

// TypeOperatorAction is the wire name of OperatorAction.
const TypeOperatorAction Type = "operator.action"

func init() {
	register(TypeOperatorAction, func() Payload { return &OperatorAction{} })
}

// OperatorVerb names an operator action.
type OperatorVerb string

const (
	OpSwitchover     OperatorVerb = "switchover"      // move a group to Node now
	OpFailback       OperatorVerb = "failback"        // move a group back to its preferred node now
	OpMaintenanceOn  OperatorVerb = "maintenance_on"  // freeze a group (or the cluster when Group is empty)
	OpMaintenanceOff OperatorVerb = "maintenance_off" // unfreeze; for a group also clears a flap freeze
	OpNodeStandby    OperatorVerb = "node_standby"    // Node may not hold anything; its groups move away
	OpNodeActive     OperatorVerb = "node_active"     // Node may hold again
)

func (v OperatorVerb) valid() bool {
	switch v {
	case OpSwitchover, OpFailback, OpMaintenanceOn, OpMaintenanceOff, OpNodeStandby, OpNodeActive:
		return true
	}
	return false
}

// OperatorRequest is the body of a request on OperatorRequestSubject. It is
// not an event: the arbiter turns it into an OperatorAction.
type OperatorRequest struct {
	Verb OperatorVerb `json:"verb"`
	// Group is required for switchover and failback when the cluster has
	// more than one group; for maintenance, empty means the whole cluster.
	Group string `json:"group,omitempty"`
	// Node is the switchover target, or the node put in standby or back.
	Node   string `json:"node,omitempty"`
	Reason string `json:"reason,omitempty"`
	// Operator says who asked (user@host as fanctl sends it). The bus's
	// credentials decide who may ask at all; this names the person.
	Operator string `json:"operator"`
}

// Validate checks the request's shape; whether it can be done is the arbiter's call.
func (r OperatorRequest) Validate() error {
	if !r.Verb.valid() {
		return fmt.Errorf("%w: verb %q", ErrInvalidField, r.Verb)
	}
	if strings.TrimSpace(r.Operator) == "" {
		return fmt.Errorf("%w: operator (every action names who asked)", ErrMissingField)
	}
	if r.Group != "" {
		if err := ValidToken("group", r.Group); err != nil {
			return err
		}
	}
	switch r.Verb {
	case OpSwitchover, OpNodeStandby, OpNodeActive:
		if err := ValidToken("node", r.Node); err != nil {
			return err
		}
	}
	if r.Verb == OpFailback && strings.TrimSpace(r.Reason) == "" {
		return fmt.Errorf("%w: reason (a manual failback is recorded with its reason)", ErrMissingField)
	}
	return nil
}

// OperatorReply answers an OperatorRequest.
type OperatorReply struct {
	Accepted bool   `json:"accepted"`
	Message  string `json:"message"`
	// EventID is the OperatorAction recorded for this request (also when refused).
	EventID string `json:"event_id,omitempty"`
	// Decisions are the ids of the decisions the action caused.
	Decisions []string `json:"decisions,omitempty"`
	Leader    string   `json:"leader,omitempty"`
	Epoch     uint64   `json:"epoch,omitempty"`
}

// OperatorAction records an operator's request and what the arbiter did
// with it, accepted or not.
type OperatorAction struct {
	Verb     OperatorVerb `json:"verb"`
	Group    string       `json:"group,omitempty"`
	Node     string       `json:"node,omitempty"`
	Reason   string       `json:"reason,omitempty"`
	Operator string       `json:"operator"`
	Accepted bool         `json:"accepted"`
	Outcome  string       `json:"outcome"`
}

func (OperatorAction) EventType() Type    { return TypeOperatorAction }
func (OperatorAction) SchemaVersion() int { return 1 }
func (a OperatorAction) subject(e Envelope) string {
	return OperatorActionSubject(e.Cluster)
}

func (a OperatorAction) Validate() error {
	r := OperatorRequest{Verb: a.Verb, Group: a.Group, Node: a.Node, Reason: a.Reason, Operator: a.Operator}
	if err := r.Validate(); err != nil {
		return err
	}
	if a.Outcome == "" {
		return fmt.Errorf("%w: outcome", ErrMissingField)
	}
	return nil
}

// OperatorRequestSubject is where the arbiter leader answers operator requests.
func OperatorRequestSubject(cluster string) string {
	return RequestRoot + "." + cluster + ".arbiter.operate"
}

// OperatorActionSubject carries the record of every operator action.
func OperatorActionSubject(cluster string) string {
	return EventRoot + "." + cluster + ".operator.action"
}
