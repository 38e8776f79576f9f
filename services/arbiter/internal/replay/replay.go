// Package replay feeds a stretch of the audit stream through the arbiter's
// decision core and sets every decision it makes beside the one the arbiter
// recorded, so that an explanation in the trail can be checked after the
// fact: the same inputs, at the same moments, under a given configuration,
// must give the same decisions.
//
// # What is replayed, and how faithfully
//
// Every decision records the core's clock (its envelope time), what made
// the core decide (events.ArbiterDecision.Trigger) and the last stored
// event it had read (Input). The replay feeds the stored inputs the arbiter
// reads (health transitions, heartbeats, command results, failback permits,
// replication reports, calls summaries) in stream order and, at each recorded decision,
// exactly up to its Input (from an arbiter's start, the inputs its watch
// read: each stream from the first event stored at or after the start
// announcement's time, Record.Stored); then it does what the arbiter did
// at that moment: handles the input, ticks, applies the recorded operator
// action, or re-issues a claim at a takeover. Each decision's ids are the recorded ones
// (the core draws them from the replay), so causes and commands compare
// exactly.
//
// Limits, each shown rather than hidden:
//   - The core's state is known at two kinds of points: an arbiter's start
//     announcement (an empty core) and a term's start (events.ArbiterTerm:
//     the state the new leader restored). The replay begins at the first
//     of either in what it reads; from a term start, the inputs before it
//     are given to the core as to a follower, from the first one the
//     replica read (ArbiterTerm.Since) when that is in what was read, else
//     from the beginning of the reading, where its view of the nodes then
//     begins (the events first telling a node's state, cited as causes,
//     may then differ).
//   - A change of leader is replayed on one core: each term restores the
//     state it recorded (or, for a term that recorded none, what the replay
//     itself would have persisted). The new leader's own view of the nodes
//     (since when each was heard) began at its own start, so a stability
//     time after a change of leader may differ. When a leader stopped is not
//     recorded: between its last decision and the next term the replay
//     keeps deciding, and what it decides there is flagged.
//   - When an input reached the arbiter is not recorded, only when its
//     producer stamped it: a time the core derives from one (healthy since,
//     healthy for) may differ by that delay. Reasons that differ only in
//     such times, by at most Options.Tolerance, are marked as agreeing in
//     substance (Row.Timing) and not counted as differences.
//   - Presence beacons travel on core NATS and are never stored: the replay
//     judges presence by heartbeats alone. A decision made because a node's
//     beacons stopped (Trigger beacon, or a silence noticed on a tick before
//     the heartbeats show it) is replayed on a tick and may differ.
//   - Failback permits are read by a separate consumer, so the arbiter may
//     have read one slightly earlier or later than its place in the stream.
package replay

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/services/arbiter/internal/decide"
)

// Record is one stored event, decoded as the services decode it.
type Record struct {
	Env     events.Envelope
	Payload events.Decoded
	// Stored is when its stream stored it (bus.Stored.At), by the
	// stream's clock; zero when unknown.
	Stored time.Time
}

// Decision is a decision with its envelope's facts. A planned move's
// stage (events.PlannedMove) is carried the same way, with Planned set and
// its stage as the Action, so that both are compared alike.
type Decision struct {
	ID      string
	At      time.Time
	Epoch   uint64
	Planned bool
	// Pin marks a pin's start or end (pin.go).
	Pin bool
	events.ArbiterDecision
}

// planned renders a planned move's stage as a Decision.
func planned(id string, at time.Time, epoch uint64, p events.PlannedMove) Decision {
	return Decision{ID: id, At: at, Epoch: epoch, Planned: true, ArbiterDecision: events.ArbiterDecision{
		Group: p.Group, Action: events.Action(p.Stage), From: p.From, To: p.To, Reason: p.Reason, CausedBy: p.CausedBy,
		Trigger: p.Trigger, Input: p.Input, InputAudit: p.InputAudit, InputLive: p.InputLive, Calls: p.Calls}}
}

// Row is one decision, recorded, replayed or both.
type Row struct {
	At       time.Time
	Group    string
	Recorded *Decision
	Replayed *Decision
	// Diffs lists what differs; empty when the two agree.
	Diffs []string
	// Timing lists differences in quoted times within the tolerance.
	Timing []string
	// NotCompared says why a recorded decision was not replayed.
	NotCompared string
}

// Same reports whether the row is a recorded decision the replay agrees with.
func (r Row) Same() bool {
	return r.Recorded != nil && r.Replayed != nil && len(r.Diffs) == 0 && r.NotCompared == ""
}

// Report is the outcome of a replay.
type Report struct {
	// Start is the arbiter start, or the term start (StartTerm set), the
	// replay begins at.
	Start     time.Time
	StartNode string
	StartTerm uint64
	Rows      []Row
	// Same, Differ and NotCompared count the rows.
	Same, Differ, NotCompared int
	// OtherPolicy lists the terms recorded under a policy other than the
	// one replayed (their digests differ): their differences may be the
	// configuration's, not the arbiter's.
	OtherPolicy []uint64
}

// Options tune the comparison.
type Options struct {
	// Tolerance is how far a time or duration quoted in a reason may be off
	// (the delay between an input's stamp and its arrival, rounded to the
	// second in reasons). Zero means one second.
	Tolerance time.Duration
}

// ErrNoStart is returned when the stretch read holds neither an arbiter
// start nor a term start.
var ErrNoStart = errors.New("no arbiter start and no term start in the events read: the decision core's state at their beginning is unknown (read from before an arbiter started or took the lease)")

// step is one moment at which the arbiter decided: every decision it
// recorded with the same clock, trigger and input.
type step struct {
	term    *Record // a term's start (events.ArbiterTerm): the state it restored
	at      time.Time
	trigger events.Trigger
	input   string
	// The last events read from the audit and the live stream; "" on
	// trails from before the live stream.
	inputAudit, inputLive string
	epoch                 uint64
	action                *Record // the operator action applied (trigger operator)
	recorded              []Decision
}

type engine struct {
	core   *decide.Core
	opts   Options
	ids    []string // the recorded ids the core draws next
	minted int
	cmds   map[string]Record // recorded command copies by id
	rows   []Row

	inputs []Record
	pos    map[string]int // input id -> index
	done   []bool         // inputs fed
	fed    int            // inputs before this one are all fed
	// liveTracked: the decisions read say where the arbiter was in the
	// live stream (InputLive); on a trail from before the live stream
	// they do not, and every input up to a step's is fed.
	liveTracked bool
	last        time.Time // the replay clock never goes backwards
	epoch       uint64
}

// Run replays trail (stored events in stream order) under cfg. cfg.NewID is
// replaced: the replay hands the core the recorded ids.
func Run(cfg decide.Config, trail []Record, opts Options) (Report, error) {
	if opts.Tolerance == 0 {
		opts.Tolerance = time.Second
	}
	e := &engine{opts: opts, cmds: map[string]Record{}, pos: map[string]int{}}
	policy := cfg.Digest()
	cfg.NewID = e.newID
	core, err := decide.New(cfg)
	if err != nil {
		return Report{}, err
	}
	e.core = core
	start := startOf(trail, cfg.Cluster)
	if start < 0 {
		return Report{}, ErrNoStart
	}
	rep := Report{Start: trail[start].Env.Time, StartNode: trail[start].Env.Source.Node}
	sc := newScan(trail, start)
	if _, ok := trail[start].Payload.(*events.ArbiterTerm); ok {
		rep.StartTerm = trail[start].Env.Epoch
	}
	for i, r := range trail {
		if r.Env.Cluster != cfg.Cluster {
			continue
		}
		if t, ok := r.Payload.(*events.ArbiterTerm); ok && t.Policy != "" && t.Policy != policy && !slices.Contains(rep.OtherPolicy, r.Env.Epoch) {
			rep.OtherPolicy = append(rep.OtherPolicy, r.Env.Epoch)
		}
		sc.add(e, i, r)
	}
	slices.SortStableFunc(sc.steps, func(a, b *step) int { return a.at.Compare(b.at) })
	if err := e.replay(trail[sc.inputsFrom].Env.Time, sc.lastPermit, sc.steps); err != nil {
		return Report{}, err
	}
	rep.Rows = e.rows
	rep.count()
	return rep, nil
}

// startOf is the index of the arbiter start or term start a replay of
// cluster begins at (-1: none). The core's state is known from an
// arbiter's start (empty) or from a term's start (what it restored).
func startOf(trail []Record, cluster string) int {
	return slices.IndexFunc(trail, func(r Record) bool {
		if r.Env.Cluster != cluster {
			return false
		}
		switch p := r.Payload.(type) {
		case *events.ServiceAnnounce:
			return p.Service == "arbiter" && p.State == events.ServiceStarted
		case *events.ArbiterTerm:
			return true
		}
		return false
	})
}

// scan sorts a trail into what the replay feeds (inputs, the permits in
// force at the start) and what it compares (steps: everything one call of
// the core recorded).
type scan struct {
	start int
	// inputsFrom is where the core's inputs begin: from a term, the
	// inputs before it are given to the core as to a follower, which is
	// how the replica that took the term came to know the nodes.
	inputsFrom int
	// read tells whether the arbiter read the input at an index.
	read func(i int) bool
	// lastPermit is each group's last permit before the inputs: the
	// arbiter reads it from before its start.
	lastPermit map[string]Record
	steps      []*step
	byKey      map[string]*step
}

func newScan(trail []Record, start int) *scan {
	sc := &scan{start: start, inputsFrom: start, lastPermit: map[string]Record{}, byKey: map[string]*step{}}
	sc.read = func(i int) bool { return i >= sc.inputsFrom }
	switch t := trail[start].Payload.(type) {
	case *events.ServiceAnnounce:
		// From an arbiter start the replica read each stream from the
		// first event stored at or after its announcement's time (its
		// watch's Since), not from the announcement's place in the merged
		// trail: an input stamped just before the announcement may be
		// stored after it, and then the arbiter read it.
		sc.read = readFrom(trail, trail[start].Env.Time, start)
	case *events.ArbiterTerm:
		sc.inputsFrom = 0
		if i := slices.IndexFunc(trail[:start], func(r Record) bool { return r.Env.ID == t.Since }); i >= 0 {
			sc.inputsFrom = i // where the replica's own view began
		}
	}
	return sc
}

// stepOf is the step r belongs to: everything one call of the core
// recorded shares its clock, term and replica.
func (sc *scan) stepOf(r Record) *step {
	k := fmt.Sprintf("%d/%d/%s", r.Env.Time.UnixNano(), r.Env.Epoch, r.Env.Source.Node)
	s := sc.byKey[k]
	if s == nil {
		s = &step{at: r.Env.Time, epoch: r.Env.Epoch}
		sc.byKey[k] = s
		sc.steps = append(sc.steps, s)
	}
	return s
}

// add takes the record at index i of the trail.
func (sc *scan) add(e *engine, i int, r Record) {
	switch p := r.Payload.(type) {
	case *events.ClaimIP, *events.ReleaseIP:
		e.cmds[r.Env.ID] = r
	case *events.ArbiterDecision, *events.PlannedMove, *events.GroupPin:
		sc.addDecision(e, i, r)
	case *events.OperatorAction:
		// The leaders hold is the arbiter's steward's, not its core's.
		if i < sc.start || p.Stage == events.StageRequested || p.Verb.ForLeaders() {
			return
		}
		// The outcome's record comes first in its output, with the
		// core's clock: the decisions it caused join its step.
		rec := r
		s := sc.stepOf(r)
		s.action, s.trigger = &rec, events.TriggerOperator
		if p.Input != "" {
			s.input, s.inputAudit, s.inputLive = p.Input, p.InputAudit, p.InputLive
			e.track(p.InputAudit, p.InputLive)
		}
	case *events.ArbiterTerm:
		if i >= sc.start {
			rec := r
			sc.steps = append(sc.steps, &step{term: &rec, at: r.Env.Time, epoch: r.Env.Epoch, input: p.Input,
				inputAudit: p.InputAudit, inputLive: p.InputLive})
			e.track(p.InputAudit, p.InputLive)
		}
	case *events.FailbackPermit:
		if i < sc.inputsFrom {
			sc.lastPermit[p.Group] = r
			return
		}
		e.addInput(r)
	case *events.HealthTransition, *events.NodeHeartbeat, *events.CommandResult, *events.ReplicationStatus, *events.CallsSummary:
		if sc.read(i) {
			e.addInput(r)
		}
	}
}

// addDecision takes a recorded decision: into its step from the start on,
// as a row not compared before it.
func (sc *scan) addDecision(e *engine, i int, r Record) {
	d := Decision{ID: r.Env.ID, At: r.Env.Time, Epoch: r.Env.Epoch}
	switch v := r.Payload.(type) {
	case *events.PlannedMove:
		d = planned(r.Env.ID, r.Env.Time, r.Env.Epoch, *v)
	case *events.GroupPin:
		d = pinned(r.Env.ID, r.Env.Time, r.Env.Epoch, *v)
	case *events.ArbiterDecision:
		d.ArbiterDecision = *v
	}
	if i < sc.start {
		e.rows = append(e.rows, Row{At: d.At, Group: d.Group, Recorded: &d, NotCompared: "before the arbiter start or term start the replay begins at"})
		return
	}
	s := sc.stepOf(r)
	s.recorded = append(s.recorded, d)
	if s.input == "" {
		s.input = d.Input
	}
	if s.inputAudit == "" && s.inputLive == "" {
		s.inputAudit, s.inputLive = d.InputAudit, d.InputLive
	}
	e.track(d.InputAudit, d.InputLive)
	if s.trigger == "" {
		s.trigger = d.Trigger
	}
}

// replay runs the core from from: the permits in force first, then every
// step with the inputs before it, then the inputs left.
func (e *engine) replay(from time.Time, lastPermit map[string]Record, steps []*step) error {
	e.clock(from)
	e.core.Tick(e.last) // the core's clock starts with the arbiter
	for _, g := range slices.Sorted(maps.Keys(lastPermit)) {
		r := lastPermit[g]
		e.emitted(e.last, e.core.Handle(e.last, r.Env, r.Payload))
	}
	for _, s := range steps {
		if err := e.play(s); err != nil {
			return err
		}
	}
	for e.fed < len(e.inputs) {
		e.feed(e.fed)
	}
	slices.SortStableFunc(e.rows, func(a, b Row) int { return a.At.Compare(b.At) })
	return nil
}

// count tallies the rows.
func (r *Report) count() {
	for _, row := range r.Rows {
		switch {
		case row.NotCompared != "":
			r.NotCompared++
		case row.Same():
			r.Same++
		default:
			r.Differ++
		}
	}
}

// readFrom tells which inputs an arbiter that announced its start at
// since read: in each stream (audit, live), every one from the first stored
// at or after since, as a consumer started at that time delivers them. A
// trail without stored times (Record.Stored zero) falls back to what comes
// after the announcement at index start.
func readFrom(trail []Record, since time.Time, start int) func(int) bool {
	first := map[bool]int{} // live stream or not -> index of its first event read
	for i, r := range trail {
		switch r.Payload.(type) {
		case *events.HealthTransition, *events.NodeHeartbeat, *events.CommandResult, *events.ReplicationStatus, *events.CallsSummary:
		default:
			continue // not an input: other streams, other clocks
		}
		live := events.IsLive(r.Env.Type)
		if _, ok := first[live]; ok {
			continue
		}
		if r.Stored.IsZero() {
			if i > start {
				first[live] = i
			}
			continue
		}
		if !r.Stored.Before(since) {
			first[live] = i
		}
	}
	return func(i int) bool {
		f, ok := first[events.IsLive(trail[i].Env.Type)]
		return ok && i >= f
	}
}

func (e *engine) addInput(r Record) {
	e.pos[r.Env.ID] = len(e.inputs)
	e.inputs = append(e.inputs, r)
	e.done = append(e.done, false)
}

func (e *engine) newID() string {
	if len(e.ids) > 0 {
		id := e.ids[0]
		e.ids = e.ids[1:]
		return id
	}
	e.minted++
	return fmt.Sprintf("replay-%d", e.minted)
}

// clock moves the replay's clock to t, never backwards: an input stamped by
// a producer whose clock is a little behind is taken as read now.
func (e *engine) clock(t time.Time) time.Time {
	if t.After(e.last) {
		e.last = t
	}
	return e.last
}

// feed gives the core input i at the time its producer stamped it.
func (e *engine) feed(i int) {
	r := e.inputs[i]
	e.markFed(i)
	at := e.clock(r.Env.Time)
	e.emitted(at, e.core.Handle(at, r.Env, r.Payload))
}

// track notes that the trail records each stream's place (InputAudit,
// InputLive): it is from a bus with the live stream.
func (e *engine) track(audit, live string) {
	if audit != "" || live != "" {
		e.liveTracked = true
	}
}

func (e *engine) posOr(id string, none int) int {
	if i, ok := e.pos[id]; ok {
		return i
	}
	return none
}

func (e *engine) markFed(i int) {
	e.done[i] = true
	for e.fed < len(e.done) && e.done[e.fed] {
		e.fed++
	}
}

// feedUpTo feeds, in order, the inputs the arbiter had read before a step:
// the audit stream's up to index stop, and the live stream's up to
// liveStop. The arbiter reads the two streams at once, so either may be
// ahead of the other (and it reads only what is published after it starts:
// none of the live inputs before its first one). On a trail without a
// record of each stream's place (from before the live stream) every input
// up to stop is fed. skip is the step's own input, handled at its time.
func (e *engine) feedUpTo(stop, liveStop int, constrained bool, skip int) {
	limit := stop
	if constrained {
		limit = max(stop, liveStop)
	}
	for i := e.fed; i <= limit && i < len(e.inputs); i++ {
		if e.done[i] || i == skip {
			continue
		}
		if constrained && events.IsLive(e.inputs[i].Env.Type) {
			if i > liveStop {
				continue
			}
		} else if i > stop {
			continue
		}
		e.feed(i)
	}
}

// emitted records decisions the replay made where the arbiter recorded none.
func (e *engine) emitted(at time.Time, out decide.Output) {
	for _, d := range decisions(at, e.epoch, out) {
		e.rows = append(e.rows, Row{At: at, Group: d.Group, Replayed: &d, Diffs: []string{"decided by the replay only"}})
	}
}

// lead makes the core the leader of the step's term. A new term restores
// what the core would have persisted, as a successor does.
func (e *engine) lead(epoch uint64) error {
	if epoch == e.epoch {
		return nil
	}
	if e.epoch != 0 {
		if err := e.core.Restore(e.core.Snapshot()); err != nil {
			return fmt.Errorf("replay: restore at epoch %d: %w", epoch, err)
		}
	}
	if err := e.core.SetLeadership(epoch, true); err != nil {
		return fmt.Errorf("replay: leadership at epoch %d: %w", epoch, err)
	}
	e.epoch = epoch
	return nil
}

func (e *engine) play(s *step) error {
	if s.term != nil {
		return e.takeTerm(s)
	}
	target := -1
	if i, ok := e.pos[s.input]; ok {
		target = i
	}
	stop, skip := target, -1
	if s.trigger == events.TriggerEvent {
		stop, skip = target-1, target // the input itself is handled at the step's time
	}
	liveStop := -1
	if e.liveTracked {
		// Each stream's place; one not in what was read is older than all
		// of it (the live stream keeps hours): none of that stream's
		// inputs had been read then.
		stop = e.posOr(s.inputAudit, -1)
		liveStop = e.posOr(s.inputLive, -1)
	}
	e.feedUpTo(stop, liveStop, e.liveTracked, skip)
	if target < 0 && s.input != "" {
		// The input is not in what was read: feed what was stamped before.
		for e.fed < len(e.inputs) && e.inputs[e.fed].Env.Time.Before(s.at) {
			e.feed(e.fed)
		}
	}
	if err := e.lead(s.epoch); err != nil {
		return err
	}
	at := e.clock(s.at)
	e.ids = e.ids[:0]
	for _, d := range s.recorded {
		e.ids = append(e.ids, d.ID)
		e.ids = append(e.ids, d.Commands...)
	}
	var out decide.Output
	switch s.trigger {
	case events.TriggerEvent:
		if target < 0 {
			e.rows = append(e.rows, e.unreplayable(s, "its input "+s.input+" is not in the events read")...)
			return nil
		}
		r := e.inputs[target]
		if !e.done[target] {
			e.markFed(target)
		}
		out = e.core.Handle(at, r.Env, r.Payload)
	case events.TriggerOperator:
		if s.action == nil {
			e.rows = append(e.rows, e.unreplayable(s, "the operator action is not in the events read")...)
			return nil
		}
		a := s.action.Payload.(*events.OperatorAction)
		req := decide.Request{ID: s.action.Env.ID, RequestedID: s.action.Env.CausationID, OperatorRequest: events.OperatorRequest{
			Verb: a.Verb, Group: a.Group, Node: a.Node, Reason: a.Reason, Operator: a.Operator, Comment: a.Comment,
			Drain: a.Drain, WithinMS: a.WithinMS, Cancel: a.Cancel, ForMS: a.ForMS, Until: a.Until}}
		// Operate names the action by its recorded id; its decisions draw next.
		var rep decide.Reply
		rep, out = e.core.Operate(at, req)
		if rep.Accepted != a.Accepted {
			e.rows = append(e.rows, Row{At: at, Group: a.Group, Diffs: []string{fmt.Sprintf("operator action %s %s: accepted %v, replayed %v (%s)",
				a.Verb, s.action.Env.ID, a.Accepted, rep.Accepted, rep.Message)}})
		}
	case events.TriggerTakeover:
		if len(s.recorded) == 0 || len(s.recorded[0].CausedBy) == 0 {
			return nil
		}
		out = e.core.ClaimUnsent(at, s.recorded[0].CausedBy[0])
	default: // tick, and beacon (not stored: the clock is all the replay has)
		out = e.core.Tick(at)
	}
	e.ids = e.ids[:0]
	e.compare(s, at, out)
	return nil
}

// takeTerm restores what the term began from and leads under it, after
// the inputs the replica had read.
func (e *engine) takeTerm(s *step) error {
	if e.liveTracked {
		e.feedUpTo(e.posOr(s.inputAudit, -1), e.posOr(s.inputLive, -1), true, -1)
	} else if i, ok := e.pos[s.input]; ok {
		e.feedUpTo(i, i, false, -1)
	}
	var st decide.State
	if err := json.Unmarshal(s.term.Payload.(*events.ArbiterTerm).State, &st); err != nil {
		return fmt.Errorf("replay: term %d: state: %w", s.epoch, err)
	}
	e.clock(s.at)
	if err := e.core.Restore(st); err != nil {
		return fmt.Errorf("replay: term %d: %w", s.epoch, err)
	}
	if err := e.core.SetLeadership(s.epoch, true); err != nil {
		return fmt.Errorf("replay: term %d: %w", s.epoch, err)
	}
	e.epoch = s.epoch
	return nil
}

func (e *engine) unreplayable(s *step, why string) []Row {
	var rows []Row
	for _, d := range s.recorded {
		rows = append(rows, Row{At: d.At, Group: d.Group, Recorded: &d, NotCompared: why})
	}
	return rows
}

// decisions picks the decisions and planned-move stages out of an output.
func decisions(at time.Time, epoch uint64, out decide.Output) []Decision {
	var ds []Decision
	for _, em := range out.Emits {
		switch p := em.Payload.(type) {
		case events.ArbiterDecision:
			ds = append(ds, Decision{ID: em.ID, At: at, Epoch: epoch, ArbiterDecision: p})
		case events.PlannedMove:
			ds = append(ds, planned(em.ID, at, epoch, p))
		case events.GroupPin:
			ds = append(ds, pinned(em.ID, at, epoch, p))
		}
	}
	return ds
}

// compare pairs the step's recorded decisions with the replayed ones, in
// order within each group.
func (e *engine) compare(s *step, at time.Time, out decide.Output) {
	replayed := decisions(at, e.epoch, out)
	cmds := map[string]events.Payload{}
	for _, em := range out.Emits {
		if _, ok := em.Payload.(events.Command); ok {
			cmds[em.ID] = em.Payload
		}
	}
	used := make([]bool, len(replayed))
	for _, rec := range s.recorded {
		row := Row{At: rec.At, Group: rec.Group, Recorded: &rec}
		for j, d := range replayed {
			if !used[j] && d.Group == rec.Group && d.Planned == rec.Planned && d.Pin == rec.Pin {
				used[j] = true
				row.Replayed = &replayed[j]
				row.Diffs, row.Timing = e.diff(rec, d, cmds)
				break
			}
		}
		if row.Replayed == nil {
			row.Diffs = []string{"not decided by the replay"}
		}
		e.rows = append(e.rows, row)
	}
	for j, d := range replayed {
		if !used[j] {
			e.rows = append(e.rows, Row{At: at, Group: d.Group, Replayed: &d, Diffs: []string{"decided by the replay only"}})
		}
	}
}

func (e *engine) diff(rec, rep Decision, cmds map[string]events.Payload) (diffs, timing []string) {
	field := func(name string, a, b any) {
		if fmt.Sprint(a) != fmt.Sprint(b) {
			diffs = append(diffs, fmt.Sprintf("%s: recorded %v, replayed %v", name, a, b))
		}
	}
	field("action", rec.Action, rep.Action)
	field("from", rec.From, rep.From)
	field("to", rec.To, rep.To)
	field("needs_human", rec.NeedsHuman, rep.NeedsHuman)
	field("forced", rec.Forced, rep.Forced)
	field("calls", callsOf(rec.Calls), callsOf(rep.Calls))
	field("caused_by", rec.CausedBy, rep.CausedBy)
	field("commands", rec.Commands, rep.Commands)
	if rec.Reason != rep.Reason {
		if near, why := sameButTimes(rec.Reason, rep.Reason, e.opts.Tolerance); near {
			timing = append(timing, why)
		} else {
			diffs = append(diffs, fmt.Sprintf("reason: recorded %q, replayed %q", rec.Reason, rep.Reason))
		}
	}
	for _, id := range rec.Commands {
		r, ok := e.cmds[id]
		p, ok2 := cmds[id]
		if !ok || !ok2 {
			continue // not in the events read, or already reported in commands
		}
		if a, b := describe(r.Payload), describe(p); a != b {
			diffs = append(diffs, fmt.Sprintf("command %s: recorded %s, replayed %s", id, a, b))
		}
	}
	return diffs, timing
}

// callsOf renders the calls a decision says its move leaves: the
// summary it cites and its counts.
func callsOf(h *events.HolderCalls) string {
	if h == nil {
		return "none"
	}
	return fmt.Sprintf("%s of %s: %d calls (%d carriable, %d anchored, %d incomplete, %d unrecorded), %d channels (%d carried)",
		h.Summary, h.Node, h.Calls, h.Carriable, h.Anchored, h.Incomplete, h.Unrecorded, h.Channels, h.CarriedChannels)
}

// describe renders what a command asks, without its deadline (the core's
// clock plus a configured TTL, compared through the decision's time).
func describe(p events.Payload) string {
	switch c := p.(type) {
	case *events.ClaimIP:
		return describe(*c)
	case *events.ReleaseIP:
		return describe(*c)
	case events.ClaimIP:
		return fmt.Sprintf("claim %s on %s (previous %s fenced %v, after %v)", strings.Join(c.Addresses, ","), c.Node, c.PreviousHolder, c.PreviousHolderFenced, c.AfterReleases)
	case events.ReleaseIP:
		return fmt.Sprintf("release %s on %s", strings.Join(c.Addresses, ","), c.Node)
	}
	return fmt.Sprintf("%T", p)
}

// quoted matches the times and durations a reason quotes.
var quoted = regexp.MustCompile(`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)|\b(\d+(\.\d+)?(ns|us|µs|ms|s|m|h))+\b`)

// sameButTimes reports whether two reasons differ only in the times and
// durations they quote, each by at most tol.
func sameButTimes(a, b string, tol time.Duration) (bool, string) {
	if quoted.ReplaceAllString(a, "\x00") != quoted.ReplaceAllString(b, "\x00") {
		return false, ""
	}
	qa, qb := quoted.FindAllString(a, -1), quoted.FindAllString(b, -1)
	var notes []string
	for i := range qa {
		if qa[i] == qb[i] {
			continue
		}
		d, ok := distance(qa[i], qb[i])
		if !ok || d > tol {
			return false, ""
		}
		notes = append(notes, fmt.Sprintf("%s vs %s", qa[i], qb[i]))
	}
	return true, "reason quotes " + strings.Join(notes, ", ") + " (within the tolerance)"
}

func distance(a, b string) (time.Duration, bool) {
	if ta, err := time.Parse(time.RFC3339Nano, a); err == nil {
		tb, err := time.Parse(time.RFC3339Nano, b)
		if err != nil {
			return 0, false
		}
		return abs(ta.Sub(tb)), true
	}
	da, err1 := time.ParseDuration(a)
	db, err2 := time.ParseDuration(b)
	if err1 != nil || err2 != nil {
		return 0, false
	}
	return abs(da - db), true
}

func abs(d time.Duration) time.Duration {
	if d < 0 {
		return -d
	}
	return d
}

// Print writes one line per decision, the replayed one beside the recorded
// one: "=" they agree, "~" they agree but for quoted times within the
// tolerance, "!" they differ (what differs follows), "-" not compared.
func (r Report) Print(w io.Writer) error {
	ew := &errWriter{w: w}
	if r.StartTerm != 0 {
		ew.printf("replay from the start of term %d on %s at %s (the state it restored)\n", r.StartTerm, r.StartNode, r.Start.Format(time.RFC3339Nano))
	} else {
		ew.printf("replay from the arbiter start on %s at %s\n", r.StartNode, r.Start.Format(time.RFC3339Nano))
	}
	for _, row := range r.Rows {
		mark := "="
		switch {
		case row.NotCompared != "":
			mark = "-"
		case len(row.Diffs) > 0:
			mark = "!"
		case len(row.Timing) > 0:
			mark = "~"
		}
		ew.printf("%s %s %-8s recorded: %s\n", mark, row.At.Format("2006-01-02T15:04:05.000Z07:00"), row.Group, summary(row.Recorded))
		if mark != "-" {
			ew.printf("  %25s replayed: %s\n", "", summary(row.Replayed))
		}
		for _, d := range row.Diffs {
			ew.printf("  %25s differs:  %s\n", "", d)
		}
		for _, d := range row.Timing {
			ew.printf("  %25s timing:   %s\n", "", d)
		}
		if row.NotCompared != "" {
			ew.printf("  %25s not compared: %s\n", "", row.NotCompared)
		}
	}
	ew.printf("%d decision(s): %d agree, %d differ, %d not compared\n", len(r.Rows), r.Same, r.Differ, r.NotCompared)
	if len(r.OtherPolicy) > 0 {
		ew.printf("note: term(s) %v ran under another policy than the configuration replayed (digests differ)\n", r.OtherPolicy)
	}
	return ew.err
}

func summary(d *Decision) string {
	if d == nil {
		return "(none)"
	}
	what := strings.ToUpper(string(d.Action))
	if d.Planned {
		what = "PLANNED MOVE " + what
	}
	if d.Pin {
		what = "PIN " + strings.ToUpper(strings.TrimPrefix(string(d.Action), "pin_"))
	}
	s := fmt.Sprintf("%s %s->%s: %s [%s", what, d.From, d.To, d.Reason, d.Trigger)
	if d.NeedsHuman {
		s += ", needs a human"
	}
	return s + "] id=" + d.ID
}

type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) printf(format string, a ...any) {
	if e.err == nil {
		_, e.err = fmt.Fprintf(e.w, format, a...)
	}
}
