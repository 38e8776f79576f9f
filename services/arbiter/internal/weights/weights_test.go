package weights

import (
	"testing"

	"github.com/fanpbx/fan/pkg/events"
)

func TestWeight(t *testing.T) {
	cases := []struct {
		cpu, mem float64
		want     int
	}{
		{0, 1, 100},   // idle, all memory free
		{100, 0, 1},   // saturated: still in rotation
		{50, 0.5, 51}, // 0.3 + 0.2 = 0.5 -> 1 + 49.5 rounded
		{10, 0.8, 86}, // 0.54 + 0.32 = 0.86 -> 1 + 85.14
		{90, 0.8, 39}, // 0.06 + 0.32 = 0.38 -> 1 + 37.62
		{250, -1, 1},  // out-of-range figures are clamped
		{-5, 2, 100},  // likewise
	}
	for _, c := range cases {
		if got := Weight(events.NodeLoad{CPUPercent: c.cpu, MemFreeShare: c.mem}); got != c.want {
			t.Errorf("Weight(cpu %v, mem %v) = %d, want %d", c.cpu, c.mem, got, c.want)
		}
	}
	if _, ok := Load(&events.NodeHeartbeat{CPUPercent: 5}); ok {
		t.Error("a heartbeat without memory figures ranked")
	}
}

// The published set changes only after Confirm consecutive heartbeats at
// least Threshold away; a single spike, or a run broken by a calm beat,
// changes nothing.
func TestHysteresis(t *testing.T) {
	calm := events.NodeLoad{CPUPercent: 10, MemFreeShare: 0.8} // 86
	busy := events.NodeLoad{CPUPercent: 90, MemFreeShare: 0.8} // 39
	near := events.NodeLoad{CPUPercent: 20, MemFreeShare: 0.8} // 80: below the threshold
	steps := []struct {
		node string
		load events.NodeLoad
		pub  bool
		want int // n1's published weight after the step
	}{
		{"n1", calm, true, 86}, // first figure enters at once
		{"n2", calm, true, 86},
		{"n1", near, false, 86},
		{"n1", busy, false, 86}, // spike 1
		{"n1", calm, false, 86}, // broken run
		{"n1", busy, false, 86},
		{"n1", busy, false, 86},
		{"n2", busy, false, 86}, // another node's beat does not break n1's run
		{"n1", busy, true, 39},  // third in a row
		{"n1", busy, false, 39},
		{"n1", near, false, 39},
		{"n1", near, false, 39},
		{"n1", near, true, 80},
	}
	tr := New(10, 3)
	for i, s := range steps {
		pub, reason := tr.Observe(s.node, s.load)
		if pub != s.pub || tr.published["n1"] != s.want {
			t.Fatalf("step %d (%s): published %v (%q), n1 weight %d; want %v, %d", i, s.node, pub, reason, tr.published["n1"], s.pub, s.want)
		}
	}
	set := tr.Set("pbx", "r")
	if err := set.Validate(); err != nil || set.Weights["n1"] != 80 || set.Weights["n2"] != 86 {
		t.Fatalf("set %+v: %v", set, err)
	}
}
