package chaos

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/fanpbx/fan/lab/stack"
	"github.com/fanpbx/fan/pkg/events"
)

// Window is a span of time with a reason.
type Window struct {
	From, To time.Time
	Why      string
}

func overlap(a0, a1, b0, b1 time.Time) time.Duration {
	lo, hi := a0, a1
	if b0.After(lo) {
		lo = b0
	}
	if b1.Before(hi) {
		hi = b1
	}
	if hi.After(lo) {
		return hi.Sub(lo)
	}
	return 0
}

// outside is how much of [from, to) lies in none of ws.
func outside(from, to time.Time, ws []Window) time.Duration {
	if !to.After(from) {
		return 0
	}
	// Merge the parts of ws inside [from, to) so overlapping windows are not
	// subtracted twice.
	var parts []Window
	for _, w := range ws {
		if overlap(from, to, w.From, w.To) > 0 {
			parts = append(parts, w)
		}
	}
	sort.Slice(parts, func(i, j int) bool { return parts[i].From.Before(parts[j].From) })
	covered := time.Duration(0)
	cur := from
	for _, w := range parts {
		s, e := w.From, w.To
		if s.Before(cur) {
			s = cur
		}
		if e.After(to) {
			e = to
		}
		if e.After(s) {
			covered += e.Sub(s)
			cur = e
		}
	}
	return to.Sub(from) - covered
}

// Round is one ARP question and the MACs that answered it: replies that
// arrived before the next question was sent.
type Round struct {
	Start, End time.Time
	MACs       []string
}

// Rounds cuts the capture into rounds. The last round ends interval after
// its question. Announcements seen passively are not answers and do not
// count here.
func Rounds(sends []time.Time, sightings []Sighting, interval time.Duration) []Round {
	rs := make([]Round, len(sends))
	for i, s := range sends {
		rs[i].Start = s
		if i+1 < len(sends) {
			rs[i].End = sends[i+1]
		} else {
			rs[i].End = s.Add(interval)
		}
	}
	for _, sg := range sightings {
		if !sg.Answer {
			continue
		}
		// The round whose [Start, End) holds the reply.
		i := sort.Search(len(rs), func(i int) bool { return rs[i].End.After(sg.At) })
		if i == len(rs) || sg.At.Before(rs[i].Start) {
			continue
		}
		if !slices.Contains(rs[i].MACs, sg.MAC) {
			rs[i].MACs = append(rs[i].MACs, sg.MAC)
		}
	}
	return rs
}

// Episode is a run of consecutive rounds answered by two or more MACs.
type Episode struct {
	Start  time.Time
	Length time.Duration
	// Counted is the part outside every allowed window: invariant-1 time.
	Counted time.Duration
	MACs    []string
	Rounds  int
	// Context names the fault active at Start, or the one healed last before.
	Context string
}

// HealWindow is the time after a heal in which two holders are excused:
// bound from the heal, and from one ARP round before it. A round that
// spans the heal began while the cut side could not answer, so its second
// answer came after the heal; without the round's grace such a round
// counted a few microseconds against the invariant ("0 ms outside the
// partition bounds" on a loaded machine).
func HealWindow(healed time.Time, bound time.Duration, fault string) Window {
	return Window{From: healed.Add(-ARPInterval), To: healed.Add(bound), Why: fault + " healed"}
}

// DualEpisodes groups dual rounds into episodes and counts each one's time
// outside the allowed windows (after a heal, within the partition bound).
func DualEpisodes(rs []Round, allowed []Window) (eps []Episode, counted time.Duration) {
	var cur *Episode
	for i, r := range rs {
		if len(r.MACs) < 2 {
			cur = nil
			continue
		}
		if cur == nil || i == 0 || len(rs[i-1].MACs) < 2 {
			eps = append(eps, Episode{Start: r.Start})
			cur = &eps[len(eps)-1]
		}
		cur.Length += r.End.Sub(r.Start)
		cur.Rounds++
		c := outside(r.Start, r.End, allowed)
		cur.Counted += c
		counted += c
		for _, m := range r.MACs {
			if !slices.Contains(cur.MACs, m) {
				cur.MACs = append(cur.MACs, m)
			}
		}
	}
	for i := range eps {
		slices.Sort(eps[i].MACs)
	}
	return eps, counted
}

// Outage is a span with no SIP answer on the floating IP.
type Outage struct {
	Start, End time.Time
	// FirstMissed is the send time of the first unanswered probe: what the
	// outage is attributed to (Start is the last answer before it).
	FirstMissed time.Time
	// Counted is the part during which at least one node was healthy.
	Counted time.Duration
	Context string
}

// Outages lists the spans with no answer over [from, to]: from the last
// answered probe before a run of unanswered ones to the next answered probe
// (by send time), when longer than minGap, with the part where every node was
// unhealthy taken out. A span with no unanswered probe in it is the
// observer not sending (a stalled process), not the address not answering,
// and is not an outage. Probes sent outside [from, to] are ignored; a run of
// unanswered probes at either end counts from from or up to to.
func Outages(probes []Probe, from, to time.Time, minGap time.Duration, allUnhealthy []Window) []Outage {
	ps := slices.Clone(probes)
	slices.SortFunc(ps, func(a, b Probe) int { return a.Sent.Compare(b.Sent) })
	var out []Outage
	prev, missed := from, false
	var first time.Time
	add := func(end time.Time) {
		if missed && end.Sub(prev) > minGap {
			out = append(out, Outage{Start: prev, End: end, FirstMissed: first, Counted: outside(prev, end, allUnhealthy)})
		}
	}
	for _, p := range ps {
		if p.Sent.Before(from) || p.Sent.After(to) {
			continue
		}
		if !p.Answered {
			if !missed {
				first = p.Sent
			}
			missed = true
			continue
		}
		add(p.Sent)
		prev, missed = p.Sent, false
	}
	add(to)
	return out
}

// Longest returns the outage with the longest counted time.
func Longest(os []Outage) (Outage, bool) {
	if len(os) == 0 {
		return Outage{}, false
	}
	best := os[0]
	for _, o := range os[1:] {
		if o.Counted > best.Counted {
			best = o
		}
	}
	return best, true
}

// AllUnhealthy returns the spans during which every node in nodes was
// unhealthy, given each node's unhealthy spans.
func AllUnhealthy(nodes []string, per map[string][]Window) []Window {
	type edge struct {
		at    time.Time
		delta int
	}
	var es []edge
	for _, n := range nodes {
		// Merge a node's own overlapping spans first, so the count is of
		// nodes, not of spans.
		for _, w := range merge(per[n]) {
			es = append(es, edge{w.From, 1}, edge{w.To, -1})
		}
	}
	sort.SliceStable(es, func(i, j int) bool {
		if es[i].at.Equal(es[j].at) {
			return es[i].delta < es[j].delta // ends before starts at the same instant
		}
		return es[i].at.Before(es[j].at)
	})
	var out []Window
	down := 0
	var start time.Time
	for _, e := range es {
		down += e.delta
		if e.delta > 0 && down == len(nodes) {
			start = e.at
		}
		if e.delta < 0 && down == len(nodes)-1 && e.at.After(start) {
			out = append(out, Window{From: start, To: e.at, Why: "no healthy node"})
		}
	}
	return out
}

func merge(ws []Window) []Window {
	ws = slices.Clone(ws)
	sort.Slice(ws, func(i, j int) bool { return ws[i].From.Before(ws[j].From) })
	var out []Window
	for _, w := range ws {
		if n := len(out); n > 0 && !w.From.After(out[n-1].To) {
			if w.To.After(out[n-1].To) {
				out[n-1].To = w.To
			}
			continue
		}
		out = append(out, w)
	}
	return out
}

// StaleExec is a command applied although a command with a higher epoch had
// been applied earlier in the trail.
type StaleExec struct {
	ResultID, CommandID string
	CommandType         events.Type
	Node                string
	Epoch, MaxEarlier   uint64
}

func (s StaleExec) String() string {
	return fmt.Sprintf("%s on %s epoch %d after epoch %d (command %s, result %s)", s.CommandType, s.Node, s.Epoch, s.MaxEarlier, s.CommandID, s.ResultID)
}

// EpochReport is what the audit trail says about fencing.
type EpochReport struct {
	Stale []StaleExec
	// Refused counts results with outcome stale_epoch: an executor refusing
	// an old command is fencing working, not a violation.
	Refused  int
	Applied  int
	MaxEpoch uint64
	// Unknown counts applied results whose epoch could not be found (no
	// epoch on the result and the command not in the trail).
	Unknown int
}

// StaleEpochs walks the trail in stream order. A result's epoch is its
// envelope's (executors copy the command's); failing that, the command's
// own envelope found by id.
func StaleEpochs(evs []stack.Event) EpochReport {
	cmdEpoch := map[string]uint64{}
	for _, e := range evs {
		if e.Env.Epoch != 0 && strings.HasPrefix(string(e.Env.Type), "command.") && e.Env.Type != events.TypeCommandResult {
			cmdEpoch[e.Env.ID] = e.Env.Epoch
		}
	}
	var r EpochReport
	for _, e := range evs {
		res, ok := e.Payload.(*events.CommandResult)
		if !ok {
			continue
		}
		switch res.Outcome {
		case events.OutcomeStaleEpoch:
			r.Refused++
			continue
		case events.OutcomeApplied:
		default:
			continue
		}
		r.Applied++
		ep := e.Env.Epoch
		if ep == 0 {
			ep = cmdEpoch[res.CommandID]
		}
		if ep == 0 {
			r.Unknown++
			continue
		}
		if ep < r.MaxEpoch {
			r.Stale = append(r.Stale, StaleExec{ResultID: e.Env.ID, CommandID: res.CommandID, CommandType: res.CommandType,
				Node: res.Node, Epoch: ep, MaxEarlier: r.MaxEpoch})
		}
		r.MaxEpoch = max(r.MaxEpoch, ep)
	}
	return r
}
