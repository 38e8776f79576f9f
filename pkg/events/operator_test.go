package events

import (
	"errors"
	"strings"
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
	if got := OperatorRequestSubject("lab", "alice"); got != "fan.req.lab.arbiter.operate.alice" {
		t.Fatalf("request subject %q", got)
	}
	if op, err := OperatorFromSubject("lab", OperatorRequestSubject("lab", "alice")); err != nil || op != "alice" {
		t.Fatalf("operator from subject: %q %v", op, err)
	}
	for _, s := range []string{"fan.req.lab.arbiter.operate", "fan.req.lab.arbiter.operate.", "fan.req.other.arbiter.operate.alice",
		"fan.req.lab.arbiter.operate.alice.x", "fan.req.lab.arbiter.operate.*"} {
		if op, err := OperatorFromSubject("lab", s); !errors.Is(err, ErrSubjectMismatch) {
			t.Errorf("operator from %q: %q %v", s, op, err)
		}
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
	long := OperatorRequest{Verb: OpMaintenanceOn, Operator: "alice", Reason: strings.Repeat("x", 70000)}
	if err := long.Validate(); !errors.Is(err, ErrInvalidField) || !strings.Contains(err.Error(), "at most 500") {
		t.Errorf("70,000-character reason: %v", err)
	}
	long.Reason = strings.Repeat("é", MaxReasonChars) // characters, not bytes
	if err := long.Validate(); err != nil {
		t.Errorf("%d-character reason refused: %v", MaxReasonChars, err)
	}
	for _, r := range []OperatorRequest{
		{Verb: OpMaintenanceOn, Operator: "alice", Comment: strings.Repeat("c", MaxCommentChars+1)},
		{Verb: OpMaintenanceOn, Operator: strings.Repeat("a", MaxOperatorLen+1)},
		{Verb: OpMaintenanceOn, Operator: "alice", Reason: "forged\nlog line"},
		{Verb: OpMaintenanceOn, Operator: "alice", Comment: "\x1b[2J"},
	} {
		if err := r.Validate(); !errors.Is(err, ErrInvalidField) {
			t.Errorf("accepted %.40q: %v", r.Reason+r.Comment+r.Operator, err)
		}
	}
	// A trail written before the bounds still decodes.
	if err := (OperatorAction{Verb: OpMaintenanceOn, Operator: "alice", Reason: strings.Repeat("x", 600), Outcome: "ok"}).Validate(); err != nil {
		t.Errorf("recorded action with a long reason: %v", err)
	}
	if _, err := New(goldenSrc, "lab", OperatorAction{Verb: OpNodeActive, Node: "n1", Operator: "a"}); !errors.Is(err, ErrMissingField) {
		t.Errorf("action without outcome: %v", err)
	}
}
