package events

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func init() {
	addSamples(map[Type]Payload{
		TypeCallsAdopted: CallsAdopted{Group: "pbx", Node: "n2", CommandID: "0193a1b2-0000-7000-8000-000000000002",
			Calls: CallsAdoption{Adopted: 2, NotAdopted: map[string]int{NotAdoptedAnchored: 1}, From: []string{"n1"}}, At: goldenTime},
	})
}

func TestCallsAdoptionValidate(t *testing.T) {
	good := CallsAdoption{Adopted: 2, NotAdopted: map[string]int{NotAdoptedAnchored: 1, NotAdoptedOverBound: 3}, From: []string{"n1"}}
	if err := good.Validate(); err != nil {
		t.Fatal(err)
	}
	if err := (CallsAdoption{Deferred: true}).Validate(); err != nil {
		t.Fatalf("a deferred adoption: %v", err)
	}
	for name, mut := range map[string]func(*CallsAdoption){
		"negative adopted":     func(a *CallsAdoption) { a.Adopted = -1 },
		"adopted over bound":   func(a *CallsAdoption) { a.Adopted = MaxCallsPerNode + 1 },
		"negative not adopted": func(a *CallsAdoption) { a.NotAdopted = map[string]int{NotAdoptedInvalid: -1} },
		"reason not a token":   func(a *CallsAdoption) { a.NotAdopted = map[string]int{"no such.reason": 1} },
		"bad from":             func(a *CallsAdoption) { a.From = []string{"n 1"} },
		"deferred with counts": func(a *CallsAdoption) { a.Deferred = true },
		"long error":           func(a *CallsAdoption) { a.Error = strings.Repeat("x", MaxTextLen+1) },
	} {
		a := good
		mut(&a)
		if err := a.Validate(); !errors.Is(err, ErrInvalidField) {
			t.Errorf("%s: Validate = %v", name, err)
		}
	}
	if n := good.NotAdoptedTotal(); n != 4 {
		t.Errorf("NotAdoptedTotal = %d, want 4", n)
	}
	// A result carries it and refuses it when wrong.
	r := CommandResult{CommandID: "x", CommandType: TypeClaimIP, Node: "n2", Group: "pbx", Outcome: OutcomeApplied,
		Calls: &CallsAdoption{Adopted: -1}}
	if err := r.Validate(); !errors.Is(err, ErrInvalidField) {
		t.Errorf("result with a negative adoption: %v", err)
	}
	ev := CallsAdopted{Group: "pbx", Node: "n2", Calls: CallsAdoption{Deferred: true}, At: time.Now()}
	if err := ev.Validate(); !errors.Is(err, ErrInvalidField) {
		t.Errorf("calls.adopted saying deferred: %v", err)
	}
}

func TestCallsAdoptedSubjectAndVoice(t *testing.T) {
	ev := CallsAdopted{Group: "pbx", Node: "n2", Calls: CallsAdoption{Adopted: 1}, At: goldenTime}
	if got := Subject(Envelope{Cluster: "lab"}, ev); got != "fan.evt.lab.exec.n2.calls" {
		t.Fatalf("subject %q", got)
	}
	if !SubjectMatches(AllCallsAdopted("lab"), CallsAdoptedSubject("lab", "n2")) {
		t.Fatal("AllCallsAdopted does not match a node's subject")
	}
	// Only n2's own ipmover speaks for n2's adoptions.
	env, err := New(Source{Service: "ipmover", Node: "n1"}, "lab", ev)
	if err != nil {
		t.Fatal(err)
	}
	if err := VerifySubject(CallsAdoptedSubject("lab", "n2"), env, &ev); !errors.Is(err, ErrSubjectMismatch) {
		t.Fatalf("n1 reporting n2's adoption: %v", err)
	}
	for _, id := range []Identity{{Cluster: "lab", Role: RoleIPMover, Name: "n2"}} {
		p, err := id.Permissions()
		if err != nil {
			t.Fatal(err)
		}
		if !p.Publish.Allows(CallsAdoptedSubject("lab", "n2")) || p.Publish.Allows(CallsAdoptedSubject("lab", "n1")) {
			t.Fatalf("ipmover@n2 must publish its own adoptions only: %v", p.Publish.Allow)
		}
	}
}
