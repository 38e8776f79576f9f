package events

import (
	"errors"
	"testing"
)

func init() {
	addSamples(map[Type]Payload{
		TypeOperatorAction: OperatorAction{Verb: OpSwitchover, Group: "pbx", Node: "n2", Reason: "kernel update on n1",
			Operator: "alice@ops1", Accepted: true, Outcome: "switchover n1 -> n2 decided"},
	})
}

func TestOperatorSubjectsAndValidation(t *testing.T) {
	e := goldenEnvelope(t, samples()[TypeOperatorAction])
	if got := Subject(e, samples()[TypeOperatorAction]); got != "fan.evt.lab.operator.action" {
		t.Fatalf("subject %q", got)
	}
	if got := OperatorRequestSubject("lab"); got != "fan.req.lab.arbiter.operate" {
		t.Fatalf("request subject %q", got)
	}
	bad := []OperatorRequest{
		{Verb: "reboot", Operator: "a"},
		{Verb: OpSwitchover, Operator: "a"},                      // no target
		{Verb: OpSwitchover, Node: "n2"},                         // nobody asked
		{Verb: OpFailback, Operator: "a"},                        // no reason
		{Verb: OpNodeStandby, Node: "n.1", Operator: "a"},        // not a token
		{Verb: OpMaintenanceOn, Group: "a b", Operator: "alice"}, // not a token
	}
	for _, r := range bad {
		if err := r.Validate(); err == nil {
			t.Errorf("accepted %+v", r)
		}
	}
	if err := (OperatorRequest{Verb: OpMaintenanceOn, Operator: "alice"}).Validate(); err != nil {
		t.Errorf("cluster maintenance refused: %v", err)
	}
	if _, err := New(goldenSrc, "lab", OperatorAction{Verb: OpNodeActive, Node: "n1", Operator: "a"}); !errors.Is(err, ErrMissingField) {
		t.Errorf("action without outcome: %v", err)
	}
}
