package notify

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/bus/bustest"
	"github.com/fanpbx/fan/pkg/platform/config"
	"github.com/fanpbx/fan/pkg/platform/waittest"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// Real events on a real JetStream, read through bus.Watch: a health
// transition of the group's check, a failover (decision, the claim's
// copy in the audit stream, the executor's result) and a needs-human hold
// reach a script as health, holder_change and needs_human, with the
// holder, the previous holder, the term and the decision's reason, and
// reach a real HTTP receiver the same, signed; a transition of a check no
// group decides on reaches no hook.
func TestHooksHearTheAuditStream(t *testing.T) {
	s := bustest.Server(t)
	arb := bustest.Connect(t, s, bus.Identity{Cluster: "lab", Service: "arbiter", Node: "ctl"})
	n1 := bustest.Connect(t, s, bus.Identity{Cluster: "lab", Service: "prober", Node: "n1"})
	n2 := bustest.Connect(t, s, bus.Identity{Cluster: "lab", Service: "ipmover", Node: "n2"})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// Read from the test's start, so nothing published before the watch's
	// consumer exists is missed.
	since := time.Now()
	watch := func(ctx context.Context, o bus.WatchOptions, fn bus.EventHandler) error {
		o.Since = since
		return arb.Watch(ctx, o, fn)
	}
	rec := newRecorder(t)
	// And a real receiver, which fails its first request: the first
	// event reaches it at the second try.
	rc := &receiver{failFirst: 1, status: http.StatusServiceUnavailable}
	srv := httptest.NewServer(rc)
	defer srv.Close()
	secret := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secret, append(testSecret, '\n'), 0o600); err != nil {
		t.Fatal(err)
	}
	h := start(t, Config{Hooks: []HookConfig{rec.hook("records"), {Name: "receiver", Webhook: &WebhookConfig{URL: srv.URL,
		SecretFile: secret, Backoff: config.Duration(10 * time.Millisecond)}}}}, true, watch)

	ev := []events.Evidence{{At: time.Now(), Error: "AMI refused", ErrorClass: events.ErrorRefused}}
	if _, err := n1.Emit(ctx, events.HealthTransition{Check: "disk", TargetNode: "n1", Role: events.RoleSelf, From: events.HealthUp,
		To: events.HealthDown, Reason: "full", Rise: 1, Fall: 1, Consecutive: 1, Evidence: ev}); err != nil {
		t.Fatal(err)
	}
	down, err := n1.Emit(ctx, events.HealthTransition{Check: "pbx", TargetNode: "n1", Role: events.RoleSelf, From: events.HealthUp,
		To: events.HealthDown, Reason: "3 failures in a row", Rise: 2, Fall: 1, Consecutive: 1, Evidence: ev})
	if err != nil {
		t.Fatal(err)
	}
	const epoch = 7
	claim := events.ClaimIP{Group: "pbx", Node: "n2", Addresses: []string{"198.51.100.10/24"}, NotAfter: time.Now().Add(time.Minute),
		PreviousHolder: "n1", PreviousHolderFenced: true}
	cenv, err := events.New(arb.Source(), "lab", claim, events.WithEpoch(epoch), events.CausedBy(down))
	if err != nil {
		t.Fatal(err)
	}
	reason := "n1's pbx check is down; n2 is the highest-priority eligible node"
	denv, err := arb.Emit(ctx, events.ArbiterDecision{Group: "pbx", Action: events.ActionFailover, From: "n1", To: "n2", Reason: reason,
		CausedBy: []string{down.ID}, Commands: []string{cenv.ID}}, events.WithEpoch(epoch), events.CausedBy(down))
	if err != nil {
		t.Fatal(err)
	}
	if err := arb.Publish(ctx, cenv, claim); err != nil {
		t.Fatal(err)
	}
	renv, err := n2.Emit(ctx, events.CommandResult{CommandID: cenv.ID, CommandType: events.TypeClaimIP, Node: "n2", Group: "pbx",
		Outcome: events.OutcomeApplied}, events.CausedBy(cenv), events.WithEpoch(epoch))
	if err != nil {
		t.Fatal(err)
	}
	henv, err := arb.Emit(ctx, events.ArbiterDecision{Group: "pbx", Action: events.ActionHold, Reason: "frozen: 6 moves in an hour",
		CausedBy: []string{renv.ID}, NeedsHuman: true}, events.WithEpoch(epoch))
	if err != nil {
		t.Fatal(err)
	}

	waittest.Until(t, 20*time.Second, "three events told", func() bool { return len(rec.events(t)) >= 3 })
	got := rec.events(t)
	if len(got) != 3 {
		t.Fatalf("told %d events, want 3: %+v", len(got), got)
	}
	health, moved, human := got[0], got[1], got[2]
	if health.Kind != KindHealth || health.ID != down.ID || health.Group != "pbx" || health.Node != "n1" || health.Check != "pbx" ||
		health.Health != events.HealthDown || health.HealthFrom != events.HealthUp || health.Observer != "n1" || health.Reason != "3 failures in a row" {
		t.Errorf("health event %+v", health)
	}
	if moved.Kind != KindHolderChange || moved.ID != renv.ID || moved.Holder != "n2" || moved.Node != "n2" || moved.Previous != "n1" ||
		moved.Epoch != epoch || moved.Reason != reason || moved.Decision != denv.ID || moved.Action != events.ActionFailover {
		t.Errorf("holder change %+v", moved)
	}
	waittest.Until(t, 20*time.Second, "three events received", func() bool { _, _, evs, _ := rc.counts(); return len(evs) >= 3 })
	requests, bad, received, _ := rc.counts()
	if requests != 4 || bad != 0 || !slices.Equal(received, got) {
		t.Errorf("receiver: %d requests (want 3 and a retry), %d badly signed, received %+v, want what the script was told", requests, bad, received)
	}
	waittest.Until(t, 5*time.Second, "webhook runs counted", func() bool {
		return testutil.ToFloat64(h.n.m.runs.WithLabelValues(kindWebhook, resultOK)) == 3
	})
	if r := testutil.ToFloat64(h.n.m.retries); r != 1 {
		t.Errorf("retries = %v, want 1", r)
	}
	if human.Kind != KindNeedsHuman || human.ID != henv.ID || human.Holder != "n2" || human.Reason != "frozen: 6 moves in an hour" || human.Epoch != epoch {
		t.Errorf("needs-human event %+v", human)
	}
}
