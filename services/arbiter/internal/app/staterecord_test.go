package app

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/services/arbiter/internal/decide"
)

// The persisted state leaves out the per-node view (the group status has
// it) and keeps everything restore reads: a core restored from it holds
// the same holder and outstanding claim.
func TestStateRecordRestores(t *testing.T) {
	at := time.Date(2026, 12, 1, 21, 0, 0, 0, time.UTC)
	st := decide.State{Cluster: "lab", Epoch: 4, Leading: true, At: at, Groups: []decide.GroupState{
		{Name: "a", Holder: "n1", LastMove: at, Moves: []time.Time{at},
			Nodes: []decide.NodeStatus{{Node: "n1", Health: events.HealthUp, Eligible: true}, {Node: "n2", Health: events.HealthDown}}},
		{Name: "b", Claim: &decide.Claim{CommandID: "c1", Node: "n4", Action: events.ActionPlace, Deadline: at.Add(time.Minute)},
			Nodes: []decide.NodeStatus{{Node: "n3"}, {Node: "n4"}}},
	}}
	b, err := stateRecord(st)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), `"nodes"`) {
		t.Fatalf("record carries the per-node view: %s", b)
	}
	var back decide.State
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	cfg := Config{}
	cfg.Cluster = "lab"
	cfg.Groups = []GroupConfig{
		{Name: "a", Addresses: []string{"198.51.100.10/24"}, Nodes: []string{"n1", "n2"}, HealthCheck: "pbx"},
		{Name: "b", Addresses: []string{"198.51.100.11/24"}, Nodes: []string{"n3", "n4"}, HealthCheck: "pbx"},
	}
	core, err := decide.New(cfg.decideConfig())
	if err != nil {
		t.Fatal(err)
	}
	if err := core.Restore(back); err != nil {
		t.Fatal(err)
	}
	got := core.Snapshot()
	if got.Groups[0].Holder != "n1" || got.Groups[1].Claim == nil || got.Groups[1].Claim.CommandID != "c1" || len(got.Groups[0].Moves) != 1 {
		t.Fatalf("restored %+v", got.Groups)
	}
}
