package events

import "testing"

func init() {
	addSamples(map[Type]Payload{
		TypeDispatcherWeights: DispatcherWeights{Group: "pbx", Weights: map[string]int{"n1": 80, "n2": 35},
			Loads:  map[string]NodeLoad{"n1": {CPUPercent: 12.5, MemFreeShare: 0.7}, "n2": {CPUPercent: 85, MemFreeShare: 0.4}},
			Reason: "n2 weight 60 -> 35 for 3 heartbeats"},
	})
}

func TestDispatcherWeights(t *testing.T) {
	p := samples()[TypeDispatcherWeights]
	if got := Subject(goldenEnvelope(t, p), p); got != "fan.evt.lab.arbiter.pbx.weights" {
		t.Fatalf("subject %q", got)
	}
	for _, bad := range []DispatcherWeights{
		{Group: "pbx", Reason: "x"},
		{Group: "pbx", Weights: map[string]int{"n1": 0}, Reason: "x"},
		{Group: "pbx", Weights: map[string]int{"n1": 101}, Reason: "x"},
		{Group: "pbx", Weights: map[string]int{"n1": 50}},
	} {
		if bad.Validate() == nil {
			t.Fatalf("%+v accepted", bad)
		}
	}
}
