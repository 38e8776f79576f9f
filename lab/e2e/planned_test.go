package e2e

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fanpbx/fan/lab/stack"
	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/waittest"
)

// TestPlannedSwitchoverEndToEnd: with a call up on n1 (its Asterisk, the
// AMI peer, reports two channels to the real prober), `fanctl switchover`
// waits; `fanctl status` shows the wait; the floating address keeps
// answering from n1 until the call ends, then from n2; `fanctl explain` of
// the move shows the drained count and the operator's request.
func TestPlannedSwitchoverEndToEnd(t *testing.T) {
	ctx, _, st, p := startLab(t, 2*time.Minute, stack.Options{})
	if _, err := st.WaitAnswer(ctx, p, "n1", 30*time.Second); err != nil {
		t.Fatalf("initial placement: %v", err)
	}
	fanctl := func(args ...string) string {
		t.Helper()
		out, err := st.Fanctl(ctx, append([]string{"--cluster", "lab", "--operator", "alice"}, args...)...)
		if err != nil {
			t.Fatalf("fanctl %v: %v\n%s", args, err, out)
		}
		return string(out)
	}

	if err := st.SetCalls(ctx, "n1", 2, 1); err != nil {
		t.Fatal(err)
	}
	// Wait until the prober's AMI run and heartbeat have carried the call
	// onto the bus (the arbiter reads the same live stream).
	waittest.Until(t, 20*time.Second, "n1's heartbeats reporting the call", func() bool {
		evs, err := st.LiveEvents(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return slices.ContainsFunc(evs, func(e stack.Event) bool {
			hb, ok := e.Payload.(*events.NodeHeartbeat)
			return ok && hb.Node == "n1" && hb.ActiveChannels != nil && *hb.ActiveChannels == 2
		})
	})
	out := fanctl("switchover", "--to", "n2", "--reason", "kernel update on n1")
	if !strings.Contains(out, "waits for n1 to drain: n1 has 2 active channels") {
		t.Fatalf("switchover with a call up on n1:\n%s", out)
	}
	status := fanctl("status")
	for _, want := range []string{"PLANNED switchover from n1 to n2 asked by alice", "2 active channels now (limit 0)", "then gives up"} {
		if !strings.Contains(status, want) {
			t.Fatalf("fanctl status lacks %q:\n%s", want, status)
		}
	}
	if _, err := st.WaitAnswer(ctx, p, "n1", 5*time.Second); err != nil {
		t.Fatalf("n1 stopped answering while its call was up: %v", err)
	}

	hangup := time.Now()
	if err := st.SetCalls(ctx, "n1", 0, 0); err != nil {
		t.Fatal(err)
	}
	ans, err := st.WaitAnswer(ctx, p, "n2", 20*time.Second)
	if err != nil {
		t.Fatalf("no move after the call ended: %v", err)
	}
	t.Logf("call ended to first SIP answer from n2 through the floating address: %v", ans.At.Sub(hangup).Round(time.Millisecond))

	evs, err := st.Events(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var decision string
	for _, e := range evs {
		if d, ok := e.Payload.(*events.ArbiterDecision); ok && d.Action == events.ActionSwitchover && d.To == "n2" {
			if e.Env.Time.Before(hangup) {
				t.Fatalf("switchover decided at %s, before the call ended at %s: %s", e.Env.Time, hangup, d.Reason)
			}
			decision = e.Env.ID
		}
	}
	if decision == "" {
		t.Fatal("no switchover decision in the trail")
	}
	explain := fanctl("explain", decision)
	for _, want := range []string{"SWITCHOVER n1->n2", "MOVED: planned switchover of pbx from n1 to n2", "n1 has 0 active channels",
		`switchover n2 by alice ("kernel update on n1")`, "requested"} {
		if !strings.Contains(explain, want) {
			t.Fatalf("fanctl explain %s lacks %q:\n%s", decision, want, explain)
		}
	}
}
