package view

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
)

// What fan knows of the calls in progress, for the operator's tools: a
// node's calls summary as a line, the warnings its holder's summary gives
// (status notes), and what became of the calls when a move left a holder
// (explain).

// CallsSummary renders a calls summary in one line: the calls up, how
// many a new holder could carry, and what of the settings keeps the others
// from surviving.
func CallsSummary(s *events.CallsSummary) string {
	role := "standby"
	if s.Holder {
		role = "holder"
	}
	line := fmt.Sprintf("%s (%s of %s", s.Node, role, s.Group)
	if s.Epoch != 0 {
		line += fmt.Sprintf(", epoch %d", s.Epoch)
	}
	line += fmt.Sprintf("): %s up, %d carriable", plural(s.Calls, "call"), s.Carriable)
	for _, p := range []struct {
		n    int
		what string
	}{{s.Anchored, "anchored"}, {s.Incomplete, "incomplete"}, {s.Unrecorded, "unrecorded"}} {
		if p.n > 0 {
			line += fmt.Sprintf(", %d %s", p.n, p.what)
		}
	}
	line += fmt.Sprintf("; %s, %d carried", plural(s.Channels, "channel"), s.CarriedChannels)
	if w := settingsWarnings(s); len(w) > 0 {
		line += "; " + strings.Join(w, "; ")
	}
	return line
}

// settingsWarnings are the summary's settings that keep calls from
// surviving, briefly.
func settingsWarnings(s *events.CallsSummary) []string {
	var out []string
	if s.TimersEndpoints != nil && *s.TimersEndpoints > 0 {
		out = append(out, fmt.Sprintf("session timers on %s%s", plural(*s.TimersEndpoints, "endpoint"), sample(s.TimersSample, *s.TimersEndpoints)))
	}
	if len(s.ContactNodeAddress) > 0 {
		out = append(out, "node address in Contact: "+strings.Join(s.ContactNodeAddress, ", "))
	}
	if len(s.MediaAddressRewritten) > 0 {
		out = append(out, "external_media_address on "+strings.Join(s.MediaAddressRewritten, ", "))
	}
	return out
}

// sample names what a summary listed of n: " (6001, 6002 and 3 more)".
func sample(names []string, n int) string {
	if len(names) == 0 {
		return ""
	}
	s := strings.Join(names, ", ")
	if more := n - len(names); more > 0 {
		s += fmt.Sprintf(" and %d more", more)
	}
	return " (" + s + ")"
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}

// HeardCalls is a node's latest calls summary as the live stream keeps it.
type HeardCalls struct {
	// At is when the bus stored it (the stream's clock).
	At      time.Time
	Summary *events.CallsSummary
}

// Current says whether the summary is still restated: stored within three
// of its intervals of now (what the arbiter counts a planned move on).
func (h HeardCalls) Current(now time.Time) bool {
	return now.Sub(h.At) <= 3*time.Duration(h.Summary.IntervalMS)*time.Millisecond
}

// CallsSummaries finds, for the holder of every group record, the latest
// calls summary the live stream holds, keyed by HeardKey. A node whose
// replicator records no calls has none.
func CallsSummaries(ctx context.Context, b *bus.Bus, records []Keyed[events.GroupStatus]) map[string]HeardCalls {
	out := map[string]HeardCalls{}
	st, err := b.JS.Stream(ctx, bus.LiveStream)
	if err != nil {
		return out
	}
	for _, r := range records {
		cluster, h := ClusterOfKey(r.Key), r.Value.Holder
		if _, done := out[HeardKey(cluster, h)]; h == "" || done {
			continue
		}
		m, err := st.GetLastMsgForSubject(ctx, events.CallsSummarySubject(cluster, h))
		if err != nil {
			continue
		}
		if _, p, ok := b.DecodeFrom(m.Subject, m.Data); ok {
			if s, isSummary := p.(*events.CallsSummary); isSummary {
				out[HeardKey(cluster, h)] = HeardCalls{At: m.Time, Summary: s}
			}
		}
	}
	return out
}

// CallNotes are the warnings the holders' calls summaries give, one line
// per fact, each starting with its group, sorted: the holder's settings
// that keep a call from surviving a failover (session timers, a node's own
// address in dialogs' Contact, a rewritten media address), and a summary
// that stopped (which calls a move carries is then not known). A group
// whose holder has no summary of the group gets none: its replicator does
// not record calls.
func CallNotes(records []Keyed[events.GroupStatus], calls map[string]HeardCalls, now time.Time) []string {
	var notes []string
	for _, r := range records {
		g := r.Value
		h, ok := calls[HeardKey(ClusterOfKey(r.Key), g.Holder)]
		if g.Holder == "" || !ok || h.Summary.Group != g.Group {
			continue
		}
		s := h.Summary
		if !h.Current(now) {
			notes = append(notes, fmt.Sprintf("%s: %s's calls summary is %s old (its replicator restates it every %s): which calls a move would carry across is not known, so a planned move waits for every channel",
				g.Group, g.Holder, HumanDuration(now.Sub(h.At)), HumanDuration(time.Duration(s.IntervalMS)*time.Millisecond)))
			continue
		}
		if s.TimersEndpoints != nil && *s.TimersEndpoints > 0 {
			notes = append(notes, fmt.Sprintf("%s: CALLS: %s on %s negotiate session timers%s: a call carried across a failover ends at its first session refresh, which the new holder answers 481 (timers = no, deploy/asterisk/pjsip.conf; fanctl doctor on %s)",
				g.Group, plural(*s.TimersEndpoints, "endpoint"), g.Holder, sample(s.TimersSample, *s.TimersEndpoints), g.Holder))
		}
		if len(s.ContactNodeAddress) > 0 {
			notes = append(notes, fmt.Sprintf("%s: CALLS: dialogs on %s carry the node's own address in their Contact (transport %s): after a failover the phones send their in-dialog requests and BYE to the dead node (external_signaling_address = the floating address on every UDP transport, deploy/asterisk/pjsip.conf; fanctl doctor on %s)",
				g.Group, g.Holder, strings.Join(s.ContactNodeAddress, ", "), g.Holder))
		}
		if len(s.MediaAddressRewritten) > 0 {
			notes = append(notes, fmt.Sprintf("%s: CALLS: transport %s on %s sets external_media_address: Asterisk writes it into its direct-media re-INVITEs, so direct-media calls get no audio (remove it, deploy/asterisk/pjsip.conf; fanctl doctor on %s)",
				g.Group, strings.Join(s.MediaAddressRewritten, ", "), g.Holder, g.Holder))
		}
	}
	sort.Strings(notes)
	return notes
}

// OutcomeWithin bounds how far after a move's decision explain looks for
// what became of the calls: the claim's result comes within the claim's
// deadline (seconds), and a deferred adoption within the 30 s its read of
// the records is given.
const OutcomeWithin = 2 * time.Minute

// CallsOutcome is what became of the calls on the holder a move left: what
// its last calls summary said was up (the decision's calls), and what the
// node that took the group did with the group's calls (its claim's result,
// or the calls.adopted event that followed a deferred one).
type CallsOutcome struct {
	From string              `json:"from,omitempty"`
	Up   *events.HolderCalls `json:"up,omitempty"`
	To   string              `json:"to"`
	// Adoption is the new holder's report; AdoptionID the event that
	// carried it. Nil while not in the trail read (Pending says why).
	Adoption   *events.CallsAdoption `json:"adoption,omitempty"`
	AdoptionID string                `json:"adoption_id,omitempty"`
	// Survived are the calls the new holder keeps; Lost, Up's calls it
	// does not, by reason (the adoption's, and no_record for calls no
	// record was found of). Nil when either side is not known.
	Survived *int           `json:"survived,omitempty"`
	Lost     *int           `json:"lost,omitempty"`
	LostWhy  map[string]int `json:"lost_why,omitempty"`
	Pending  string         `json:"pending,omitempty"`
}

// NoRecord is the reason for calls up by a summary that no adoption
// counted: the new holder found no record of them (unrecorded when the
// holder died, or recorded after its last summary and gone since).
const NoRecord = "no_record"

// String renders the outcome as one line.
func (o CallsOutcome) String() string {
	var parts []string
	if u := o.Up; u != nil {
		s := fmt.Sprintf("%s up on %s by its calls summary of %s (%d carriable", plural(u.Calls, "call"), u.Node, u.At.UTC().Format(time.RFC3339), u.Carriable)
		for _, p := range []struct {
			n    int
			what string
		}{{u.Anchored, "anchored"}, {u.Incomplete, "incomplete"}, {u.Unrecorded, "unrecorded"}} {
			if p.n > 0 {
				s += fmt.Sprintf(", %d %s", p.n, p.what)
			}
		}
		parts = append(parts, s+")")
	} else if o.From != "" {
		parts = append(parts, "no calls summary of "+o.From+" was heard (its replicator records no calls)")
	}
	switch {
	case o.Adoption != nil:
		parts = append(parts, o.To+" "+CallsAdoption(*o.Adoption))
	case o.Pending != "":
		parts = append(parts, o.Pending)
	}
	if o.Survived != nil && o.Lost != nil {
		s := fmt.Sprintf("%d survived, %d lost", *o.Survived, *o.Lost)
		if len(o.LostWhy) > 0 {
			var why []string
			for _, r := range append(events.NotAdoptedReasons(), NoRecord) {
				if n := o.LostWhy[r]; n > 0 {
					why = append(why, fmt.Sprintf("%s %d", r, n))
				}
			}
			for _, r := range slices.Sorted(maps.Keys(o.LostWhy)) {
				if !slices.Contains(events.NotAdoptedReasons(), r) && r != NoRecord && o.LostWhy[r] > 0 {
					why = append(why, fmt.Sprintf("%s %d", r, o.LostWhy[r]))
				}
			}
			s += " (" + strings.Join(why, ", ") + ")"
		}
		parts = append(parts, s)
	}
	return "calls: " + strings.Join(parts, "; ")
}

// outcome finds, in the trail after move decision d (trail[at]), its
// claim's result and a calls.adopted event that follows a deferred one,
// within OutcomeWithin. It returns them, and the outcome for the calls
// when there is one to tell: the decision cites a calls summary, or the
// claim's result speaks of calls (nil for a group whose nodes record and
// keep none).
func outcome(trail []Entry, at int, d *events.ArbiterDecision) ([]Entry, *CallsOutcome) {
	o := &CallsOutcome{From: d.From, Up: d.Calls, To: d.To}
	if len(d.Commands) == 0 {
		return nil, nil
	}
	claim := d.Commands[len(d.Commands)-1]
	until := trail[at].Env.Time.Add(OutcomeWithin)
	var found []Entry
	var res *events.CommandResult
	for _, e := range trail[at+1:] {
		// The trail merges streams by their producers' stamps: an entry
		// past the bound does not mean every later one is.
		if e.Env.Time.After(until) {
			continue
		}
		switch p := e.P.(type) {
		case *events.CommandResult:
			if res == nil && p.CommandID == claim && p.CommandType == events.TypeClaimIP {
				res = p
				found = append(found, e)
				if p.Calls != nil && !p.Calls.Deferred {
					o.Adoption, o.AdoptionID = p.Calls, e.Env.ID
				}
			}
		case *events.CallsAdopted:
			if res != nil && o.Adoption == nil && p.CommandID == claim {
				a := p.Calls
				o.Adoption, o.AdoptionID = &a, e.Env.ID
				found = append(found, e)
			}
		}
	}
	if d.Calls == nil && (res == nil || res.Calls == nil) {
		return found, nil
	}
	switch {
	case res == nil:
		o.Pending = fmt.Sprintf("the claim on %s has no result within %s of the decision in the trail read", d.To, OutcomeWithin)
	case res.Outcome != events.OutcomeApplied && res.Outcome != events.OutcomeDuplicate:
		o.Pending = fmt.Sprintf("the claim on %s was %s: no call was adopted there (the decision that follows says where the group went)", d.To, res.Outcome)
		if o.Up != nil {
			o.Survived, o.Lost = intp(0), intp(o.Up.Calls)
		}
	case res.Calls == nil:
		o.Pending = fmt.Sprintf("%s's claim reports no adoption (its executor keeps no calls): none was carried", d.To)
		if o.Up != nil {
			o.Survived, o.Lost = intp(0), intp(o.Up.Calls)
		}
	case o.Adoption == nil:
		o.Pending = fmt.Sprintf("%s deferred the adoption, and no calls.adopted event citing its claim is in the trail read within %s", d.To, OutcomeWithin)
	}
	if o.Adoption != nil {
		o.Survived = intp(o.Adoption.Adopted)
		if o.Up != nil {
			lost := max(o.Up.Calls-o.Adoption.Adopted, 0)
			o.Lost = &lost
			o.LostWhy = map[string]int{}
			counted := 0
			for r, n := range o.Adoption.NotAdopted {
				o.LostWhy[r] = n
				counted += n
			}
			if lost > counted {
				o.LostWhy[NoRecord] = lost - counted
			}
		}
	}
	return found, o
}

func intp(n int) *int { return &n }
