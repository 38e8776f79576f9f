package view

import (
	"fmt"
	"strings"
	"time"

	"github.com/fanpbx/fan/pkg/events"
)

// PinNote is the status line of a group's pin: to which node, who set it
// and why, since and until when, and how to end it.
func PinNote(group string, p *events.PinStatus, now time.Time) string {
	s := fmt.Sprintf("%s: PINNED to %s by %s", group, p.Node, p.Operator)
	if p.Reason != "" {
		s += fmt.Sprintf(" (%q)", p.Reason)
	}
	s += fmt.Sprintf(" since %s (%s ago)", Time(p.Since), HumanDuration(now.Sub(p.Since)))
	if p.Until.IsZero() {
		s += ", until cleared"
	} else {
		s += fmt.Sprintf(" until %s (in %s)", Time(p.Until), HumanDuration(p.Until.Sub(now)))
	}
	return s + ": no automatic failback moves it; a failover still does. fanctl switchover --clear --group " + group + " ends it"
}

// PinSummary is a pin event in one line.
func PinSummary(p *events.GroupPin) string {
	if p.Stage == events.PinStarted {
		until := "until cleared"
		if !p.Until.IsZero() {
			until = "until " + p.Until.UTC().Format(time.RFC3339)
		}
		return fmt.Sprintf("%s PINNED to %s by %s %s: %s", p.Group, p.Node, p.Operator, until, p.Why)
	}
	return fmt.Sprintf("%s PIN to %s %s: %s", p.Group, p.Node, strings.ToUpper(string(p.End)), p.Why)
}

// HoldSummary is a leaders hold event in one line.
func HoldSummary(h *events.LeadersHold) string {
	if h.Stage == events.HoldStarted {
		return "LEADERS HELD: " + h.Why
	}
	return fmt.Sprintf("LEADERS HOLD %s: %s", strings.ToUpper(string(h.End)), h.Why)
}
