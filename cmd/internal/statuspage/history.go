package statuspage

import (
	"cmp"
	"slices"
	"sync"
	"time"

	"github.com/fanpbx/fan/pkg/events"
)

// What the page draws, all of it read from the bus (no other store): who
// held each group's address over the last week (the executors' claim and
// release results), the moves (the arbiter's decisions) and pins on that
// strip, how long each failover took from the fault to the address
// answering (the decision, the health transitions it cites and its claim's
// result), and each node's channels, CPU and memory over the last hour
// (its heartbeats, from the live stream).

const (
	// historySpan is how far back the strips reach (the audit stream keeps
	// 90 days by default; the page shows 24 h and 7 days).
	historySpan = 7 * 24 * time.Hour
	// seriesSpan and seriesBucket shape the nodes' charts: the live stream
	// keeps heartbeats hours, one a second per node; the page shows the
	// last hour in buckets of 30 s.
	seriesSpan   = time.Hour
	seriesBucket = 30 * time.Second
	// Bounds of what one page server remembers, whatever the bus holds.
	maxMoves       = 2000 // per group
	maxSegments    = 2000 // per group
	maxRemembered  = 20000
	maxFailovers   = 50 // drawn per group, the latest
	failoverWithin = 2 * time.Minute
)

// HistoryView is api/history's answer.
type HistoryView struct {
	Now    time.Time          `json:"now"`
	Since  time.Time          `json:"since"`
	Groups []GroupHistoryView `json:"groups"`
	Nodes  []NodeSeriesView   `json:"nodes"`
}

// GroupHistoryView is one group's strip and failovers.
type GroupHistoryView struct {
	Cluster   string         `json:"cluster"`
	Group     string         `json:"group"`
	Segments  []Segment      `json:"segments"`
	Moves     []Move         `json:"moves"`
	Pins      []PinSpan      `json:"pins"`
	Failovers []FailoverTime `json:"failovers"`
}

// Segment is a stretch of time one node held the group; To is zero while
// it still holds it.
type Segment struct {
	Node string    `json:"node"`
	From time.Time `json:"from"`
	To   time.Time `json:"to,omitzero"`
}

// Move is a decision that moved the group (placement, failover, failback,
// switchover, retry), for a mark on the strip; a click explains it.
type Move struct {
	ID     string        `json:"id"`
	At     time.Time     `json:"at"`
	Action events.Action `json:"action"`
	From   string        `json:"from,omitempty"`
	To     string        `json:"to"`
	Forced bool          `json:"forced,omitempty"`
	Reason string        `json:"reason"`
}

// PinSpan is an operator's pin on the strip: from its start to its end
// (To zero while in force).
type PinSpan struct {
	ID       string        `json:"id"`
	Node     string        `json:"node"`
	Operator string        `json:"operator"`
	From     time.Time     `json:"from"`
	To       time.Time     `json:"to,omitzero"`
	End      events.PinEnd `json:"end,omitempty"`
}

// FailoverTime is how long one failover took, fault to answered (see
// failoverTime for how each instant is read).
type FailoverTime struct {
	ID   string    `json:"id"`
	At   time.Time `json:"at"`
	From string    `json:"from"`
	To   string    `json:"to"`
	// Fault is the first failing probe result of the transitions the
	// decision cites; FaultKnown false when none was read (the bar then
	// starts at Detected).
	Fault      time.Time `json:"fault"`
	FaultKnown bool      `json:"fault_known"`
	// Detected is the latest of those transitions; Decided the decision;
	// Answered the claim's result's pbx_answering step (or the nearest
	// step it has); Answered zero while no applied result was read.
	Detected time.Time `json:"detected"`
	Decided  time.Time `json:"decided"`
	Answered time.Time `json:"answered,omitzero"`
	// DetectMS + DecideMS + ActMS = TotalMS, in milliseconds.
	DetectMS float64 `json:"detect_ms"`
	DecideMS float64 `json:"decide_ms"`
	ActMS    float64 `json:"act_ms"`
	TotalMS  float64 `json:"total_ms"`
	// AnsweredBy names the result step Answered was read from.
	AnsweredBy string `json:"answered_by,omitempty"`
}

// NodeSeriesView is one node's last hour, in buckets.
type NodeSeriesView struct {
	Cluster  string        `json:"cluster"`
	Node     string        `json:"node"`
	BucketS  int           `json:"bucket_s"`
	Points   []SeriesPoint `json:"points"`
	Last     *SeriesPoint  `json:"last,omitempty"`
	LastSeen time.Time     `json:"last_seen"`
}

// SeriesPoint is one bucket: the most channels seen in it (absent when the
// node reports none), the mean CPU % and the mean share of memory in use
// (1 - available/total, in %).
type SeriesPoint struct {
	T        time.Time `json:"t"`
	Channels *int      `json:"channels,omitempty"`
	CPU      float64   `json:"cpu"`
	Mem      float64   `json:"mem"`
}

type groupKey struct{ cluster, group string }
type nodeKey struct{ cluster, node string }

type decisionRec struct {
	at      time.Time
	d       events.ArbiterDecision
	id      string
	cluster string
}

type transitionRec struct {
	at   time.Time
	down bool
	// fault is the first failing probe of its evidence (zero: none).
	fault time.Time
	// cause is the event that caused it: a group check's transition is
	// caused by its member check's, whose evidence holds the probes.
	cause string
}

type groupHist struct {
	segments  []Segment
	moves     []Move
	pins      []PinSpan
	failovers []decisionRec
}

type bucket struct {
	t        time.Time
	channels *int
	cpu, mem float64
	n        int
}

type series struct {
	buckets []bucket // oldest first, one per seriesBucket
	last    *SeriesPoint
	seen    time.Time
}

// history is what the page remembers of the trail, fed by the hub's
// watches, bounded whatever the bus holds.
type history struct {
	mu          sync.Mutex
	groups      map[groupKey]*groupHist
	nodes       map[nodeKey]*series
	transitions map[string]transitionRec
	transOrder  []string
	results     map[string]*events.CommandResult // claim command id -> applied result
	resOrder    []string
}

func newHistory() *history {
	return &history{groups: map[groupKey]*groupHist{}, nodes: map[nodeKey]*series{}, transitions: map[string]transitionRec{},
		results: map[string]*events.CommandResult{}}
}

func (h *history) group(cluster, group string) *groupHist {
	k := groupKey{cluster, group}
	g := h.groups[k]
	if g == nil {
		g = &groupHist{}
		h.groups[k] = g
	}
	return g
}

// onAudit takes an event of the audit stream (decisions, results, health
// transitions, pins).
func (h *history) onAudit(env events.Envelope, p events.Decoded, _ uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	switch v := p.(type) {
	case *events.ArbiterDecision:
		if v.Action == events.ActionHold || v.To == "" {
			return
		}
		g := h.group(env.Cluster, v.Group)
		g.moves = appendBounded(g.moves, Move{ID: env.ID, At: env.Time, Action: v.Action, From: v.From, To: v.To, Forced: v.Forced,
			Reason: v.Reason}, maxMoves)
		if v.Action == events.ActionFailover {
			g.failovers = appendBounded(g.failovers, decisionRec{at: env.Time, d: *v, id: env.ID, cluster: env.Cluster}, maxFailovers)
		}
	case *events.CommandResult:
		if v.Outcome != events.OutcomeApplied {
			return
		}
		g := h.group(env.Cluster, v.Group)
		switch v.CommandType {
		case events.TypeClaimIP:
			h.remember(&h.resOrder, v.CommandID, func() { h.results[v.CommandID] = v }, func(id string) { delete(h.results, id) })
			if n := len(g.segments); n > 0 && g.segments[n-1].To.IsZero() {
				if g.segments[n-1].Node == v.Node {
					return // a claim applied again on the holder (a retry)
				}
				g.segments[n-1].To = env.Time
			}
			g.segments = appendBounded(g.segments, Segment{Node: v.Node, From: env.Time}, maxSegments)
		case events.TypeReleaseIP:
			if n := len(g.segments); n > 0 && g.segments[n-1].To.IsZero() && g.segments[n-1].Node == v.Node {
				g.segments[n-1].To = env.Time
			}
		}
	case *events.HealthTransition:
		rec := transitionRec{at: env.Time, down: v.To == events.HealthDown, cause: env.CausationID}
		for _, e := range v.Evidence {
			if !e.OK && (rec.fault.IsZero() || e.At.Before(rec.fault)) {
				rec.fault = e.At
			}
		}
		h.remember(&h.transOrder, env.ID, func() { h.transitions[env.ID] = rec }, func(id string) { delete(h.transitions, id) })
	case *events.GroupPin:
		g := h.group(env.Cluster, v.Group)
		if v.Stage == events.PinStarted {
			g.pins = appendBounded(g.pins, PinSpan{ID: env.ID, Node: v.Node, Operator: v.Operator, From: v.Since}, maxSegments)
			return
		}
		// An end cites the pin's start; a start older than the page's
		// reach is matched by its facts.
		i := slices.IndexFunc(g.pins, func(p PinSpan) bool { return p.To.IsZero() && slices.Contains(v.CausedBy, p.ID) })
		if i < 0 {
			for j := len(g.pins) - 1; j >= 0; j-- {
				if g.pins[j].Node == v.Node && g.pins[j].Operator == v.Operator && g.pins[j].To.IsZero() {
					i = j
					break
				}
			}
		}
		if i >= 0 {
			g.pins[i].To, g.pins[i].End = env.Time, v.End
		}
	}
}

// remember keeps one id in a bounded memo, forgetting the oldest.
func (h *history) remember(order *[]string, id string, put func(), forget func(string)) {
	put()
	*order = append(*order, id)
	if len(*order) > maxRemembered {
		forget((*order)[0])
		*order = (*order)[1:]
	}
}

func appendBounded[T any](s []T, v T, max int) []T {
	s = append(s, v)
	if len(s) > max {
		s = append(s[:0:0], s[len(s)-max:]...)
	}
	return s
}

// onLive takes a heartbeat of the live stream.
func (h *history) onLive(env events.Envelope, p events.Decoded, _ uint64) {
	hb, ok := p.(*events.NodeHeartbeat)
	if !ok {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	k := nodeKey{env.Cluster, hb.Node}
	s := h.nodes[k]
	if s == nil {
		s = &series{}
		h.nodes[k] = s
	}
	pt := SeriesPoint{T: env.Time, Channels: hb.ActiveChannels, CPU: hb.CPUPercent}
	if hb.MemTotalBytes > 0 {
		pt.Mem = 100 * float64(hb.MemTotalBytes-hb.MemAvailableBytes) / float64(hb.MemTotalBytes)
	}
	if env.Time.After(s.seen) {
		last := pt
		s.last, s.seen = &last, env.Time
	}
	t := env.Time.Truncate(seriesBucket)
	i := len(s.buckets) - 1
	for i >= 0 && s.buckets[i].t.After(t) {
		i-- // late: an older bucket
	}
	if i < 0 || !s.buckets[i].t.Equal(t) {
		s.buckets = slices.Insert(s.buckets, i+1, bucket{t: t})
		i++
	}
	b := &s.buckets[i]
	b.n++
	b.cpu += (pt.CPU - b.cpu) / float64(b.n)
	b.mem += (pt.Mem - b.mem) / float64(b.n)
	if pt.Channels != nil && (b.channels == nil || *pt.Channels > *b.channels) {
		c := *pt.Channels
		b.channels = &c
	}
	cut := env.Time.Add(-seriesSpan - seriesBucket)
	drop := 0
	for drop < len(s.buckets) && s.buckets[drop].t.Before(cut) {
		drop++
	}
	s.buckets = s.buckets[drop:]
}

// view is the history as of now.
func (h *history) view(now time.Time) HistoryView {
	h.mu.Lock()
	defer h.mu.Unlock()
	since := now.Add(-historySpan)
	out := HistoryView{Now: now, Since: since, Groups: []GroupHistoryView{}, Nodes: []NodeSeriesView{}}
	keys := slices.SortedFunc(func(yield func(groupKey) bool) {
		for k := range h.groups {
			if !yield(k) {
				return
			}
		}
	}, func(a, b groupKey) int {
		return cmp.Or(cmp.Compare(a.cluster, b.cluster), cmp.Compare(a.group, b.group))
	})
	for _, k := range keys {
		g := h.groups[k]
		gv := GroupHistoryView{Cluster: k.cluster, Group: k.group, Segments: []Segment{}, Moves: []Move{}, Pins: []PinSpan{}, Failovers: []FailoverTime{}}
		for _, s := range g.segments {
			if s.To.IsZero() || s.To.After(since) {
				gv.Segments = append(gv.Segments, s)
			}
		}
		for _, m := range g.moves {
			if m.At.After(since) {
				gv.Moves = append(gv.Moves, m)
			}
		}
		for _, p := range g.pins {
			if p.To.IsZero() || p.To.After(since) {
				gv.Pins = append(gv.Pins, p)
			}
		}
		for _, d := range g.failovers {
			if d.at.After(since) {
				gv.Failovers = append(gv.Failovers, h.failoverTime(d))
			}
		}
		out.Groups = append(out.Groups, gv)
	}
	nkeys := slices.SortedFunc(func(yield func(nodeKey) bool) {
		for k := range h.nodes {
			if !yield(k) {
				return
			}
		}
	}, func(a, b nodeKey) int { return cmp.Or(cmp.Compare(a.cluster, b.cluster), cmp.Compare(a.node, b.node)) })
	cut := now.Add(-seriesSpan)
	for _, k := range nkeys {
		s := h.nodes[k]
		nv := NodeSeriesView{Cluster: k.cluster, Node: k.node, BucketS: int(seriesBucket / time.Second), Points: []SeriesPoint{},
			Last: s.last, LastSeen: s.seen}
		for _, b := range s.buckets {
			if !b.t.Before(cut.Truncate(seriesBucket)) {
				nv.Points = append(nv.Points, SeriesPoint{T: b.t, Channels: b.channels, CPU: b.cpu, Mem: b.mem})
			}
		}
		out.Nodes = append(out.Nodes, nv)
	}
	return out
}

// answerSteps are the claim result's steps that say the address answers,
// best first: Asterisk answering on it, then verified, then the address
// added (an executor without a PBX to make answer).
var answerSteps = []string{events.StepPBXAnswering, events.StepPBXVerified, events.StepAddressAdded}

// failoverTime reads one failover's times:
//   - fault: the earliest failing probe result (Evidence with ok false) of
//     the health transitions the decision cites that went down, and of the
//     transitions that caused them (a group check's member checks): the
//     first moment a prober saw the fault. The transitions carry the run of
//     results that made them fall, so this is up to one probe interval
//     after the fault itself;
//   - detected: the latest of those transitions (the prober's verdict);
//   - decided: the decision;
//   - answered: the At of the applied claim result's pbx_answering step
//     (else pbx_verified, else address_added, else the result itself) of
//     the decision's claim, its last command.
//
// Each instant is on its producer's clock (the prober's, the arbiter's,
// the new holder's executor's): with NTP they agree to a few milliseconds.
func (h *history) failoverTime(r decisionRec) FailoverTime {
	f := FailoverTime{ID: r.id, At: r.at, From: r.d.From, To: r.d.To, Decided: r.at}
	for _, id := range r.d.CausedBy {
		t, ok := h.transitions[id]
		if !ok || !t.down {
			continue
		}
		if t.at.After(f.Detected) {
			f.Detected = t.at
		}
		// The transition and those that caused it (a group check's
		// member checks), a few links back: the earliest failing probe.
		for depth := 0; depth < 4; depth++ {
			if t.down && !t.fault.IsZero() && (!f.FaultKnown || t.fault.Before(f.Fault)) {
				f.Fault, f.FaultKnown = t.fault, true
			}
			next, ok := h.transitions[t.cause]
			if t.cause == "" || !ok {
				break
			}
			t = next
		}
	}
	if f.Detected.IsZero() || f.Detected.After(f.Decided) {
		f.Detected = f.Decided
	}
	if !f.FaultKnown || f.Fault.After(f.Detected) {
		f.Fault = f.Detected
	}
	if n := len(r.d.Commands); n > 0 {
		if res := h.results[r.d.Commands[n-1]]; res != nil && res.Node == r.d.To {
			for _, name := range answerSteps {
				if i := slices.IndexFunc(res.Steps, func(s events.Step) bool { return s.Name == name }); i >= 0 && !res.Steps[i].At.IsZero() {
					f.Answered, f.AnsweredBy = res.Steps[i].At, name
					break
				}
			}
			if f.Answered.IsZero() && len(res.Steps) > 0 {
				last := res.Steps[len(res.Steps)-1]
				f.Answered, f.AnsweredBy = last.At, last.Name
			}
		}
	}
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	f.DetectMS, f.DecideMS = ms(f.Detected.Sub(f.Fault)), ms(f.Decided.Sub(f.Detected))
	if !f.Answered.IsZero() && f.Answered.Sub(f.Decided) < failoverWithin {
		f.ActMS = max(0, ms(f.Answered.Sub(f.Decided)))
	} else {
		f.Answered, f.AnsweredBy = time.Time{}, ""
	}
	f.TotalMS = f.DetectMS + f.DecideMS + f.ActMS
	return f
}
