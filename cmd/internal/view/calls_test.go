package view_test

import (
	"testing"

	"github.com/fanpbx/fan/cmd/internal/view"
	"github.com/fanpbx/fan/pkg/events"
)

func TestCallsAdoptionSummaries(t *testing.T) {
	adopted := events.CallsAdoption{Adopted: 2, From: []string{"n1"},
		NotAdopted: map[string]int{events.NotAdoptedAnchored: 1, events.NotAdoptedOverBound: 3, "future_reason": 1}}
	for _, c := range []struct {
		p    events.Payload
		want string
	}{
		{&events.CommandResult{CommandType: events.TypeClaimIP, Node: "n2", Outcome: events.OutcomeApplied,
			Steps: []events.Step{{Name: "received"}}, Calls: &adopted},
			"command.claim_ip on n2: applied received=0.0ms calls: adopted 2 from n1, not adopted: anchored 1, over_bound 3, future_reason 1"},
		{&events.CommandResult{CommandType: events.TypeClaimIP, Node: "n2", Outcome: events.OutcomeApplied,
			Calls: &events.CallsAdoption{Deferred: true}}, "command.claim_ip on n2: applied calls: deferred (reported apart)"},
		{&events.CommandResult{CommandType: events.TypeClaimIP, Node: "n2", Outcome: events.OutcomeApplied,
			Calls: &events.CallsAdoption{}}, "command.claim_ip on n2: applied calls: adopted 0"},
		{&events.CallsAdopted{Group: "pbx", Node: "n2", CommandID: "c-1", Calls: adopted},
			"pbx on n2: adopted 2 from n1, not adopted: anchored 1, over_bound 3, future_reason 1 (claim c-1)"},
		{&events.CallsAdopted{Group: "pbx", Node: "n2", Calls: events.CallsAdoption{Error: "bucket fan_calls: not found"}},
			"pbx on n2: none adopted (bucket fan_calls: not found)"},
	} {
		if got := view.Summary(c.p); got != c.want {
			t.Errorf("Summary:\n got %q\nwant %q", got, c.want)
		}
	}
}
