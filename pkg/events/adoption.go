package events

import (
	"fmt"
	"maps"
	"slices"
	"time"
)

// What a node taking a group over did with the group's calls in progress
// (CallRecord): how many it adopted and keeps, and why it left the others.
// A claim's result carries it (CommandResult.Calls) when the read of the
// records ended within the claim; otherwise the result says Deferred and a
// CallsAdopted event citing the claim follows.

// TypeCallsAdopted is the event of an adoption reported apart from a claim's
// result.
const TypeCallsAdopted Type = "calls.adopted"

func init() {
	register(TypeCallsAdopted, func() Decoded { return &CallsAdopted{} })
}

// Reasons a call's record was not adopted (CallsAdoption.NotAdopted keys).
const (
	// NotAdoptedAnchored: its media flows through the PBX, so it ended with
	// the PBX; carrying its signalling would keep a silent call up.
	NotAdoptedAnchored = "anchored"
	// NotAdoptedIncomplete: the record lacks a dialog's identity (a leg, a
	// tag, a URI): no request could be sent in it.
	NotAdoptedIncomplete = "incomplete"
	// NotAdoptedInvalid: the record does not decode, does not match its
	// key, or names what a keeper refuses to send to (not UDP, no unicast
	// IPv4 destination, no CSeq left).
	NotAdoptedInvalid = "invalid"
	// NotAdoptedOverBound: keeping it would pass MaxCallsPerNode.
	NotAdoptedOverBound = "over_bound"
)

// NotAdoptedReasons lists every reason, in the order they are checked.
func NotAdoptedReasons() []string {
	return []string{NotAdoptedInvalid, NotAdoptedAnchored, NotAdoptedIncomplete, NotAdoptedOverBound}
}

// CallsAdoption is what a node did with a group's call records when it took
// the group.
type CallsAdoption struct {
	// Adopted counts the calls this node now keeps.
	Adopted int `json:"adopted"`
	// NotAdopted counts, by reason (NotAdoptedReasons), the calls it does
	// not keep. A call this node's own PBX has up is in neither.
	NotAdopted map[string]int `json:"not_adopted,omitempty"`
	// From names the nodes whose records were adopted.
	From []string `json:"from,omitempty"`
	// Deferred: the records were still being read when the claim ended; a
	// CallsAdopted event citing the claim reports the adoption.
	Deferred bool `json:"deferred,omitempty"`
	// Error: the records could not be read, or the calls not kept; nothing
	// was adopted.
	Error string `json:"error,omitempty"`
}

// NotAdoptedTotal is the number of calls not adopted, whatever the reason.
func (a CallsAdoption) NotAdoptedTotal() int {
	n := 0
	for _, c := range a.NotAdopted {
		n += c
	}
	return n
}

// Validate bounds the counts and the texts.
func (a CallsAdoption) Validate() error {
	if err := intIn("calls.adopted", a.Adopted, 0, MaxCallsPerNode); err != nil {
		return err
	}
	if err := listIn("calls.not_adopted", len(a.NotAdopted), MaxListLen); err != nil {
		return err
	}
	for _, r := range slices.Sorted(maps.Keys(a.NotAdopted)) {
		if err := ValidToken("calls.not_adopted reason", r); err != nil {
			return err
		}
		// Records are read without a bound of their own: a group may hold
		// more than a node keeps, but never more than a bus can carry.
		if err := intIn("calls.not_adopted."+r, a.NotAdopted[r], 0, MaxCount); err != nil {
			return err
		}
	}
	if err := listIn("calls.from", len(a.From), MaxListLen); err != nil {
		return err
	}
	for _, n := range a.From {
		if err := ValidToken("calls.from", n); err != nil {
			return err
		}
	}
	if a.Deferred && (a.Adopted != 0 || len(a.NotAdopted) != 0) {
		return fmt.Errorf("%w: calls: deferred with counts (they come in the calls.adopted event)", ErrInvalidField)
	}
	return textIn("calls.error", a.Error, MaxTextLen)
}

// CallsAdopted reports an adoption apart from a claim's result: the read of
// the records ended after the claim had (the result said Deferred), or the
// node took a group back without a claim (a re-sync after a restart).
type CallsAdopted struct {
	Group string `json:"group"`
	Node  string `json:"node"`
	// CommandID is the claim the adoption belongs to (also the envelope's
	// causation), empty when there was none.
	CommandID string        `json:"command_id,omitempty"`
	Calls     CallsAdoption `json:"calls"`
	At        time.Time     `json:"at"`
}

func (CallsAdopted) EventType() Type    { return TypeCallsAdopted }
func (CallsAdopted) SchemaVersion() int { return 1 }
func (c CallsAdopted) subject(e Envelope) string {
	return CallsAdoptedSubject(e.Cluster, c.Node)
}

// Only the node's own ipmover keeps calls for it.
func (c CallsAdopted) voiceOf(Envelope) string { return c.Node }

func (c CallsAdopted) Validate() error {
	if err := ValidToken("group", c.Group); err != nil {
		return err
	}
	if err := ValidToken("node", c.Node); err != nil {
		return err
	}
	if c.Calls.Deferred {
		return fmt.Errorf("%w: calls.deferred (this event is the adoption itself)", ErrInvalidField)
	}
	if c.At.IsZero() {
		return fmt.Errorf("%w: at", ErrMissingField)
	}
	return firstErr(textIn("command_id", c.CommandID, MaxShortLen), c.Calls.Validate())
}

// CallsAdoptedSubject carries one node's adoptions reported apart from a
// claim's result.
func CallsAdoptedSubject(cluster, node string) string {
	return EventRoot + "." + cluster + ".exec." + node + ".calls"
}

// AllCallsAdopted matches every node's adoption reports in a cluster.
func AllCallsAdopted(cluster string) string { return EventRoot + "." + cluster + ".exec.*.calls" }
