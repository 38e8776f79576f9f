package view_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/fanpbx/fan/cmd/internal/view"
	"github.com/fanpbx/fan/pkg/events"
)

var t0 = time.Date(2026, 12, 1, 22, 0, 0, 0, time.UTC)

// trail builds entries in order, each a millisecond after the one before,
// with ids that say what they are.
type trail struct {
	entries []view.Entry
	n       int
}

func (tr *trail) add(p events.Decoded, cause string) string {
	tr.n++
	id := fmt.Sprintf("0193a1b2-0000-7000-8000-%012d", tr.n)
	env := events.Envelope{ID: id, Type: p.EventType(), Time: t0.Add(time.Duration(tr.n) * time.Millisecond), Cluster: "lab",
		CausationID: cause, Source: events.Source{Service: "test", Node: "n"}}
	tr.entries = append(tr.entries, view.Entry{Env: env, P: p, Stored: env.Time})
	return id
}

// failover: n1's summary, its health down, the failover decision citing
// both, the release and the claim.
func failover(tr *trail, calls *events.HolderCalls) (dec, claim string) {
	sum := tr.add(&events.CallsSummary{Node: "n1", Group: "pbx", Holder: true, IntervalMS: 2000, Channels: 6, CarriedChannels: 4, Calls: 3,
		Carriable: 2, Anchored: 1, At: t0}, "")
	down := tr.add(&events.HealthTransition{Check: "pbx", TargetNode: "n1", Role: events.RoleSelf, From: events.HealthUp, To: events.HealthDown}, "")
	causes := []string{down}
	if calls != nil {
		calls.Summary = sum
		causes = append(causes, sum)
	}
	claim = fmt.Sprintf("0193a1b2-0000-7000-8000-%012d", tr.n+3)
	release := fmt.Sprintf("0193a1b2-0000-7000-8000-%012d", tr.n+2)
	dec = tr.add(&events.ArbiterDecision{Group: "pbx", Action: events.ActionFailover, From: "n1", To: "n2", Reason: "holder n1 reports pbx down",
		CausedBy: causes, Commands: []string{release, claim}, Calls: calls}, down)
	tr.add(&events.ReleaseIP{Group: "pbx", Node: "n1"}, dec)
	tr.add(&events.ClaimIP{Group: "pbx", Node: "n2"}, dec)
	return dec, claim
}

func upOnN1() *events.HolderCalls {
	return &events.HolderCalls{Node: "n1", At: t0, Channels: 6, CarriedChannels: 4, Calls: 3, Carriable: 2, Anchored: 1}
}

// TestExplainSaysWhatBecameOfTheCalls: explain of a failover shows the old
// holder's calls by its last summary (the decision's), and, looking
// forward from the claim, the new holder's adoption: in the claim's result,
// or in the calls.adopted event that follows a deferred one; and how many
// survived and were lost, and why.
func TestExplainSaysWhatBecameOfTheCalls(t *testing.T) {
	adopted := events.CallsAdoption{Adopted: 2, NotAdopted: map[string]int{events.NotAdoptedAnchored: 1}, From: []string{"n1"}}
	cases := []struct {
		name string
		// after adds what followed the claim.
		after       func(tr *trail, claim string)
		calls       *events.HolderCalls
		want        string // the outcome's line
		consequence []events.Type
	}{
		{
			name: "adopted within the claim",
			after: func(tr *trail, claim string) {
				tr.add(&events.CommandResult{CommandID: claim, CommandType: events.TypeClaimIP, Node: "n2", Group: "pbx",
					Outcome: events.OutcomeApplied, Calls: &adopted}, claim)
			},
			calls:       upOnN1(),
			want:        "calls: 3 calls up on n1 by its calls summary of 2026-12-01T22:00:00Z (2 carriable, 1 anchored); n2 adopted 2 from n1, not adopted: anchored 1; 2 survived, 1 lost (anchored 1)",
			consequence: []events.Type{events.TypeCommandResult},
		},
		{
			name: "deferred, then reported apart; an unrecorded call was lost for want of a record",
			after: func(tr *trail, claim string) {
				tr.add(&events.CommandResult{CommandID: claim, CommandType: events.TypeClaimIP, Node: "n2", Group: "pbx",
					Outcome: events.OutcomeApplied, Calls: &events.CallsAdoption{Deferred: true}}, claim)
				tr.add(&events.NodeHeartbeat{Node: "n2", IntervalMS: 1000}, "")
				tr.add(&events.CallsAdopted{Group: "pbx", Node: "n2", CommandID: claim, At: t0,
					Calls: events.CallsAdoption{Adopted: 1, NotAdopted: map[string]int{events.NotAdoptedAnchored: 1}, From: []string{"n1"}}}, claim)
			},
			calls: func() *events.HolderCalls {
				h := upOnN1()
				h.Carriable, h.Unrecorded, h.CarriedChannels = 1, 1, 2
				return h
			}(),
			want:        "calls: 3 calls up on n1 by its calls summary of 2026-12-01T22:00:00Z (1 carriable, 1 anchored, 1 unrecorded); n2 adopted 1 from n1, not adopted: anchored 1; 1 survived, 2 lost (anchored 1, no_record 1)",
			consequence: []events.Type{events.TypeCommandResult, events.TypeCallsAdopted},
		},
		{
			name: "deferred, and the report never came",
			after: func(tr *trail, claim string) {
				tr.add(&events.CommandResult{CommandID: claim, CommandType: events.TypeClaimIP, Node: "n2", Group: "pbx",
					Outcome: events.OutcomeApplied, Calls: &events.CallsAdoption{Deferred: true}}, claim)
			},
			calls:       upOnN1(),
			want:        "n2 deferred the adoption, and no calls.adopted event citing its claim is in the trail read within 2m0s",
			consequence: []events.Type{events.TypeCommandResult},
		},
		{
			name: "an adoption after the bound is not looked for",
			after: func(tr *trail, claim string) {
				tr.add(&events.CommandResult{CommandID: claim, CommandType: events.TypeClaimIP, Node: "n2", Group: "pbx",
					Outcome: events.OutcomeApplied, Calls: &events.CallsAdoption{Deferred: true}}, claim)
				tr.add(&events.CallsAdopted{Group: "pbx", Node: "n2", CommandID: claim, At: t0, Calls: adopted}, claim)
				tr.entries[len(tr.entries)-1].Env.Time = t0.Add(view.OutcomeWithin + time.Second)
			},
			calls:       upOnN1(),
			want:        "no calls.adopted event citing its claim",
			consequence: []events.Type{events.TypeCommandResult},
		},
		{
			name: "the records could not be read",
			after: func(tr *trail, claim string) {
				tr.add(&events.CommandResult{CommandID: claim, CommandType: events.TypeClaimIP, Node: "n2", Group: "pbx",
					Outcome: events.OutcomeApplied, Calls: &events.CallsAdoption{Error: "bucket fan_calls: timeout"}}, claim)
			},
			calls:       upOnN1(),
			want:        "n2 none adopted (bucket fan_calls: timeout); 0 survived, 3 lost (no_record 3)",
			consequence: []events.Type{events.TypeCommandResult},
		},
		{
			name: "the claim failed",
			after: func(tr *trail, claim string) {
				tr.add(&events.CommandResult{CommandID: claim, CommandType: events.TypeClaimIP, Node: "n2", Group: "pbx",
					Outcome: events.OutcomeFailed, Error: "netlink"}, claim)
			},
			calls:       upOnN1(),
			want:        "the claim on n2 was failed: no call was adopted there (the decision that follows says where the group went); 0 survived, 3 lost",
			consequence: []events.Type{events.TypeCommandResult},
		},
		{
			name:  "no result yet",
			after: func(*trail, string) {},
			calls: upOnN1(),
			want:  "the claim on n2 has no result within 2m0s of the decision in the trail read",
		},
		{
			name: "no summary and an executor that keeps no calls: the result follows, nothing said of calls",
			after: func(tr *trail, claim string) {
				tr.add(&events.CommandResult{CommandID: claim, CommandType: events.TypeClaimIP, Node: "n2", Group: "pbx",
					Outcome: events.OutcomeApplied}, claim)
			},
			consequence: []events.Type{events.TypeCommandResult},
		},
		{
			name: "no summary, but an adoption: what it kept is told",
			after: func(tr *trail, claim string) {
				tr.add(&events.CommandResult{CommandID: claim, CommandType: events.TypeClaimIP, Node: "n2", Group: "pbx",
					Outcome: events.OutcomeApplied, Calls: &adopted}, claim)
			},
			want:        "calls: no calls summary of n1 was heard (its replicator records no calls); n2 adopted 2 from n1, not adopted: anchored 1",
			consequence: []events.Type{events.TypeCommandResult},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tr := &trail{}
			dec, claim := failover(tr, tc.calls)
			tc.after(tr, claim)
			for _, root := range []string{dec, claim} {
				chain, err := view.Chain(tr.entries, root)
				if err != nil {
					t.Fatal(err)
				}
				var outcome *view.CallsOutcome
				var after []events.Type
				for _, l := range chain {
					if l.Calls != nil {
						outcome = l.Calls
					}
					if l.Consequence {
						after = append(after, l.Event.Type)
					}
				}
				if fmt.Sprint(after) != fmt.Sprint(tc.consequence) {
					t.Errorf("explain of %s: consequences %v, want %v", root, after, tc.consequence)
				}
				switch {
				case tc.want == "" && outcome != nil:
					t.Errorf("explain of %s: an outcome %q where there is nothing to tell", root, outcome)
				case tc.want != "" && (outcome == nil || !strings.Contains(outcome.String(), tc.want)):
					t.Errorf("explain of %s: outcome %v, want it to say %q", root, outcome, tc.want)
				}
			}
		})
	}
}

// TestExplainOfAHoldLooksForNothingAhead: a decision that moves nothing
// has no claim to follow.
func TestExplainOfAHoldLooksForNothingAhead(t *testing.T) {
	tr := &trail{}
	down := tr.add(&events.HealthTransition{Check: "pbx", TargetNode: "n2", Role: events.RoleSelf, From: events.HealthUp, To: events.HealthDown}, "")
	hold := tr.add(&events.ArbiterDecision{Group: "pbx", Action: events.ActionHold, From: "n1", Reason: "n2 down", CausedBy: []string{down}}, down)
	chain, err := view.Chain(tr.entries, hold)
	if err != nil {
		t.Fatal(err)
	}
	if len(chain) != 2 || chain[0].Calls != nil {
		t.Fatalf("chain %+v", chain)
	}
}

// TestCallsSummaryLine: what fanctl events --live prints of a summary.
func TestCallsSummaryLine(t *testing.T) {
	two := 2
	s := &events.CallsSummary{Node: "n1", Group: "pbx", Holder: true, Epoch: 7, IntervalMS: 2000, Channels: 9, CarriedChannels: 4, Calls: 4,
		Carriable: 2, Anchored: 1, Unrecorded: 1, At: t0, TimersEndpoints: &two, TimersSample: []string{"6001"}, TransportsRead: true,
		ContactNodeAddress: []string{"transport-node"}, MediaAddressRewritten: []string{"transport-float"}}
	want := "n1 (holder of pbx, epoch 7): 4 calls up, 2 carriable, 1 anchored, 1 unrecorded; 9 channels, 4 carried; session timers on 2 endpoints (6001 and 1 more); node address in Contact: transport-node; external_media_address on transport-float"
	if got := view.Summary(s); got != want {
		t.Fatalf("summary\n got %q\nwant %q", got, want)
	}
	quiet := &events.CallsSummary{Node: "n2", Group: "pbx", IntervalMS: 2000, At: t0, TransportsRead: true}
	if got := view.Summary(quiet); got != "n2 (standby of pbx): 0 calls up, 0 carriable; 0 channels, 0 carried" {
		t.Fatalf("a standby's summary %q", got)
	}
}

// TestCallNotes: the holder's summary warns of what keeps its calls from
// surviving; a standby's, another group's, or a holder's without
// settings, says nothing; a summary that stopped says the planned moves
// wait for every channel.
func TestCallNotes(t *testing.T) {
	now := t0.Add(time.Second)
	three := 3
	rec := func(group, holder string) view.Keyed[events.GroupStatus] {
		return view.Keyed[events.GroupStatus]{Key: events.GroupStatusKey("lab", group), Value: events.GroupStatus{Group: group, Holder: holder}}
	}
	sum := func(node, group string, at time.Time, mod func(*events.CallsSummary)) view.HeardCalls {
		s := &events.CallsSummary{Node: node, Group: group, Holder: true, IntervalMS: 2000, At: at, TransportsRead: true}
		if mod != nil {
			mod(s)
		}
		return view.HeardCalls{At: at, Summary: s}
	}
	bad := func(s *events.CallsSummary) {
		s.TimersEndpoints, s.TimersSample = &three, []string{"6001", "6002"}
		s.ContactNodeAddress, s.MediaAddressRewritten = []string{"transport-node"}, []string{"transport-float"}
	}
	notes := view.CallNotes([]view.Keyed[events.GroupStatus]{rec("pbx", "n1"), rec("fax", "f1"), rec("lab", "l1"), rec("empty", "")},
		map[string]view.HeardCalls{
			view.HeardKey("lab", "n1"): sum("n1", "pbx", t0, bad),
			view.HeardKey("lab", "f1"): sum("f1", "fax", t0, nil),   // all is well
			view.HeardKey("lab", "l1"): sum("l1", "other", t0, bad), // another group's
			view.HeardKey("lab", "n2"): sum("n2", "pbx", t0, bad),   // not the holder
		}, now)
	want := []string{
		"pbx: CALLS: 3 endpoints on n1 negotiate session timers (6001, 6002 and 1 more): a call carried across a failover ends at its first session refresh",
		"pbx: CALLS: dialogs on n1 carry the node's own address in their Contact (transport transport-node): after a failover the phones send their in-dialog requests and BYE to the dead node",
		"pbx: CALLS: transport transport-float on n1 sets external_media_address: Asterisk writes it into its direct-media re-INVITEs, so direct-media calls get no audio",
	}
	if len(notes) != len(want) {
		t.Fatalf("notes %q", notes)
	}
	for i, w := range want {
		if !strings.HasPrefix(notes[i], w) {
			t.Errorf("note %d\n got %q\nwant %q...", i, notes[i], w)
		}
	}
	stale := view.CallNotes([]view.Keyed[events.GroupStatus]{rec("pbx", "n1")},
		map[string]view.HeardCalls{view.HeardKey("lab", "n1"): sum("n1", "pbx", t0, bad)}, t0.Add(7*time.Second))
	if len(stale) != 1 || !strings.Contains(stale[0], "pbx: n1's calls summary is 7s old") || !strings.Contains(stale[0], "waits for every channel") {
		t.Fatalf("a stopped summary: %q", stale)
	}
}

// TestPlannedNoteSaysWhatIsCarried: the status line of a waiting move says
// which channels are carried across and how many are waited for.
func TestPlannedNoteSaysWhatIsCarried(t *testing.T) {
	six := 6
	g := events.GroupStatus{Group: "pbx", Holder: "n1", Planned: &events.PlannedStatus{PlannedFacts: events.PlannedFacts{Verb: events.OpSwitchover,
		From: "n1", To: "n2", Operator: "alice", RequestedAt: t0, Deadline: t0.Add(time.Hour), Drain: events.DrainWait, Channels: &six,
		Calls: &events.HolderCalls{Node: "n1", Summary: "s", At: t0, Channels: 6, CarriedChannels: 4, Calls: 3, Carriable: 2, Anchored: 1}}}}
	notes := view.Notes([]events.GroupStatus{g}, nil, t0.Add(time.Minute))
	if len(notes) != 1 || !strings.Contains(notes[0], "waiting for n1 to drain: 6 active channels now, 4 of them in 2 calls carried across: 2 waited for (limit 0)") {
		t.Fatalf("notes %q", notes)
	}
}
