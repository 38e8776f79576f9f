package events

import (
	"fmt"
	"time"
)

// Leaders holds: the arbiter's steward keeps JetStream's raft leaders on
// the servers of bus.leader_servers, and a standby replica hands the
// arbiter's lease back to a replica that is not one. Before work on those
// servers (a reboot of the witness), an operator holds both for a while
// (OpLeadersHold, fanctl leaders hold): the steward moves no leader but
// onto the hold's server, if it names one, and a standby that leads keeps
// the lease. A hold always ends by itself, within MaxLeadersHold; an
// operator releases it sooner (OpLeadersRelease), and the steward ends it
// early only when keeping it would cost a failover (Why says which case).
// The hold in force is a LeadersHoldRecord in the state bucket, written by
// the arbiter leader alone; each start and end is a LeadersHold event.

// Bounds of a leaders hold. Beyond a day it is not a maintenance but a
// forgotten one: the steward's placement is what makes a PBX host's crash
// cost no election.
const (
	MinLeadersHold = time.Minute
	MaxLeadersHold = 24 * time.Hour
)

// TypeLeadersHold is the wire name of LeadersHold.
const TypeLeadersHold Type = "arbiter.leaders_hold"

func init() {
	register(TypeLeadersHold, func() Decoded { return &LeadersHold{} })
}

// HoldStage is what a LeadersHold records.
type HoldStage string

const (
	HoldStarted HoldStage = "held"
	HoldEnded   HoldStage = "ended"
)

// HoldEnd says how a leaders hold ended.
type HoldEnd string

const (
	// HoldReleased: an operator released it (fanctl leaders release).
	HoldReleased HoldEnd = "released"
	// HoldReplaced: an operator held the leaders again, with a new end.
	HoldReplaced HoldEnd = "replaced"
	// HoldExpired: its end came.
	HoldExpired HoldEnd = "expired"
	// HoldBroken: the steward ended it because keeping it would cost a
	// failover (LeadersHold.Why names the case).
	HoldBroken HoldEnd = "broken"
)

func (e HoldEnd) valid() bool {
	switch e {
	case HoldReleased, HoldReplaced, HoldExpired, HoldBroken:
		return true
	}
	return false
}

// LeadersHoldFacts are what a hold's records and status say about it.
type LeadersHoldFacts struct {
	Operator string `json:"operator"`
	Reason   string `json:"reason,omitempty"`
	Comment  string `json:"comment,omitempty"`
	// Server is the NATS server (server_name) the steward keeps the
	// leaders on meanwhile; empty: it moves none.
	Server string    `json:"server,omitempty"`
	Since  time.Time `json:"since"`
	Until  time.Time `json:"until"`
	// HeldSince is since when the leaders have been held without a gap:
	// a hold that replaces one in force carries it over, so a hold renewed
	// again and again still shows its age.
	HeldSince time.Time `json:"held_since"`
	// RequestID and ActionID are the operator's request as recorded before
	// anything was done, and the record of its outcome.
	RequestID string `json:"request_id"`
	ActionID  string `json:"action_id"`
}

func (f LeadersHoldFacts) validate() error {
	switch {
	case f.Operator == "":
		return fmt.Errorf("%w: operator", ErrMissingField)
	case f.RequestID == "" || f.ActionID == "":
		return fmt.Errorf("%w: request_id and action_id", ErrMissingField)
	case f.Since.IsZero() || f.Until.IsZero() || f.HeldSince.IsZero():
		return fmt.Errorf("%w: since, until and held_since", ErrMissingField)
	case !f.Until.After(f.Since):
		return fmt.Errorf("%w: until is not after since", ErrInvalidField)
	case f.Until.Sub(f.Since) > MaxLeadersHold:
		return fmt.Errorf("%w: a hold of %v, at most %v", ErrInvalidField, f.Until.Sub(f.Since), MaxLeadersHold)
	case f.HeldSince.After(f.Since):
		return fmt.Errorf("%w: held_since after since", ErrInvalidField)
	}
	if f.Server != "" {
		if err := ValidToken("server", f.Server); err != nil {
			return err
		}
	}
	return firstErr(
		textIn("operator", f.Operator, MaxOperatorLen),
		textIn("reason", f.Reason, MaxTextLen),
		textIn("comment", f.Comment, MaxTextLen),
		textIn("request_id", f.RequestID, MaxShortLen),
		textIn("action_id", f.ActionID, MaxShortLen),
	)
}

// LeadersHold records a leaders hold's start or end.
type LeadersHold struct {
	Stage HoldStage `json:"stage"`
	LeadersHoldFacts
	End HoldEnd `json:"end,omitempty"`
	Why string  `json:"why"`
	// CausedBy: the operator's action (held, released, replaced), the
	// hold's start (expired, broken).
	CausedBy []string `json:"caused_by"`
}

func (LeadersHold) EventType() Type    { return TypeLeadersHold }
func (LeadersHold) SchemaVersion() int { return 1 }
func (LeadersHold) subject(e Envelope) string {
	return LeadersHoldSubject(e.Cluster)
}

func (h LeadersHold) Validate() error {
	switch h.Stage {
	case HoldStarted:
		if h.End != "" {
			return fmt.Errorf("%w: end %q on a hold that starts", ErrInvalidField, h.End)
		}
	case HoldEnded:
		if !h.End.valid() {
			return fmt.Errorf("%w: end %q", ErrInvalidField, h.End)
		}
	default:
		return fmt.Errorf("%w: stage %q", ErrInvalidField, h.Stage)
	}
	if err := h.LeadersHoldFacts.validate(); err != nil {
		return err
	}
	if h.Why == "" {
		return fmt.Errorf("%w: why", ErrMissingField)
	}
	if len(h.CausedBy) == 0 {
		return fmt.Errorf("%w: caused_by", ErrMissingField)
	}
	return firstErr(textIn("why", h.Why, MaxTextLen), listIn("caused_by", len(h.CausedBy), MaxListLen))
}

// Causes are the events the record names as its causes.
func (h LeadersHold) Causes() []string { return h.CausedBy }

// LeadersHoldSubject carries the leaders holds of a cluster.
func LeadersHoldSubject(cluster string) string {
	return EventRoot + "." + cluster + ".arbiter.leaders_hold"
}

// LeadersHoldKey is the state-bucket key of a cluster's leaders hold: the
// last one, in force until its Until unless it has ended (EndedAt).
func LeadersHoldKey(cluster string) string { return "arbiter." + cluster + ".leaders_hold" }

// LeadersHoldRecord is the leaders hold as the state bucket keeps it.
type LeadersHoldRecord struct {
	LeadersHoldFacts
	// EventID is the hold's start (LeadersHold, stage held).
	EventID string `json:"event_id"`
	// EndedAt, End, Why and EndEventID say how it ended; zero while it is
	// in force (until Until).
	EndedAt    time.Time `json:"ended_at,omitzero"`
	End        HoldEnd   `json:"end,omitempty"`
	Why        string    `json:"why,omitempty"`
	EndEventID string    `json:"end_event_id,omitempty"`
}

// InForce reports whether the hold holds at now.
func (r LeadersHoldRecord) InForce(now time.Time) bool {
	return r.EndedAt.IsZero() && !r.Since.IsZero() && now.Before(r.Until)
}
