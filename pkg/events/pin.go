package events

import (
	"fmt"
	"time"
)

// Pins: a group an operator moved stays where it was moved. A switchover
// pins its group to its target once the move is decided: no automatic
// failback moves it away until the pin ends, which it does when an
// operator clears it (OpUnpin, fanctl switchover --clear) or moves the
// group elsewhere, at its end if one was asked (for_ms, until), or when its
// node fails and the group fails over. Each start and end is a GroupPin
// the arbiter's decision core records, citing what caused it, and the
// group's status shows the pin in force (PinStatus).

// Bounds of a pin's asked lifetime (--for, --until). A pin without one
// lasts until it is cleared; the alert rules ask about a pin older than a
// day either way.
const (
	MinPinFor = time.Minute
	MaxPinFor = 30 * 24 * time.Hour
)

// TypeGroupPin is the wire name of GroupPin.
const TypeGroupPin Type = "arbiter.pin"

func init() {
	register(TypeGroupPin, func() Decoded { return &GroupPin{} })
}

// PinStage is what a GroupPin records: a pin's start or its end.
type PinStage string

const (
	PinStarted PinStage = "started"
	PinEnded   PinStage = "ended"
)

// PinEnd says how a pin ended.
type PinEnd string

const (
	// PinCleared: an operator cleared it (fanctl switchover --clear).
	PinCleared PinEnd = "cleared"
	// PinReplaced: an operator moved the group elsewhere (another
	// switchover, which pins anew, a manual failback, a standby of the
	// pinned node).
	PinReplaced PinEnd = "replaced"
	// PinExpired: the lifetime it was asked with ran out.
	PinExpired PinEnd = "expired"
	// PinFailed: its node failed and the group moved off it (a failover,
	// or the claim on it failing).
	PinFailed PinEnd = "failed"
	// PinLost: the group moved off its node for another reason the
	// arbiter took alone (placed elsewhere after it had no holder).
	PinLost PinEnd = "lost"
)

func (e PinEnd) valid() bool {
	switch e {
	case PinCleared, PinReplaced, PinExpired, PinFailed, PinLost:
		return true
	}
	return false
}

// PinFacts are what every record of a pin and the group's status say
// about it.
type PinFacts struct {
	// Node is the node the group is pinned to: the switchover's target.
	Node string `json:"node"`
	// Operator asked for the switchover; Reason is theirs.
	Operator string `json:"operator"`
	Reason   string `json:"reason,omitempty"`
	// RequestID is the switchover as recorded before anything was done
	// (OperatorAction, stage requested); ActionID the record of its
	// outcome, which every decision of the move cites.
	RequestID string `json:"request_id"`
	ActionID  string `json:"action_id"`
	// Since is when the pin began: the switchover's decision.
	Since time.Time `json:"since"`
	// Until is when it ends by itself; zero: only when cleared.
	Until time.Time `json:"until,omitzero"`
}

func (f PinFacts) validate() error {
	if err := ValidToken("node", f.Node); err != nil {
		return err
	}
	switch {
	case f.Operator == "":
		return fmt.Errorf("%w: operator", ErrMissingField)
	case f.RequestID == "" || f.ActionID == "":
		return fmt.Errorf("%w: request_id and action_id (a pin names the switchover that made it)", ErrMissingField)
	case f.Since.IsZero():
		return fmt.Errorf("%w: since", ErrMissingField)
	case !f.Until.IsZero() && !f.Until.After(f.Since):
		return fmt.Errorf("%w: until %s is not after since %s", ErrInvalidField, f.Until.Format(time.RFC3339), f.Since.Format(time.RFC3339))
	case !f.Until.IsZero() && f.Until.Sub(f.Since) > MaxPinFor:
		return fmt.Errorf("%w: a pin of %v, at most %v", ErrInvalidField, f.Until.Sub(f.Since), MaxPinFor)
	}
	return firstErr(
		textIn("operator", f.Operator, MaxOperatorLen),
		textIn("reason", f.Reason, MaxTextLen),
		textIn("request_id", f.RequestID, MaxShortLen),
		textIn("action_id", f.ActionID, MaxShortLen),
	)
}

// GroupPin records a pin's start or end. CausedBy starts with what made it
// so: the switchover's decision (started), the operator's action (cleared,
// replaced by an operator's move: the move's decision), the decision that
// moved the group off a failed node (failed), or the pin's start (expired).
type GroupPin struct {
	Group string   `json:"group"`
	Stage PinStage `json:"stage"`
	PinFacts
	// End says how it ended (stage ended only).
	End PinEnd `json:"end,omitempty"`
	// Why says it in a sentence, for the trail.
	Why      string   `json:"why"`
	CausedBy []string `json:"caused_by"`
	// Trigger, Input, InputAudit and InputLive are as on ArbiterDecision,
	// for `fanctl replay`.
	Trigger    Trigger `json:"trigger,omitempty"`
	Input      string  `json:"input,omitempty"`
	InputAudit string  `json:"input_audit,omitempty"`
	InputLive  string  `json:"input_live,omitempty"`
}

func (GroupPin) EventType() Type    { return TypeGroupPin }
func (GroupPin) SchemaVersion() int { return 1 }
func (p GroupPin) subject(e Envelope) string {
	return PinSubject(e.Cluster, p.Group)
}

func (p GroupPin) Validate() error {
	if err := ValidToken("group", p.Group); err != nil {
		return err
	}
	switch p.Stage {
	case PinStarted:
		if p.End != "" {
			return fmt.Errorf("%w: end %q on a pin that starts", ErrInvalidField, p.End)
		}
	case PinEnded:
		if !p.End.valid() {
			return fmt.Errorf("%w: end %q", ErrInvalidField, p.End)
		}
	default:
		return fmt.Errorf("%w: stage %q", ErrInvalidField, p.Stage)
	}
	if err := p.PinFacts.validate(); err != nil {
		return err
	}
	if p.Why == "" {
		return fmt.Errorf("%w: why", ErrMissingField)
	}
	if len(p.CausedBy) == 0 {
		return fmt.Errorf("%w: caused_by (a pin's start and end each cite their cause)", ErrMissingField)
	}
	return firstErr(
		textIn("why", p.Why, MaxTextLen),
		textIn("input", p.Input, MaxTextLen),
		listIn("caused_by", len(p.CausedBy), MaxListLen),
	)
}

// Causes are the events the record names as its causes (what fanctl
// explain walks).
func (p GroupPin) Causes() []string { return p.CausedBy }

// PinSubject carries the pins of one group.
func PinSubject(cluster, group string) string {
	return EventRoot + "." + cluster + ".arbiter." + group + ".pin"
}

// PinStatus is the pin in force, as the group's status shows it.
type PinStatus struct {
	PinFacts
	// EventID is the pin's start (GroupPin, stage started).
	EventID string `json:"event_id"`
}

// validateLifetime checks a request's for_ms, until and server: a
// switchover's pin, a leaders hold's length and place. Whether an until
// lies in the future is the arbiter's call, on its clock.
func (r OperatorRequest) validateLifetime() error {
	if r.ForMS != 0 && !r.Until.IsZero() {
		return fmt.Errorf("%w: for and until both given (one end, please)", ErrInvalidField)
	}
	if r.ForMS < 0 {
		return fmt.Errorf("%w: for %dms", ErrInvalidField, r.ForMS)
	}
	d := time.Duration(r.ForMS) * time.Millisecond
	switch r.Verb {
	case OpSwitchover:
		switch {
		case r.Cancel && (r.ForMS != 0 || !r.Until.IsZero()):
			return fmt.Errorf("%w: a cancel takes no pin (for, until)", ErrInvalidField)
		case r.ForMS != 0 && (d < MinPinFor || d > MaxPinFor):
			return fmt.Errorf("%w: pin for %v, want between %v and %v", ErrInvalidField, d, MinPinFor, MaxPinFor)
		}
	case OpLeadersHold:
		switch {
		case r.ForMS == 0 && r.Until.IsZero():
			return fmt.Errorf("%w: for or until (a leaders hold always ends by itself, within %v)", ErrMissingField, MaxLeadersHold)
		case r.ForMS != 0 && (d < MinLeadersHold || d > MaxLeadersHold):
			return fmt.Errorf("%w: hold for %v, want between %v and %v", ErrInvalidField, d, MinLeadersHold, MaxLeadersHold)
		}
		if r.Server != "" {
			if err := ValidToken("server", r.Server); err != nil {
				return err
			}
		}
	default:
		if r.ForMS != 0 || !r.Until.IsZero() {
			return fmt.Errorf("%w: for and until apply to a switchover (its pin) and a leaders hold only", ErrInvalidField)
		}
	}
	if r.Server != "" && r.Verb != OpLeadersHold {
		return fmt.Errorf("%w: server applies to a leaders hold only", ErrInvalidField)
	}
	return nil
}
