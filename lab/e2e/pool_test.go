package e2e

import (
	"context"
	"log/slog"
	"math"
	"os"
	"testing"
	"time"

	"github.com/fanpbx/fan/lab/prereq"
	"github.com/fanpbx/fan/lab/stack"
)

// TestKamailioPool steers calls over a pool of PBX nodes behind a Kamailio
// dispatcher the way its users run it (stack.StartPool: three nodes that
// cannot run fan's prober post their heartbeats to the arbiter's HTTP
// endpoint with curl, over TLS, with their tokens; the dispatcher executor
// keeps Kamailio's set in step with load-aware weights; SIPp calls through
// the proxy). One node falls silent: once the registry calls it offline,
// and the executor has had one resync to act, no call reaches it. It posts
// again and gets calls again. Another reports high CPU: its share of the
// calls drops to what the published weights give it.
func TestKamailioPool(t *testing.T) {
	if os.Geteuid() != 0 {
		prereq.SkipOrFail(t, "needs root for network namespaces")
	}
	prereq.Need(t, "kamailio", "kamailio")
	prereq.Need(t, "sip-tester", "sipp")
	prereq.Need(t, "curl", "curl")
	bin := stack.BinDirForTest(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	p, err := stack.StartPool(ctx, stack.PoolOptions{BinDir: bin,
		Log: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if p != nil {
		t.Cleanup(func() {
			if t.Failed() {
				t.Log(p.Logs(4000))
			}
			if err := p.Close(); err != nil {
				t.Errorf("close: %v", err)
			}
		})
	}
	if err != nil {
		t.Fatal(err)
	}
	rep, err := stack.RunPoolScenario(ctx, p, &testReporter{t: t, start: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("calls received per node in each phase:\n%s", rep.PhaseTable())

	// Every heartbeat went through: TLS, the token, the body (202
	// Accepted, the endpoint's answer once the heartbeat is on the bus).
	for _, n := range stack.PoolNodes {
		codes := p.HeartbeatCodes(n)
		if codes["202"] == 0 || len(codes) != 1 {
			t.Errorf("%s's heartbeat posts got %v, want 202 only", n, codes)
		}
	}

	// The silent node: calls until it is offline, none after the offline
	// decision plus one resync, calls again once it is back.
	if n := rep.Phase(stack.PhaseAll).Calls[rep.Silent]; n == 0 {
		t.Errorf("%s received no call while it posted heartbeats", rep.Silent)
	}
	if off := rep.OfflineAt.Sub(rep.SilentAt); off > rep.OfflineAfter+2*time.Second {
		t.Errorf("%s offline %v after its heartbeats stopped, offline_after %v", rep.Silent, off, rep.OfflineAfter)
	}
	if len(rep.AfterOffline) > 0 {
		t.Errorf("%d calls reached %s after the offline decision + one resync (%v), the first at %v",
			len(rep.AfterOffline), rep.Silent, rep.OfflineAt.Add(rep.Resync).Format(time.StampMilli),
			rep.AfterOffline[0].At.Format(time.StampMilli))
	}
	if off := rep.Phase(stack.PhaseOffline); off.Total() == 0 {
		t.Errorf("no call at all while %s was offline: the others took none either", rep.Silent)
	}
	if n := rep.Phase(stack.PhaseBack).Calls[rep.Silent]; rep.FirstIn.IsZero() || n == 0 {
		t.Errorf("%s back: first call at %v, %d calls in the phase", rep.Silent, rep.FirstIn, n)
	}
	t.Logf("%s: offline %v after its heartbeats stopped (offline_after %v), disabled in Kamailio %v later; back: first call %v after its first heartbeat",
		rep.Silent, rep.OfflineAt.Sub(rep.SilentAt).Round(time.Millisecond), rep.OfflineAfter,
		rep.DisabledAt.Sub(rep.OfflineAt).Round(time.Millisecond), rep.FirstIn.Sub(rep.BackAt).Round(time.Millisecond))

	// The loaded node: a lower share, by what the weights say. Kamailio's
	// relative weights (algorithm 11) cycle through a table of 100 slots
	// in proportion to the weights, so over a few hundred calls the share
	// is the weights' within a few calls in a hundred.
	loaded := rep.Phase(stack.PhaseLoaded)
	got, want := loaded.Share(rep.Loaded), rep.ExpectedShare(rep.Loaded)
	t.Logf("%s loaded: weights %v, its share %.1f%% of %d calls, %.1f%% by the weights (%.1f%% before the load)",
		rep.Loaded, rep.Weights, 100*got, loaded.Total(), 100*want, 100*rep.Phase(stack.PhaseBack).Share(rep.Loaded))
	if loaded.Total() < 100 {
		t.Fatalf("only %d calls in the loaded phase", loaded.Total())
	}
	if math.Abs(got-want) > 0.05 {
		t.Errorf("%s's share %.3f, the weights give %.3f", rep.Loaded, got, want)
	}
	for _, n := range stack.PoolNodes {
		if n != rep.Loaded && loaded.Share(n) <= got {
			t.Errorf("%s's share %.3f is not above the loaded %s's %.3f", n, loaded.Share(n), rep.Loaded, got)
		}
	}
	if before := rep.Phase(stack.PhaseBack).Share(rep.Loaded); got >= before-0.1 {
		t.Errorf("%s's share %.3f under load, %.3f before it: not measurably lower", rep.Loaded, got, before)
	}
}
