package events

import (
	"encoding/json"
	"testing"
)

func init() {
	addSamples(map[Type]Payload{
		TypeArbiterTerm: ArbiterTerm{State: json.RawMessage(`{"cluster":"lab","epoch":3,"groups":[{"name":"pbx","holder":"n1"}]}`),
			Input: "0193a1b2-0000-7000-8000-000000000001", Since: "0193a1b2-0000-7000-8000-000000000002",
			Policy: "9f86d081884c7d65"},
	})
}

func TestArbiterTermSubjectAndValidation(t *testing.T) {
	p := samples()[TypeArbiterTerm].(ArbiterTerm)
	if got := Subject(goldenEnvelope(t, p), p); got != "fan.evt.lab.arbiter.term" {
		t.Fatalf("subject %q", got)
	}
	for _, bad := range []string{``, `[1]`, `{"cluster":`} {
		if err := (ArbiterTerm{State: json.RawMessage(bad)}).Validate(); err == nil {
			t.Errorf("state %q accepted", bad)
		}
	}
}
