package events

import (
	"fmt"
	"time"
)

// Planned moves: a switchover or a node's standby that an operator asks for
// ahead of a maintenance. Moving the floating address ends every call in
// progress on the old holder, so by default the arbiter waits until the
// holder has drained (reports at most the group's drain limit of active
// channels) before it moves, up to a deadline. Each stage of such a move is
// recorded as a PlannedMove citing the operator's request.

// DrainMode says what a planned move does about the calls on the holder.
type DrainMode string

const (
	// DrainWait waits for the holder to drain and gives up at the
	// deadline (the default: no call is cut unless asked).
	DrainWait DrainMode = "wait"
	// DrainForceAfter waits for the holder to drain and moves anyway at
	// the deadline, cutting the calls still up.
	DrainForceAfter DrainMode = "force_after"
	// DrainNow moves at once, cutting every call on the holder.
	DrainNow DrainMode = "now"
)

func (m DrainMode) valid() bool {
	switch m {
	case "", DrainWait, DrainForceAfter, DrainNow:
		return true
	}
	return false
}

// Bounds of a planned move's wait (--within). Above a day it is not a
// planned maintenance but a forgotten one.
const (
	MinDrainWithin = time.Second
	MaxDrainWithin = 24 * time.Hour
)

// validateDrain checks a request's drain fields.
func (r OperatorRequest) validateDrain() error {
	if !r.Drain.valid() {
		return fmt.Errorf("%w: drain %q (want wait, force_after or now)", ErrInvalidField, r.Drain)
	}
	planned := r.Verb == OpSwitchover || r.Verb == OpNodeStandby
	if r.Drain != "" && !planned {
		return fmt.Errorf("%w: drain applies to switchover and node standby only", ErrInvalidField)
	}
	if r.WithinMS != 0 {
		d := time.Duration(r.WithinMS) * time.Millisecond
		switch {
		case !planned:
			return fmt.Errorf("%w: within applies to switchover and node standby only", ErrInvalidField)
		case r.Drain == DrainNow:
			return fmt.Errorf("%w: within makes no sense with drain now", ErrInvalidField)
		case d < MinDrainWithin || d > MaxDrainWithin:
			return fmt.Errorf("%w: within %v, want between %v and %v", ErrInvalidField, d, MinDrainWithin, MaxDrainWithin)
		}
	}
	if r.Cancel && (r.Verb != OpSwitchover || r.Drain != "" || r.WithinMS != 0) {
		return fmt.Errorf("%w: cancel applies to a switchover only, without drain or within", ErrInvalidField)
	}
	return nil
}

// TypePlannedMove is the wire name of PlannedMove.
const TypePlannedMove Type = "arbiter.planned_move"

func init() {
	register(TypePlannedMove, func() Decoded { return &PlannedMove{} })
}

// PlannedStage is a stage of a planned move.
type PlannedStage string

const (
	// PlannedWaiting: the holder has more active channels than the limit
	// (or does not report them); recorded when the wait starts and, while
	// the count changes, at most once a minute.
	PlannedWaiting PlannedStage = "waiting"
	// PlannedMoved: the move is decided (the decision that follows cites it).
	PlannedMoved PlannedStage = "moved"
	// PlannedGaveUp: the deadline passed without a drain (drain wait), or
	// no node could take the group by then; nothing moved.
	PlannedGaveUp PlannedStage = "gave_up"
	// PlannedCancelled: an operator cancelled the wait.
	PlannedCancelled PlannedStage = "cancelled"
	// PlannedOverridden: the holder went down (or lost the group) while the
	// move waited; the failover, not the planned move, decides.
	PlannedOverridden PlannedStage = "overridden"
)

func (s PlannedStage) valid() bool {
	switch s {
	case PlannedWaiting, PlannedMoved, PlannedGaveUp, PlannedCancelled, PlannedOverridden:
		return true
	}
	return false
}

// PlannedFacts are what every stage of a planned move, and the group's
// status while it waits, say about it.
type PlannedFacts struct {
	// Verb is what the operator asked: switchover or node_standby.
	Verb OperatorVerb `json:"verb"`
	From string       `json:"from"`
	// To is the switchover's target; for a standby, the node chosen when
	// the move is decided (empty before).
	To       string `json:"to,omitempty"`
	Operator string `json:"operator"`
	// RequestID is the operator's request as recorded (OperatorAction,
	// stage requested).
	RequestID   string    `json:"request_id"`
	RequestedAt time.Time `json:"requested_at"`
	Deadline    time.Time `json:"deadline"`
	Drain       DrainMode `json:"drain"`
	// MaxChannels is the group's drain limit; Channels the holder's active
	// channels (absent: not reported, which is not drained).
	MaxChannels int  `json:"max_channels"`
	Channels    *int `json:"channels,omitempty"`
	// Calls is the holder's calls by its current calls summary (one heard
	// within three of its intervals), when there is one: Channels is then
	// the summary's, and the drain waits only for Calls.Uncarried(), the
	// channels of calls a new holder cannot carry across (anchored,
	// incomplete, unrecorded, or no call at all); the carriable ones move
	// with the group. Absent, Channels is the holder's prober's count and
	// every channel is waited for.
	Calls *HolderCalls `json:"calls,omitempty"`
}

// PlannedMove records one stage of a planned move, with the holder's
// channels at that stage. CausedBy starts with the operator's action (the
// record of the request's outcome), so that explain shows who asked and
// why the move happened when it did.
type PlannedMove struct {
	Group string       `json:"group"`
	Stage PlannedStage `json:"stage"`
	PlannedFacts
	Reason   string   `json:"reason"`
	CausedBy []string `json:"caused_by"`
	// Trigger, Input, InputAudit and InputLive are as on ArbiterDecision:
	// what the decision core was doing when it recorded this stage, for
	// `fanctl replay`.
	Trigger    Trigger `json:"trigger,omitempty"`
	Input      string  `json:"input,omitempty"`
	InputAudit string  `json:"input_audit,omitempty"`
	InputLive  string  `json:"input_live,omitempty"`
}

func (PlannedMove) EventType() Type    { return TypePlannedMove }
func (PlannedMove) SchemaVersion() int { return 1 }
func (p PlannedMove) subject(e Envelope) string {
	return PlannedMoveSubject(e.Cluster, p.Group)
}

func (p PlannedMove) Validate() error {
	if err := ValidToken("group", p.Group); err != nil {
		return err
	}
	if !p.Stage.valid() {
		return fmt.Errorf("%w: stage %q", ErrInvalidField, p.Stage)
	}
	if p.Verb != OpSwitchover && p.Verb != OpNodeStandby {
		return fmt.Errorf("%w: verb %q (a planned move is a switchover or a node standby)", ErrInvalidField, p.Verb)
	}
	if err := ValidToken("from", p.From); err != nil {
		return err
	}
	if p.To != "" {
		if err := ValidToken("to", p.To); err != nil {
			return err
		}
	}
	if p.Operator == "" {
		return fmt.Errorf("%w: operator", ErrMissingField)
	}
	if p.RequestID == "" {
		return fmt.Errorf("%w: request_id", ErrMissingField)
	}
	if !p.Drain.valid() || p.Drain == "" {
		return fmt.Errorf("%w: drain %q", ErrInvalidField, p.Drain)
	}
	if p.Reason == "" {
		return fmt.Errorf("%w: reason", ErrMissingField)
	}
	if len(p.CausedBy) == 0 {
		return fmt.Errorf("%w: caused_by (every stage cites the operator's request)", ErrMissingField)
	}
	if err := firstErr(
		textIn("reason", p.Reason, MaxTextLen),
		textIn("operator", p.Operator, MaxOperatorLen),
		textIn("request_id", p.RequestID, MaxShortLen),
		textIn("input", p.Input, MaxTextLen),
		listIn("caused_by", len(p.CausedBy), MaxListLen),
		intIn("max_channels", p.MaxChannels, -MaxCount, MaxCount),
	); err != nil {
		return err
	}
	if p.Channels != nil {
		if err := intIn("channels", *p.Channels, 0, MaxCount); err != nil {
			return err
		}
	}
	if p.Calls != nil {
		return p.Calls.Validate()
	}
	return nil
}

// PlannedMoveSubject carries the stages of the planned moves of one group.
func PlannedMoveSubject(cluster, group string) string {
	return EventRoot + "." + cluster + ".arbiter." + group + ".planned"
}

// PlannedStatus is a planned move that waits, as the group's status shows
// it, with the holder's channels now.
type PlannedStatus struct {
	PlannedFacts
	// GaveUp is set, for a standby, once the wait gave up: the holder keeps
	// the group (and stays in standby) until an operator acts.
	GaveUp bool `json:"gave_up,omitempty"`
}
