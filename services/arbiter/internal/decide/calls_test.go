package decide

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/events"
)

// up is what a node's calls summary counts.
type callsUpOn struct {
	channels, carriable, anchored, incomplete, unrecorded int
	group                                                 string // "pbx" unless set
}

// callsOn sends node's replicator's calls summary (restated every 2 s), as
// the recorder publishes it, and remembers its id.
func (f *fx) callsOn(node string, c callsUpOn) Output {
	group := c.group
	if group == "" {
		group = "pbx"
	}
	calls := c.carriable + c.anchored + c.incomplete + c.unrecorded
	s := events.CallsSummary{Node: node, Group: group, Holder: true, Epoch: 1, IntervalMS: 2000, Channels: c.channels,
		CarriedChannels: 2 * c.carriable, Calls: calls, Carriable: c.carriable, Anchored: c.anchored, Incomplete: c.incomplete,
		Unrecorded: c.unrecorded, At: f.now}
	if err := s.Validate(); err != nil {
		f.t.Fatalf("test summary %+v: %v", s, err)
	}
	env := f.env(node, "replicator")
	f.summaries = append(f.summaries, env.ID)
	return f.handle(env, &s) // a pointer, as events.Decode returns
}

func summaryOf(node string, c callsUpOn) func(f *fx) Output {
	return func(f *fx) Output { return f.callsOn(node, c) }
}

// decisionOf is the first decision of the last output.
func decisionOf(f *fx) (events.ArbiterDecision, bool) {
	for _, b := range f.last {
		if d, ok := b.p.(events.ArbiterDecision); ok {
			return d, true
		}
	}
	return events.ArbiterDecision{}, false
}

// TestPlannedMovesWaitOnlyForWhatCannotSurvive: with a current calls
// summary a planned move waits only for the channels of calls a new holder
// cannot carry across; a holder whose only calls are carried moves at
// once, and the trail says how many were carried.
func TestPlannedMovesWaitOnlyForWhatCannotSurvive(t *testing.T) {
	moved := []string{"planned moved", "switchover n1->n2", "release n1", "claim n2 prev=n1 fenced"}
	cases := []struct {
		name   string
		steps  []step
		verify func(t *testing.T, f *fx)
	}{
		{
			name: "only carried calls: moves at once, the trail says how many were carried",
			steps: []step{
				{name: "the prober counts 4 channels", do: channels("n1", 4)},
				{name: "2 calls, both carriable", do: summaryOf("n1", callsUpOn{channels: 4, carriable: 2})},
				{name: "switchover", do: asking(switchTo("n2", "", 0), "the holder has drained, moving to n2"),
					want: append([]string{"op switchover accepted=true"}, moved...), reason: "n1 has 4 active channels, all in 2 calls carried across (limit 0)"},
			},
			verify: func(t *testing.T, f *fx) {
				var pm events.PlannedMove
				var d events.ArbiterDecision
				for _, b := range f.last {
					switch p := b.p.(type) {
					case events.PlannedMove:
						pm = p
					case events.ArbiterDecision:
						d = p
					}
				}
				sum := f.summaries[len(f.summaries)-1]
				if pm.Calls == nil || pm.Calls.Carriable != 2 || pm.Calls.CarriedChannels != 4 || pm.Calls.Summary != sum ||
					!slices.Contains(pm.CausedBy, sum) || pm.Channels == nil || *pm.Channels != 4 {
					t.Fatalf("moved stage %+v (calls %+v) does not carry the summary %s", pm, pm.Calls, sum)
				}
				if d.Calls == nil || d.Calls.Calls != 2 || d.Calls.Carriable != 2 || d.Calls.Summary != sum || !slices.Contains(d.CausedBy, sum) || d.Forced {
					t.Fatalf("decision %+v (calls %+v) does not say what it carries", d, d.Calls)
				}
			},
		},
		{
			name: "waits only for the call that cannot survive",
			steps: []step{
				{name: "the prober counts 6 channels", do: channels("n1", 6)},
				{name: "2 carriable calls and an anchored one", do: summaryOf("n1", callsUpOn{channels: 6, carriable: 2, anchored: 1})},
				{name: "switchover", do: asking(switchTo("n2", "", 0), "waits for n1 to drain"), want: []string{"op switchover accepted=true", "planned waiting"}},
				{name: "the same summary again: nothing new", do: summaryOf("n1", callsUpOn{channels: 6, carriable: 2, anchored: 1})},
				{name: "the anchored call ends: moves, though the prober's count has not changed yet",
					do: summaryOf("n1", callsUpOn{channels: 4, carriable: 2}), want: moved, reason: "all in 2 calls carried across (limit 0)"},
			},
			verify: func(t *testing.T, f *fx) {
				d, _ := decisionOf(f)
				if d.Calls == nil || d.Calls.Channels != 4 || d.Calls.Summary != f.summaries[len(f.summaries)-1] {
					t.Fatalf("the move does not rest on the last summary: %+v", d.Calls)
				}
			},
		},
		{
			name: "the reason names what is waited for",
			steps: []step{
				{name: "busy", do: summaryOf("n1", callsUpOn{channels: 9, carriable: 2, anchored: 1, incomplete: 1})},
				{name: "switchover", do: func(f *fx) Output {
					rep, out := f.ask(switchTo("n2", "", 0))
					want := "n1 has 9 active channels, 4 of them in 2 calls carried across, 5 not (1 anchored call, 1 incomplete call, 1 channel in no call of two) (limit 0)"
					if !strings.Contains(rep.Message, want) {
						f.t.Fatalf("reply %q does not say %q", rep.Message, want)
					}
					if pm := plannedOf(f); len(pm) != 1 || pm[0].Calls == nil || pm[0].Calls.Uncarried() != 5 {
						f.t.Fatalf("waiting stage %+v", pm)
					}
					return out
				}, want: []string{"op switchover accepted=true", "planned waiting"}},
			},
			verify: func(t *testing.T, f *fx) {
				p := f.c.Snapshot().Groups[0].Planned
				if p == nil || p.Calls == nil || p.Calls.Carriable != 2 || p.Channels == nil || *p.Channels != 9 {
					t.Fatalf("the state (status) does not show the carried calls: %+v", p)
				}
			},
		},
		{
			name: "a summary older than three of its intervals is absent: the heartbeat's count is waited for",
			steps: []step{
				{name: "the prober counts 4 channels", do: channels("n1", 4)},
				{name: "both calls carriable", do: summaryOf("n1", callsUpOn{channels: 4, carriable: 2})},
				{name: "7 s without a summary (heartbeats go on)", do: run(7 * time.Second)},
				{name: "switchover waits for every channel", do: asking(switchTo("n2", "", 0), "n1 has 4 active channels (limit 0)"),
					want: []string{"op switchover accepted=true", "planned waiting"}},
				{name: "the summary comes back: moves", do: summaryOf("n1", callsUpOn{channels: 4, carriable: 2}), want: moved},
			},
		},
		{
			name: "a summary of another group says nothing of this one",
			steps: []step{
				{name: "the prober counts 2 channels", do: channels("n1", 2)},
				{name: "a carriable call of group other", do: summaryOf("n1", callsUpOn{channels: 2, carriable: 1, group: "other"})},
				{name: "switchover waits", do: asking(switchTo("n2", "", 0), "n1 has 2 active channels (limit 0)"),
					want: []string{"op switchover accepted=true", "planned waiting"}},
			},
		},
		{
			name: "a silent holder is not drained, whatever its last summary said",
			steps: []step{
				{name: "no calls", do: summaryOf("n1", callsUpOn{})},
				{name: "n1's heartbeats stop for 4 s (peers still reach it)", do: run(4*time.Second, "n1"), want: []string{"hold n1"}},
				{name: "a fresh summary", do: summaryOf("n1", callsUpOn{})},
				{name: "switchover waits", do: asking(switchTo("n2", "", 0), "n1 is silent on the bus"),
					want: []string{"op switchover accepted=true", "planned waiting"}},
			},
		},
		{
			name: "node standby with carried calls only: leaves at once",
			steps: []step{
				{name: "the prober counts 2 channels", do: channels("n1", 2)},
				{name: "one carriable call", do: summaryOf("n1", callsUpOn{channels: 2, carriable: 1})},
				{name: "standby", do: asking(events.OperatorRequest{Verb: events.OpNodeStandby, Node: "n1", Reason: "disk"}, "moving to n2"),
					want: append([]string{"op node_standby accepted=true"}, moved...), reason: "all in 1 call carried across"},
			},
		},
		{
			name: "now: says what it carries and what it cuts, and is not forced when all is carried",
			steps: []step{
				{name: "the prober counts 2 channels", do: channels("n1", 2)},
				{name: "one carriable call", do: summaryOf("n1", callsUpOn{channels: 2, carriable: 1})},
				{name: "switchover now", do: asking(switchTo("n2", events.DrainNow, 0), "n1 has 2 active channels, all in 1 call carried across: none cut"),
					want:   []string{"op switchover accepted=true", "switchover n1->n2", "release n1", "claim n2 prev=n1 fenced"},
					reason: "n1 had 1 call up by its calls summary of 2026-11-30T02:30:00Z: 1 to carry across"},
			},
			verify: func(t *testing.T, f *fx) {
				if d, ok := decisionOf(f); !ok || d.Forced || d.Calls == nil || d.Calls.Carriable != 1 {
					t.Fatalf("decision %+v", d)
				}
			},
		},
		{
			name: "a summary with no planned move waiting decides nothing",
			steps: []step{
				{name: "summaries come and go", do: summaryOf("n1", callsUpOn{channels: 2, anchored: 1})},
				{name: "and again", do: summaryOf("n2", callsUpOn{})},
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFx(t, testConfig())
			f.boot()
			f.play(tc.steps)
			if tc.verify != nil {
				tc.verify(t, f)
			}
		})
	}
}

// TestFailoverSaysWhatCallsWereUp: a failover decision carries what the
// old holder's last calls summary said, and cites it: how many calls were
// up, how many may be carried across and how many end, and why.
func TestFailoverSaysWhatCallsWereUp(t *testing.T) {
	t.Run("the last summary before the fault, stale or not", func(t *testing.T) {
		f := newFx(t, testConfig())
		f.boot()
		f.callsOn("n1", callsUpOn{channels: 8, carriable: 2, anchored: 1, unrecorded: 1})
		at := f.now
		sum := f.summaries[len(f.summaries)-1]
		run(10 * time.Second)(f) // Asterisk dies: the replicator stops summarising
		f.play([]step{{name: "n1 down", do: self("n1", down), want: []string{"failover n1->n2", "release n1", "claim n2 prev=n1 fenced"},
			reason: "n1 had 4 calls up by its calls summary of " + at.Format(time.RFC3339) + ": 2 to carry across, 2 lost (1 anchored call, 1 unrecorded call)"}})
		d, _ := decisionOf(f)
		if d.Calls == nil || d.Calls.Calls != 4 || d.Calls.Carriable != 2 || d.Calls.Anchored != 1 || d.Calls.Unrecorded != 1 ||
			d.Calls.Summary != sum || d.Calls.Node != "n1" || !d.Calls.At.Equal(at) {
			t.Fatalf("decision's calls %+v", d.Calls)
		}
		if d.CausedBy[len(d.CausedBy)-1] != sum || d.CausedBy[0] == sum {
			t.Fatalf("caused_by %v: the summary %s is cited, after what caused the move", d.CausedBy, sum)
		}
	})
	t.Run("no summary heard: nothing said", func(t *testing.T) {
		f := newFx(t, testConfig())
		f.boot()
		f.play([]step{{name: "n1 down", do: self("n1", down), want: []string{"failover n1->n2", "release n1", "claim n2 prev=n1 fenced"}}})
		if d, _ := decisionOf(f); d.Calls != nil || strings.Contains(d.Reason, "calls summary") {
			t.Fatalf("decision %+v says calls without a summary", d)
		}
	})
	t.Run("a summary from before the node took the group is not its tenure's", func(t *testing.T) {
		f := newFx(t, testConfig())
		f.boot()
		f.callsOn("n2", callsUpOn{channels: 2, anchored: 1}) // n2 stands by with a call of its own
		f.now = f.now.Add(time.Second)
		f.setSelf("n1", down)
		f.result("pbx", "n2", events.OutcomeApplied)
		f.setSelf("n1", up)
		run(time.Second)(f)
		f.play([]step{{name: "n2 down", do: self("n2", down), want: []string{"failover n2->n1", "release n2", "claim n1 prev=n2 fenced"}}})
		if d, _ := decisionOf(f); d.Calls != nil {
			t.Fatalf("decision cites a summary from before n2 held: %+v", d.Calls)
		}
		// After the move, n1's summaries are its tenure's.
		f.result("pbx", "n1", events.OutcomeApplied)
		run(time.Second)(f)
		f.callsOn("n1", callsUpOn{channels: 2, carriable: 1})
		f.play([]step{{name: "n1 down again", do: self("n1", down), want: []string{"failover n1->n3", "release n1", "claim n3 prev=n1 fenced"},
			reason: "n1 had 1 call up by its calls summary"}})
	})
}
