package decide

import (
	"fmt"
	"strings"
	"time"

	"github.com/fanpbx/fan/pkg/events"
)

// Calls a move can carry across. A holder's replicator restates, every
// couple of seconds, how many calls its Asterisk has up and how many of
// them a node taking the group over could keep (events.CallsSummary:
// direct media, both dialogs recorded on the bus). A planned move waits
// only for the channels of the others; a move away from a holder records
// what the holder's last summary said, so that the trail tells how many
// calls were carried across and how many the move ended.

// staleAfter is how many of its own intervals a summary counts as
// current: after that the replicator has stopped restating it (its
// Asterisk does not answer, or it is gone) and what it said is not known.
const staleAfter = 3

// callsHeard is a node's last calls summary, when it arrived (the
// arbiter's clock, as for heartbeats) and the event that told it.
type callsHeard struct {
	s   events.CallsSummary
	at  time.Time
	ref ref
}

func (h *callsHeard) holderCalls() *events.HolderCalls {
	hc := events.HolderCallsOf(h.ref.id, h.s)
	return &hc
}

// onCallsSummary keeps a node's last summary. Only a planned move waiting
// on that node decides anew on it: a summary changes what a drain waits
// for and nothing else, so it never becomes the cause of another move.
func (c *Core) onCallsSummary(now time.Time, env events.Envelope, s events.CallsSummary) {
	ns := c.nodes[s.Node]
	if ns == nil || ns.proxy != "" {
		return
	}
	ns.summary = &callsHeard{s: s, at: now, ref: envRef(env)}
	for _, gi := range ns.groups {
		if g := c.groups[gi]; g.planned != nil && g.holder == s.Node && g.cfg.Name == s.Group {
			c.touch(gi)
		}
	}
}

// currentCalls is h's summary for g when it is current: about g (the
// replicator records the calls of one group) and heard within staleAfter
// of its intervals.
func (c *Core) currentCalls(g *groupState, h string, now time.Time) *callsHeard {
	sh := c.nodes[h].summary
	if sh == nil || sh.s.Group != g.cfg.Name {
		return nil
	}
	if now.Sub(sh.at) > staleAfter*time.Duration(sh.s.IntervalMS)*time.Millisecond {
		return nil
	}
	return sh
}

// tenureCalls is h's last summary for g heard since the group last moved
// (to h): what a move away from h cites, current or not, since the last
// one before a fault is the best account of what the fault ended.
func (c *Core) tenureCalls(g *groupState, h string) *callsHeard {
	sh := c.nodes[h].summary
	if sh == nil || sh.s.Group != g.cfg.Name || (!g.lastMove.IsZero() && sh.at.Before(g.lastMove)) {
		return nil
	}
	return sh
}

// holderLoad is what a planned move reports of the holder: its current
// summary's channels and calls, or else its heartbeat's channels.
func (c *Core) holderLoad(g *groupState, h string, now time.Time) (*int, *events.HolderCalls) {
	if sh := c.currentCalls(g, h, now); sh != nil {
		n := sh.s.Channels
		return &n, sh.holderCalls()
	}
	return cloneInt(c.nodes[h].channels), nil
}

// carriedCount says how many of hc's channels a move carries across and
// what holds the rest, for reasons: "n1 has 6 active channels, 4 of them
// in 2 calls carried across, 2 not (1 anchored call)".
func carriedCount(h string, hc *events.HolderCalls) string {
	s := fmt.Sprintf("%s has %s", h, plural(hc.Channels, "active channel"))
	switch {
	case hc.Channels == 0:
	case hc.Carriable == 0:
		s += fmt.Sprintf(", none in a call carried across (%s)", notCarried(hc))
	case hc.Uncarried() == 0:
		s += fmt.Sprintf(", all in %s carried across", plural(hc.Carriable, "call"))
	default:
		s += fmt.Sprintf(", %d of them in %s carried across, %d not (%s)", hc.CarriedChannels, plural(hc.Carriable, "call"),
			hc.Uncarried(), notCarried(hc))
	}
	return s
}

// notCarried names what holds the channels no move carries: calls that
// cannot be carried, by why, and channels in no call of two.
func notCarried(hc *events.HolderCalls) string {
	var parts []string
	for _, p := range []struct {
		n    int
		what string
	}{{hc.Anchored, "anchored call"}, {hc.Incomplete, "incomplete call"}, {hc.Unrecorded, "unrecorded call"}} {
		if p.n > 0 {
			parts = append(parts, plural(p.n, p.what))
		}
	}
	if rest := hc.Channels - 2*hc.Calls; rest > 0 {
		parts = append(parts, plural(rest, "channel")+" in no call of two")
	}
	return strings.Join(parts, ", ")
}

// callsUp says what a move away from h ends and what it may carry, by
// h's last summary: "n1 had 3 calls up by its calls summary of T: 2 to
// carry across, 1 lost (1 anchored call)".
func callsUp(h string, hc *events.HolderCalls) string {
	s := fmt.Sprintf("%s had %s up by its calls summary of %s", h, plural(hc.Calls, "call"), hc.At.UTC().Format(time.RFC3339))
	if hc.Calls == 0 {
		return s
	}
	lost := hc.Calls - hc.Carriable
	s += fmt.Sprintf(": %d to carry across", hc.Carriable)
	if lost > 0 {
		s += fmt.Sprintf(", %d lost (%s)", lost, notCarried(&events.HolderCalls{Anchored: hc.Anchored, Incomplete: hc.Incomplete,
			Unrecorded: hc.Unrecorded, Calls: hc.Calls, Channels: 2 * hc.Calls}))
	}
	return s
}

// callsNote is "; " and callsUp for a move away from h, or "" when no
// summary of h's was heard in its tenure.
func (c *Core) callsNote(g *groupState, h string) string {
	if sh := c.tenureCalls(g, h); sh != nil {
		return "; " + callsUp(h, sh.holderCalls())
	}
	return ""
}
