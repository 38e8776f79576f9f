package events

import (
	"fmt"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
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
	register(TypeOperatorAction, func() Decoded { return &OperatorAction{} })
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
	// OpUnpin clears a group's pin (pin.go): automatic failback may move
	// it again.
	OpUnpin OperatorVerb = "unpin"
	// OpLeadersHold and OpLeadersRelease hold the raft leaders and the
	// arbiter's lease where they are (or on Server) for a while, and end
	// that hold (hold.go). The arbiter leader answers them; its decision
	// core has no part in them.
	OpLeadersHold    OperatorVerb = "leaders_hold"
	OpLeadersRelease OperatorVerb = "leaders_release"
)

// ForLeaders reports whether v is answered by the arbiter leader's steward
// side (the leaders hold) rather than its decision core.
func (v OperatorVerb) ForLeaders() bool { return v == OpLeadersHold || v == OpLeadersRelease }

func (v OperatorVerb) valid() bool {
	switch v {
	case OpSwitchover, OpFailback, OpMaintenanceOn, OpMaintenanceOff, OpNodeStandby, OpNodeActive, OpUnpin, OpLeadersHold, OpLeadersRelease:
		return true
	}
	return false
}

// Bounds of an operator request's free text. A request is small; one that
// is not is a mistake or an attack, and is refused before anything is done
// (the whole request must fit, recorded, in one audit event).
const (
	MaxReasonChars  = 500
	MaxCommentChars = 200
	MaxOperatorLen  = 64
)

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
	// Operator names who asked. The arbiter does not believe it: it
	// records the operator whose request subject the request arrived on
	// (OperatorFromSubject), which the bus's permissions bind to that
	// operator's credentials.
	Operator string `json:"operator"`
	// Comment is free text the operator adds (fanctl --as), recorded as a
	// comment and never as who asked.
	Comment string `json:"comment,omitempty"`
	// Drain is a planned move's policy (switchover, node standby): empty
	// is DrainWait.
	Drain DrainMode `json:"drain,omitempty"`
	// WithinMS bounds the wait for the holder to drain; 0 takes the
	// group's planned.drain_within.
	WithinMS int64 `json:"within_ms,omitempty"`
	// Cancel, on a switchover, cancels the group's waiting planned move
	// instead of asking for one; Node may then be empty.
	Cancel bool `json:"cancel,omitempty"`
	// ForMS or Until end what the request starts by itself: a
	// switchover's pin (empty: it lasts until cleared; pin.go), a leaders
	// hold (one is required; hold.go).
	ForMS int64     `json:"for_ms,omitempty"`
	Until time.Time `json:"until,omitzero"`
	// Server, on a leaders hold, is the NATS server the steward keeps the
	// leaders on meanwhile (empty: it moves none).
	Server string `json:"server,omitempty"`
}

// Validate checks the request's shape and bounds; whether it can be done is
// the arbiter's call.
func (r OperatorRequest) Validate() error {
	if err := r.validateShape(); err != nil {
		return err
	}
	if err := r.validateDrain(); err != nil {
		return err
	}
	if err := r.validateLifetime(); err != nil {
		return err
	}
	if n := utf8.RuneCountInString(r.Reason); n > MaxReasonChars {
		return fmt.Errorf("%w: reason is %d characters, at most %d are recorded", ErrInvalidField, n, MaxReasonChars)
	}
	if n := utf8.RuneCountInString(r.Comment); n > MaxCommentChars {
		return fmt.Errorf("%w: comment (--as) is %d characters, at most %d are recorded", ErrInvalidField, n, MaxCommentChars)
	}
	if len(r.Operator) > MaxOperatorLen {
		return fmt.Errorf("%w: operator is %d bytes, at most %d", ErrInvalidField, len(r.Operator), MaxOperatorLen)
	}
	for field, v := range map[string]string{"reason": r.Reason, "comment": r.Comment, "operator": r.Operator} {
		if !utf8.ValidString(v) || strings.ContainsFunc(v, unicode.IsControl) {
			return fmt.Errorf("%w: %s holds control characters or invalid UTF-8", ErrInvalidField, field)
		}
	}
	return nil
}

// validateShape checks what every request and every recorded action must
// have. Recorded actions are not held to the request bounds, which came
// later: a trail written before them still decodes.
func (r OperatorRequest) validateShape() error {
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
		if r.Verb == OpSwitchover && r.Cancel && r.Node == "" {
			break // a cancel names the group; the arbiter knows the target
		}
		if err := ValidToken("node", r.Node); err != nil {
			return err
		}
	case OpUnpin:
		if r.Node != "" {
			return fmt.Errorf("%w: node (an unpin names the group; the arbiter knows the pin)", ErrInvalidField)
		}
	case OpLeadersHold, OpLeadersRelease:
		if r.Group != "" || r.Node != "" {
			return fmt.Errorf("%w: group and node (a leaders hold is the cluster's)", ErrInvalidField)
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
	Verb   OperatorVerb `json:"verb"`
	Group  string       `json:"group,omitempty"`
	Node   string       `json:"node,omitempty"`
	Reason string       `json:"reason,omitempty"`
	// Operator is who asked: the operator of the request subject.
	Operator string `json:"operator"`
	// Comment is the requester's free text (fanctl --as), kept apart from
	// Operator.
	Comment  string `json:"comment,omitempty"`
	Accepted bool   `json:"accepted"`
	Outcome  string `json:"outcome"`
	// Stage is StageRequested on the record the arbiter stores before it
	// acts on a request (it refuses a request it cannot record), and empty
	// on the record of what it did, which is caused by the first.
	Stage string `json:"stage,omitempty"`
	// Drain, WithinMS and Cancel are the request's, as asked; so are
	// ForMS, Until and Server.
	Drain    DrainMode `json:"drain,omitempty"`
	WithinMS int64     `json:"within_ms,omitempty"`
	Cancel   bool      `json:"cancel,omitempty"`
	ForMS    int64     `json:"for_ms,omitempty"`
	Until    time.Time `json:"until,omitzero"`
	Server   string    `json:"server,omitempty"`
	// Input, on the outcome's record, is the id of the last stored event
	// the arbiter had read when it acted (as on ArbiterDecision), so that
	// `fanctl replay` applies the action at the same point; InputAudit
	// and InputLive are its place in each stream (as on ArbiterDecision).
	Input      string `json:"input,omitempty"`
	InputAudit string `json:"input_audit,omitempty"`
	InputLive  string `json:"input_live,omitempty"`
}

// StageRequested marks an OperatorAction that records a request before
// anything is done about it.
const StageRequested = "requested"

// MaxRequestBytes bounds an encoded OperatorRequest; the arbiter refuses a
// bigger one before decoding it.
const MaxRequestBytes = 4096

// OperatorAnswerWithin is how long a client waits for the arbiter leader's
// answer by default. The leader answers only after the request is stored
// in the audit trail (at most 2 s), its state persisted (at most 2 s) and
// each command of the decision published (at most 2 s each; a move has at
// most two): a client that gave up sooner could report "no answer" for an
// action that was taken.
const OperatorAnswerWithin = 10 * time.Second

func (OperatorAction) EventType() Type    { return TypeOperatorAction }
func (OperatorAction) SchemaVersion() int { return 1 }
func (a OperatorAction) subject(e Envelope) string {
	return OperatorActionSubject(e.Cluster)
}

func (a OperatorAction) Validate() error {
	r := OperatorRequest{Verb: a.Verb, Group: a.Group, Node: a.Node, Reason: a.Reason, Operator: a.Operator, Cancel: a.Cancel}
	if err := r.validateShape(); err != nil {
		return err
	}
	if a.Outcome == "" {
		return fmt.Errorf("%w: outcome", ErrMissingField)
	}
	return nil
}

// OperatorRequestSubject is where one operator's requests go. The operator's
// name is part of the subject so that the bus's permissions, which let each
// operator's credentials publish only their own subject, make the name an
// identity: the arbiter records the operator it reads from the subject, never
// one a request names for itself.
func OperatorRequestSubject(cluster, operator string) string {
	return RequestRoot + "." + cluster + ".arbiter.operate." + operator
}

// AllOperatorRequests matches every operator's requests in a cluster (what
// the arbiter listens to).
func AllOperatorRequests(cluster string) string {
	return RequestRoot + "." + cluster + ".arbiter.operate.*"
}

// OperatorFromSubject returns the operator whose credentials sent a request
// on subject, or an error when subject is not one operator's request subject
// of cluster.
func OperatorFromSubject(cluster, subject string) (string, error) {
	prefix := RequestRoot + "." + cluster + ".arbiter.operate."
	op, ok := strings.CutPrefix(subject, prefix)
	if !ok {
		return "", fmt.Errorf("%w: subject %q is not an operator request subject of cluster %s", ErrSubjectMismatch, subject, cluster)
	}
	if err := ValidToken("operator", op); err != nil {
		return "", fmt.Errorf("%w: subject %q: %v", ErrSubjectMismatch, subject, err)
	}
	return op, nil
}

// OperatorActionSubject carries the record of every operator action.
func OperatorActionSubject(cluster string) string {
	return EventRoot + "." + cluster + ".operator.action"
}
