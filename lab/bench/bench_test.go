package bench

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/fanpbx/fan/lab/stack"
	"github.com/fanpbx/fan/pkg/events"
)

func cycles(ms ...int) []Cycle {
	out := make([]Cycle, len(ms))
	for i, m := range ms {
		out[i] = Cycle{Took: time.Duration(m) * time.Millisecond}
	}
	return out
}

func TestPercentileIsNearestRank(t *testing.T) {
	cs := cycles(500, 100, 400, 200, 300)
	for p, want := range map[float64]float64{50: 300, 99: 500, 20: 100, 100: 500} {
		if got := Percentile(cs, p); got != want {
			t.Errorf("p%v = %v, want %v", p, got, want)
		}
	}
	if !math.IsNaN(Percentile(nil, 50)) {
		t.Error("no cycles must give NaN, not 0")
	}
}

func TestLineFormat(t *testing.T) {
	got := Line(PBXDeath, cycles(600, 700), cycles(2500, 3000))
	want := "scenario=pbx-death cycles=2 fan_p50_ms=600 fan_p99_ms=700 keepalived_p50_ms=2500 keepalived_p99_ms=3000 ratio_p99=0.23"
	if got != want {
		t.Fatalf("\n got %s\nwant %s", got, want)
	}
	got = Line(PBXDeath, cycles(600, 700, 650), nil)
	want = "scenario=pbx-death cycles=3 fan_p50_ms=650 fan_p99_ms=700 keepalived_p50_ms=NaN keepalived_p99_ms=NaN ratio_p99=NaN"
	if got != want {
		t.Fatalf("fan alone:\n got %s\nwant %s", got, want)
	}
}

func TestCountMoves(t *testing.T) {
	ev := func(a events.Action) stack.Event {
		return stack.Event{Payload: &events.ArbiterDecision{Group: "pbx", Action: a, Reason: "r", CausedBy: []string{"x"}}}
	}
	evs := []stack.Event{ev(events.ActionPlace), ev(events.ActionHold), ev(events.ActionFailover), ev(events.ActionHold),
		ev(events.ActionFailback), {Payload: &events.ServiceAnnounce{}}}
	moves, failbacks := CountMoves(evs)
	if moves != 2 || failbacks != 1 {
		t.Fatalf("moves=%d failbacks=%d, want 2 and 1 (placement and holds are not moves)", moves, failbacks)
	}
	if !strings.HasPrefix(Line(LinkCut, nil, nil), "scenario=link-cut cycles=0") {
		t.Fatal("empty results must still render")
	}
}
