// Package fence decides whether a command may be applied: at most once per
// command id, never from an epoch older than one already seen, never after
// its deadline. The decision state survives restarts through a state file,
// because a restarted executor that forgot the highest epoch would accept a
// stale claim from a deposed arbiter leader and create a second holder.
//
// State holds the pure logic and is table-tested; Store adds persistence.
package fence

import (
	"slices"
	"time"

	"github.com/fanpbx/fan/pkg/events"
)

// Verdict is what to do with a command.
type Verdict int

const (
	// Apply: new command, current epoch, in time.
	Apply Verdict = iota + 1
	// Duplicate: this id was already applied; acknowledge, do nothing.
	Duplicate
	// StaleEpoch: a newer epoch has been seen; refuse.
	StaleEpoch
	// Expired: the deadline has passed; refuse.
	Expired
)

func (v Verdict) String() string {
	switch v {
	case Apply:
		return "apply"
	case Duplicate:
		return "duplicate"
	case StaleEpoch:
		return "stale_epoch"
	case Expired:
		return "expired"
	}
	return "invalid"
}

// Outcome maps a verdict onto the outcome a CommandResult reports. Apply
// maps to OutcomeApplied; the caller reports OutcomeFailed instead if
// carrying the command out fails.
func (v Verdict) Outcome() events.Outcome {
	switch v {
	case Apply:
		return events.OutcomeApplied
	case Duplicate:
		return events.OutcomeDuplicate
	case StaleEpoch:
		return events.OutcomeStaleEpoch
	case Expired:
		return events.OutcomeExpired
	}
	return events.OutcomeFailed
}

// DefaultKeep is how many recent command ids are remembered. JetStream
// redelivers within its ack window, so a few hundred ids cover any
// realistic redelivery while keeping the state file small.
const DefaultKeep = 256

// State is the fencing state: the highest epoch seen and the ids of the most
// recently applied commands, oldest first. The zero value is a fresh state.
type State struct {
	MaxEpoch uint64   `json:"max_epoch"`
	Recent   []string `json:"recent"`
	// Managed lists every address this node was ever told to hold. It is
	// recorded with the claim, before the address is added, so a release
	// without the bus (systemd's ExecStopPost after a crash) knows what to
	// remove even for IPv6 addresses, which carry no label.
	Managed []string `json:"managed,omitempty"`
}

// Check decides what to do with a command. A duplicate is recognised before
// anything else: a redelivered command that was applied must be
// acknowledged as such even if its epoch has since been superseded or its
// deadline has passed, or the arbiter would think it was never carried out.
// Equal epochs are accepted: one arbiter term issues many commands.
func (s *State) Check(cmdID string, epoch uint64, notAfter, now time.Time) Verdict {
	switch {
	case slices.Contains(s.Recent, cmdID):
		return Duplicate
	case epoch < s.MaxEpoch:
		return StaleEpoch
	case now.After(notAfter):
		return Expired
	}
	return Apply
}

// Record notes that cmdID of epoch is being applied, remembering at most
// keep ids (DefaultKeep when keep <= 0).
func (s *State) Record(cmdID string, epoch uint64, keep int, managed ...string) {
	if keep <= 0 {
		keep = DefaultKeep
	}
	for _, a := range managed {
		if !slices.Contains(s.Managed, a) {
			s.Managed = append(s.Managed, a)
		}
	}
	s.MaxEpoch = max(s.MaxEpoch, epoch)
	if !slices.Contains(s.Recent, cmdID) {
		s.Recent = append(s.Recent, cmdID)
	}
	if over := len(s.Recent) - keep; over > 0 {
		s.Recent = slices.Delete(s.Recent, 0, over)
	}
}

func (s *State) clone() State {
	return State{MaxEpoch: s.MaxEpoch, Recent: slices.Clone(s.Recent), Managed: slices.Clone(s.Managed)}
}
