// Package view reads what fan looks like now and why, for the operator's
// tools: the group status records and each node's latest heartbeat, the
// arbiter's situation lines, the causal chain of an event, and one-line
// summaries of events. `fanctl status`, `fanctl explain`, `fanctl events`
// and the status page (`fanctl serve`) all show what this package computes,
// so the terminal and the browser never disagree.
package view

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/fanpbx/fan/pkg/events"
)

// Summary renders the gist of a payload in one line.
func Summary(p events.Payload) string {
	switch v := p.(type) {
	case *events.HealthTransition:
		return fmt.Sprintf("%s %s[%s] %s->%s: %s", v.TargetNode, v.Check, v.Role, v.From, v.To, v.Reason)
	case *events.ProbeResult:
		if v.OK {
			return fmt.Sprintf("%s %s ok %.1fms", v.TargetNode, v.Check, v.DurationMS)
		}
		return fmt.Sprintf("%s %s FAIL %s (%s)", v.TargetNode, v.Check, v.Error, v.ErrorClass)
	case *events.NodeHeartbeat:
		return fmt.Sprintf("%s seq=%d cpu=%.1f%% mem_avail=%dMiB", v.Node, v.Seq, v.CPUPercent, v.MemAvailableBytes>>20)
	case *events.ArbiterDecision:
		var s string
		switch {
		case v.Action == events.ActionHold && v.From == "":
			s = fmt.Sprintf("%s HOLD (no holder): %s", v.Group, v.Reason)
		case v.Action == events.ActionHold:
			s = fmt.Sprintf("%s HOLD (holder %s): %s", v.Group, v.From, v.Reason)
		default:
			s = fmt.Sprintf("%s %s %s->%s: %s", v.Group, strings.ToUpper(string(v.Action)), OrNone(v.From), OrNone(v.To), v.Reason)
		}
		if v.NeedsHuman {
			s = "NEEDS A HUMAN: " + s
		}
		return s
	case *events.ClaimIP:
		return fmt.Sprintf("claim %s on %s for %s", strings.Join(v.Addresses, ","), v.Node, v.Group)
	case *events.ReleaseIP:
		return fmt.Sprintf("release %s on %s for %s", strings.Join(v.Addresses, ","), v.Node, v.Group)
	case *events.AnswerPBX:
		return fmt.Sprintf("answer %s on %s (%s)", v.Group, v.Node, v.Mode)
	case *events.CommandResult:
		s := fmt.Sprintf("%s on %s: %s", v.CommandType, v.Node, v.Outcome)
		if v.Error != "" {
			s += " (" + v.Error + ")"
		}
		for _, st := range v.Steps {
			s += fmt.Sprintf(" %s=%.1fms", st.Name, st.ElapsedMS)
		}
		if v.Calls != nil {
			s += " calls: " + CallsAdoption(*v.Calls)
		}
		return s
	case *events.CallsSummary:
		return CallsSummary(v)
	case *events.CallsAdopted:
		s := fmt.Sprintf("%s on %s: %s", v.Group, v.Node, CallsAdoption(v.Calls))
		if v.CommandID != "" {
			s += " (claim " + v.CommandID + ")"
		}
		return s
	case *events.FailbackPermit:
		return fmt.Sprintf("%s window %s until %s", v.Group, v.Window, v.ValidUntil.Format(time.RFC3339))
	case *events.ReplicationStatus:
		return fmt.Sprintf("%s->%s %s files=%d caught_up=%v", v.Node, v.Peer, v.Tree, v.Files, v.CaughtUp)
	case *events.ReplicationApplied:
		return ReplicationApplied(v)
	case *events.ServiceAnnounce:
		return fmt.Sprintf("%s on %s %s (%s)", v.Service, v.Node, v.State, v.Version)
	case *events.OperatorAction:
		return DescribeAction(v)
	case *events.ArbiterTerm:
		return fmt.Sprintf("a new term begins from the state it restored (%d bytes)", len(v.State))
	case *events.PlannedMove:
		return fmt.Sprintf("%s %s: %s", v.Group, strings.ToUpper(string(v.Stage)), v.Reason)
	case *events.GroupPin:
		return PinSummary(v)
	case *events.LeadersHold:
		return HoldSummary(v)
	case *events.NodePresence:
		s := fmt.Sprintf("%s %s", v.Node, strings.ToUpper(string(v.Presence)))
		if v.SilentMS > 0 {
			s += fmt.Sprintf(" after %s of silence", (time.Duration(v.SilentMS) * time.Millisecond).Round(time.Second))
		}
		return s
	}
	return ""
}

// CallsAdoption renders what a node did with a group's calls when it took
// the group: "adopted 2 from n1, not adopted: anchored 1", "deferred".
func CallsAdoption(a events.CallsAdoption) string {
	switch {
	case a.Deferred:
		return "deferred (reported apart)"
	case a.Error != "":
		return "none adopted (" + a.Error + ")"
	}
	s := fmt.Sprintf("adopted %d", a.Adopted)
	if len(a.From) > 0 {
		s += " from " + strings.Join(a.From, ",")
	}
	if len(a.NotAdopted) > 0 {
		var parts []string
		for _, r := range events.NotAdoptedReasons() {
			if n := a.NotAdopted[r]; n > 0 {
				parts = append(parts, fmt.Sprintf("%s %d", r, n))
			}
		}
		for _, r := range slices.Sorted(maps.Keys(a.NotAdopted)) {
			if !slices.Contains(events.NotAdoptedReasons(), r) && a.NotAdopted[r] > 0 {
				parts = append(parts, fmt.Sprintf("%s %d", r, a.NotAdopted[r]))
			}
		}
		s += ", not adopted: " + strings.Join(parts, ", ")
	}
	return s
}

// ReplicationApplied renders what a target applied of its source's
// manifest, source->target as ReplicationStatus reads: "n1->n2 voicemail
// gen=7 files=12 bytes=40960 deleted=1 in 3.2ms", with the conflicts, the
// failure and the contents it could not fetch when there are any.
func ReplicationApplied(a *events.ReplicationApplied) string {
	s := fmt.Sprintf("%s->%s %s gen=%d files=%d bytes=%d deleted=%d", a.Source, a.Node, a.Tree, a.Generation, a.Files, a.Bytes, a.Deleted)
	if a.Conflicts > 0 {
		s += fmt.Sprintf(" conflicts=%d", a.Conflicts)
	}
	s += fmt.Sprintf(" in %.1fms", a.DurationMS)
	if a.Error != "" {
		s += " FAILED: " + a.Error
	}
	if len(a.Missing) > 0 {
		s += fmt.Sprintf(" (missing %d)", len(a.Missing))
	}
	return s
}

// DescribeAction renders an operator action: what was asked, by whom, why,
// and what the arbiter answered.
func DescribeAction(a *events.OperatorAction) string {
	target := strings.TrimSpace(strings.Join([]string{a.Group, a.Node}, " "))
	verb := string(a.Verb)
	switch {
	case a.Cancel:
		verb += " --cancel"
	case a.Drain != "" || a.WithinMS != 0:
		verb += " (drain " + string(a.Drain)
		if a.Drain == "" {
			verb += string(events.DrainWait)
		}
		if a.WithinMS != 0 {
			verb += fmt.Sprintf(" within %v", time.Duration(a.WithinMS)*time.Millisecond)
		}
		verb += ")"
	}
	switch {
	case a.ForMS != 0:
		verb += fmt.Sprintf(" (for %v)", time.Duration(a.ForMS)*time.Millisecond)
	case !a.Until.IsZero():
		verb += " (until " + a.Until.UTC().Format(time.RFC3339) + ")"
	}
	if a.Server != "" {
		verb += " (on " + a.Server + ")"
	}
	s := fmt.Sprintf("%s %s by %s", verb, target, a.Operator)
	if a.Reason != "" {
		s += fmt.Sprintf(" (%q)", a.Reason)
	}
	if a.Comment != "" {
		s += fmt.Sprintf(" [comment %q]", a.Comment)
	}
	if a.Stage == events.StageRequested {
		return s + ": requested"
	}
	if a.Accepted {
		return s + ": " + a.Outcome
	}
	return s + ": REFUSED: " + a.Outcome
}

// HumanDuration renders d for people: 4d16h35m, 1h20m, 35m, 12s, 350ms.
// Past an hour seconds do not matter; under a second milliseconds do.
func HumanDuration(d time.Duration) string {
	neg := d < 0
	if neg {
		d = -d
	}
	if d >= time.Hour {
		d = d.Round(time.Minute)
	}
	var s string
	switch days, hours, mins := int(d/(24*time.Hour)), int(d/time.Hour)%24, int(d/time.Minute)%60; {
	case d < time.Second:
		s = d.Round(time.Millisecond).String()
	case d < time.Minute:
		s = d.Round(100 * time.Millisecond).String()
	case d < time.Hour:
		s = d.Round(time.Second).String()
	case days > 0:
		s = fmt.Sprintf("%dd%dh%dm", days, hours, mins)
	default:
		s = fmt.Sprintf("%dh%dm", hours, mins)
	}
	if neg {
		return "-" + s
	}
	return s
}

// Time renders an instant for the status lines: RFC 3339 in the local
// zone, or "-" for none.
func Time(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.Local().Format(time.RFC3339)
}

// OrNone names a node, or says there is none.
func OrNone(node string) string {
	if node == "" {
		return "(none)"
	}
	return node
}
