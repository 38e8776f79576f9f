package app

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/bus/bustest"
	"github.com/fanpbx/fan/pkg/platform/waittest"
	"github.com/fanpbx/fan/services/arbiter/internal/replay"
)

// TestPlannedSwitchoverCarriesCalls: n1's prober counts the channels of
// one call, and n1's replicator says that call is carriable; a switchover
// moves at once, the moved stage and the decision say the call is carried
// across and cite the summary, and the trail replays the same.
func TestPlannedSwitchoverCarriesCalls(t *testing.T) {
	p := newPlannedLab(t, "ctlA")
	repl := bustest.Connect(t, p.s, bus.Identity{Cluster: "lab", Service: "replicator", Node: "n1"})
	// The replicator restates its summary every 200 ms while its view is
	// current, as the recorder does.
	stop := make(chan struct{})
	done := make(chan struct{})
	defer func() { close(stop); <-done }()
	go func() {
		defer close(done)
		tk := time.NewTicker(200 * time.Millisecond)
		defer tk.Stop()
		for {
			s := events.CallsSummary{Node: "n1", Group: "pbx", Holder: true, Epoch: 1, IntervalMS: 200, Channels: oneCall.Channels,
				CarriedChannels: 2, Calls: 1, Carriable: 1, At: time.Now()}
			if _, err := repl.Emit(p.ctx, s); err != nil && p.ctx.Err() == nil {
				t.Errorf("summary: %v", err)
			}
			select {
			case <-stop:
				return
			case <-tk.C:
			}
		}
	}()
	waittest.Until(t, 10*time.Second, "a summary in the live stream", func() bool {
		return p.find(events.TypeCallsSummary, func(events.Envelope) bool { return true }) != nil
	})
	rep := p.askSwitchover("alice", events.OperatorRequest{Verb: events.OpSwitchover, Node: "n2", Reason: "kernel update on n1"},
		"the holder has drained, moving to n2")
	p.waitHolder("n2", 10*time.Second)
	moved := p.waitStage(events.PlannedMoved)
	if moved.pm.Calls == nil || moved.pm.Calls.Carriable != 1 || moved.pm.Calls.Uncarried() != 0 ||
		!strings.Contains(moved.pm.Reason, "n1 has 2 active channels, all in 1 call carried across (limit 0)") ||
		!slices.Contains(moved.pm.CausedBy, moved.pm.Calls.Summary) || moved.pm.CausedBy[0] != rep.EventID {
		t.Fatalf("moved stage %+v (calls %+v)", moved.pm, moved.pm.Calls)
	}
	dec := p.find(events.TypeArbiterDecision, func(env events.Envelope) bool { return env.CausationID == moved.env.ID })
	var d events.ArbiterDecision
	if dec != nil {
		_ = json.Unmarshal(dec.Data, &d)
	}
	if d.Action != events.ActionSwitchover || d.Forced || d.Calls == nil || d.Calls.Carriable != 1 || !slices.Contains(d.CausedBy, d.Calls.Summary) {
		t.Fatalf("decision %+v (calls %+v)", d, d.Calls)
	}

	// The replay feeds the summaries as the arbiter read them.
	trail := p.records(p.ctx)
	cfg := p.cfg("ctlA")
	r, err := replay.Run(cfg.decideConfig(), trail, replay.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	_ = r.Print(&b)
	t.Log("\n" + b.String())
	if r.Differ != 0 || r.NotCompared != 0 {
		t.Fatalf("%d differences, %d not compared", r.Differ, r.NotCompared)
	}
	if !slices.ContainsFunc(r.Rows, func(row replay.Row) bool {
		return row.Recorded != nil && row.Recorded.Action == events.ActionSwitchover && row.Recorded.Calls != nil && row.Same()
	}) {
		t.Fatal("the switchover carrying the call is not among the rows replayed the same")
	}
}
