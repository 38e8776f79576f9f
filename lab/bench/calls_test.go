package bench

import (
	"strings"
	"testing"
	"time"

	"github.com/fanpbx/fan/lab/stack"
)

func TestCallEndpoints(t *testing.T) {
	eps, err := CallEndpoints(2, 1)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"6000", "6001", "6002", "6003", "6004", "6005"}
	for i, e := range eps {
		if e.User != want[i] || e.Anchored != (i >= 4) || e.Password == "" {
			t.Fatalf("endpoint %d: %+v", i, e)
		}
	}
	if _, err := CallEndpoints(40, 11); err == nil {
		t.Fatal("51 calls accepted: the dialplan rings 60XX")
	}
}

// TestCallsLine: totals over cycles; a callee never told makes the p99
// infinite rather than dropping out of it.
func TestCallsLine(t *testing.T) {
	cfg := CallsConfig{Direct: 2, Anchored: 1, Hold: 10 * time.Second}
	cs := []CallsCycle{
		{Up: 3, DirectUp: 2, Survived: 2, LongestGap: 30 * time.Millisecond, Hangups: []time.Duration{5 * time.Millisecond, 7 * time.Millisecond}, AnchoredLost: 1, Failover: 500 * time.Millisecond},
		{Up: 3, DirectUp: 2, Survived: 2, LongestGap: 45 * time.Millisecond, Hangups: []time.Duration{6 * time.Millisecond}, NotTold: 1, Orphaned: 1, AnchoredLost: 1, Failover: 700 * time.Millisecond},
	}
	line := CallsLine("fan", stack.PBXStandIn, cfg, cs)
	for _, want := range []string{"calls_up=6/6", "calls_survived=4/4", "longest_audio_gap_ms=45", "hangups_propagated=3/4",
		"hangups_propagated_p99_ms=inf", "orphaned_legs=1", "anchored_lost=2", "failover_p50_ms=500", "pbx=standin"} {
		if !strings.Contains(line, want) {
			t.Fatalf("%s: no %s", line, want)
		}
	}
	cs[1].NotTold, cs[1].Hangups = 0, append(cs[1].Hangups, 9*time.Millisecond)
	if line := CallsLine("fan", stack.PBXStandIn, cfg, cs); !strings.Contains(line, "hangups_propagated_p99_ms=9") {
		t.Fatalf("%s: want p99 9 ms", line)
	}
}
