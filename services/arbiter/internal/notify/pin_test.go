package notify

import (
	"context"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/bus/bustest"
	"github.com/fanpbx/fan/pkg/platform/waittest"
)

// Pins, leaders holds and planned moves are state changes too: a hook is
// told of each start and end (who asked, until when, how it ended), and a
// hold, being the cluster's, reaches a hook whatever its groups.
func TestPinsHoldsAndWaitsAreTold(t *testing.T) {
	tr := trail{t: t, m: NewMapper("lab", []Group{{Name: "pbx", Nodes: []string{"n1", "n2"}, HealthCheck: "pbx", Holder: "n2"}})}
	since := time.Date(2026, 12, 8, 2, 10, 0, 0, time.UTC)
	pin := events.GroupPin{Group: "pbx", Stage: events.PinEnded, End: events.PinFailed, PinFacts: events.PinFacts{Node: "n2", Operator: "alice",
		RequestID: "r", ActionID: "a", Since: since, Until: since.Add(2 * time.Hour)}, Why: "n2 failed", CausedBy: []string{"d"}}
	env, out := tr.feed("arbiter", "ctl", &pin, events.WithEpoch(3))
	if len(out) != 1 {
		t.Fatalf("a pin's end told %+v", out)
	}
	if ev := out[0]; ev.Kind != KindPin || ev.ID != env.ID || ev.Group != "pbx" || ev.Node != "n2" || ev.Holder != "n2" || ev.Stage != "ended" ||
		ev.End != "failed" || ev.Operator != "alice" || !ev.Since.Equal(since) || !ev.Until.Equal(since.Add(2*time.Hour)) || ev.Reason != "n2 failed" {
		t.Errorf("pin event %+v", ev)
	}
	other := pin
	other.Group = "fax"
	if _, out := tr.feed("arbiter", "ctl", &other, events.WithEpoch(3)); len(out) != 0 {
		t.Errorf("a pin of a group not configured told %+v", out)
	}
	hold := events.LeadersHold{Stage: events.HoldStarted, LeadersHoldFacts: events.LeadersHoldFacts{Operator: "bob", Server: "nats-pbx-b",
		Since: since, Until: since.Add(30 * time.Minute), HeldSince: since, RequestID: "r", ActionID: "a"}, Why: "leaders held", CausedBy: []string{"a"}}
	_, out = tr.feed("arbiter", "ctl", &hold, events.WithEpoch(3))
	if len(out) != 1 || out[0].Kind != KindLeadersHold || out[0].Group != "" || out[0].Server != "nats-pbx-b" || out[0].Stage != "held" || out[0].Operator != "bob" {
		t.Fatalf("hold told %+v", out)
	}
	env2 := out[0].Env()
	for _, want := range []string{"FAN_EVENT=leaders_hold", "FAN_STAGE=held", "FAN_OPERATOR=bob", "FAN_SERVER=nats-pbx-b",
		"FAN_UNTIL=2026-12-08T02:40:00Z", "FAN_SINCE=2026-12-08T02:10:00Z", "FAN_END="} {
		found := false
		for _, v := range env2 {
			found = found || v == want
		}
		if !found {
			t.Errorf("environment lacks %s: %v", want, env2)
		}
	}
	planned := events.PlannedMove{Group: "pbx", Stage: events.PlannedGaveUp, PlannedFacts: events.PlannedFacts{Verb: events.OpSwitchover, From: "n2",
		To: "n1", Operator: "carol", RequestID: "r", RequestedAt: since, Deadline: since.Add(30 * time.Minute), Drain: events.DrainWait},
		Reason: "gave up", CausedBy: []string{"a"}}
	_, out = tr.feed("arbiter", "ctl", &planned, events.WithEpoch(3))
	if len(out) != 1 || out[0].Kind != KindPlanned || out[0].Stage != "gave_up" || out[0].Node != "n2" || !out[0].Until.Equal(since.Add(30*time.Minute)) {
		t.Fatalf("planned stage told %+v", out)
	}

	// A hook of one group only hears the cluster's hold too.
	rec := newRecorder(t)
	only := rec.hook("fax")
	only.Groups = []string{"fax"}
	h := start(t, Config{Hooks: []HookConfig{only}}, true, idle)
	h.n.Offer(Event{ID: "pin-of-pbx", Kind: KindPin, Group: "pbx", Time: time.Now()})
	h.n.Offer(Event{ID: "the-hold", Kind: KindLeadersHold, Time: time.Now()})
	waittest.Until(t, 10*time.Second, "the hold told", func() bool { return len(rec.events(t)) == 1 })
	if got := rec.ids(t); got != "the-hold" {
		t.Errorf("told %q, want the hold only", got)
	}
}

// The notifier's watch reads pins and holds from the audit stream.
func TestPinsAndHoldsReachTheHooksFromTheBus(t *testing.T) {
	s := bustest.Server(t)
	arb := bustest.Connect(t, s, bus.Identity{Cluster: "lab", Service: "arbiter", Node: "ctl"})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	since := time.Now()
	watch := func(ctx context.Context, o bus.WatchOptions, fn bus.EventHandler) error {
		o.Since = since
		return arb.Watch(ctx, o, fn)
	}
	rec := newRecorder(t)
	start(t, Config{Hooks: []HookConfig{rec.hook("records")}}, true, watch)
	now := time.Now()
	pin, err := arb.Emit(ctx, events.GroupPin{Group: "pbx", Stage: events.PinStarted, PinFacts: events.PinFacts{Node: "n2", Operator: "alice",
		RequestID: "r", ActionID: "a", Since: now}, Why: "switchover", CausedBy: []string{"d"}}, events.WithEpoch(2))
	if err != nil {
		t.Fatal(err)
	}
	hold, err := arb.Emit(ctx, events.LeadersHold{Stage: events.HoldEnded, End: events.HoldBroken, LeadersHoldFacts: events.LeadersHoldFacts{Operator: "bob",
		Since: now, Until: now.Add(time.Hour), HeldSince: now, RequestID: "r", ActionID: "a"}, Why: "broken", CausedBy: []string{"h"}}, events.WithEpoch(2))
	if err != nil {
		t.Fatal(err)
	}
	waittest.Until(t, 20*time.Second, "both told", func() bool { return len(rec.events(t)) >= 2 })
	got := rec.events(t)
	if got[0].ID != pin.ID || got[0].Kind != KindPin || got[1].ID != hold.ID || got[1].Kind != KindLeadersHold || got[1].End != "broken" {
		t.Fatalf("told %+v", got)
	}
}
