package events

import (
	"encoding/json"
	"fmt"
)

// TypeArbiterTerm is the wire name of ArbiterTerm.
const TypeArbiterTerm Type = "arbiter.term"

func init() {
	register(TypeArbiterTerm, func() Decoded { return &ArbiterTerm{} })
}

// ArbiterTerm records that an arbiter replica began to command under a new
// lease term, with the decision state it restored (what its predecessor
// persisted). It is the point from which `fanctl replay` knows the
// arbiter's state exactly, so a replay can begin at any term, not only at
// an arbiter's start. The envelope's epoch is the term.
type ArbiterTerm struct {
	// State is the arbiter's persisted decision state as it was restored
	// (the record under ArbiterStateKey, without its per-node view), kept
	// opaque here: its shape belongs to the arbiter.
	State json.RawMessage `json:"state"`
	// Input is the id of the last stored event the arbiter had read;
	// InputAudit and InputLive its place in each stream (as on
	// ArbiterDecision).
	Input      string `json:"input,omitempty"`
	InputAudit string `json:"input_audit,omitempty"`
	InputLive  string `json:"input_live,omitempty"`
	// Since is the id of the first live event this replica read (failback
	// permits, read from each group's last, aside): its view of the nodes
	// begins there, and so does a replay's that starts at this term.
	Since string `json:"since,omitempty"`
	// Policy is a digest of the decision policy the term runs under, so
	// that a replay under another configuration is told so.
	Policy string `json:"policy,omitempty"`
}

func (ArbiterTerm) EventType() Type    { return TypeArbiterTerm }
func (ArbiterTerm) SchemaVersion() int { return 1 }
func (ArbiterTerm) requiresEpoch()     {}
func (t ArbiterTerm) subject(e Envelope) string {
	return TermSubject(e.Cluster)
}

func (t ArbiterTerm) Validate() error {
	if len(t.State) == 0 {
		return fmt.Errorf("%w: state", ErrMissingField)
	}
	if !json.Valid(t.State) || t.State[0] != '{' {
		return fmt.Errorf("%w: state is not a JSON object", ErrInvalidField)
	}
	return nil
}

// TermSubject carries the arbiter's term starts.
func TermSubject(cluster string) string {
	return EventRoot + "." + cluster + ".arbiter.term"
}
