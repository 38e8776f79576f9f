package decide

import (
	"strings"
	"testing"
)

// TestSituationFollowsTheNodes: a standing hold is explained once, but the
// status it leaves says how the nodes stand now, not when the hold began
// (fanctl status showed "n2 never heard" beside a table with n2 heard).
func TestSituationFollowsTheNodes(t *testing.T) {
	f := newFx(t, testConfig())
	f.boot()
	f.play([]step{
		{name: "n2 down", do: self("n2", down)},
		{name: "n3 down", do: self("n3", down)},
		{name: "n1 down", do: self("n1", down), want: []string{"hold n1"}, reason: "no other eligible node (n2 pbx down, n3 pbx down)"},
	})
	if s := f.c.Snapshot().Groups[0].Situation; !strings.Contains(s, "n3 pbx down") {
		t.Fatalf("situation %q", s)
	}
	// n3's PBX check loses its verdict: still not eligible, the same hold,
	// no new decision; the situation says so.
	f.play([]step{{name: "n3 unknown", do: self("n3", "unknown")}})
	if s := f.c.Snapshot().Groups[0].Situation; !strings.Contains(s, "n3 pbx unknown") || strings.Contains(s, "n3 pbx down") {
		t.Fatalf("situation after n3's change: %q", s)
	}
}
