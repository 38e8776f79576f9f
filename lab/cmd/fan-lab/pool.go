package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/fanpbx/fan/lab/stack"
)

// runPool is -scenario pool: PBX nodes behind a Kamailio dispatcher that
// post heartbeats over HTTP; one falls silent and comes back, one is
// loaded (stack.RunPoolScenario, as TestKamailioPool).
func runPool(ctx context.Context, bin string, keep bool, log *slog.Logger) error {
	tl := &timeline{start: time.Now(), w: os.Stdout}
	tl.say("building the pool lab: PBX nodes n1-n3 (stand-ins answering every INVITE), the proxy host kam (Kamailio's dispatcher,")
	tl.say("fan's dispatcher executor with weights, an observer asking the nodes' SIP), ctl (fan-nats, the arbiter with its HTTP")
	tl.say("heartbeat endpoint over TLS), the caller c (SIPp); every node posts its CPU and memory with curl every second")
	p, err := stack.StartPool(ctx, stack.PoolOptions{BinDir: bin, Log: log})
	if p != nil {
		defer func() {
			tl.say("tearing the lab down")
			if err := p.Close(); err != nil {
				fmt.Fprintln(os.Stderr, "fan-lab: close:", err)
			}
		}()
	}
	if err != nil {
		return err
	}
	o := p.Opts
	tl.say(fmt.Sprintf("registry.offline_after %v (shortened for the lab; 5m by default), sweep every %v; dispatcher.resync %v; weights threshold %d, confirm %d",
		o.OfflineAfter, o.SweepEvery, o.Resync, o.Threshold, o.Confirm))
	rep, err := stack.RunPoolScenario(ctx, p, tl)
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s\n", p.Logs(3000))
		return err
	}
	fmt.Printf("\ncalls received per node in each phase:\n%s", rep.PhaseTable())
	fmt.Printf("\nn3: silent at +0s, offline %v later (offline_after %v), disabled in Kamailio %v after that; calls reaching it after the offline decision + one resync: %d\n",
		rep.OfflineAt.Sub(rep.SilentAt).Round(time.Millisecond), rep.OfflineAfter, rep.DisabledAt.Sub(rep.OfflineAt).Round(time.Millisecond), len(rep.AfterOffline))
	fmt.Printf("n3 back: online %v after its first heartbeat, active in Kamailio %v later, first call %v after that\n",
		rep.OnlineAt.Sub(rep.BackAt).Round(time.Millisecond), rep.EnabledAt.Sub(rep.OnlineAt).Round(time.Millisecond), rep.FirstIn.Sub(rep.EnabledAt).Round(time.Millisecond))
	loaded := rep.Phase(stack.PhaseLoaded)
	fmt.Printf("n2 loaded: weights %v published %v after its first loaded heartbeat was due, held by Kamailio %v later; n2's share %.1f%% against %.1f%% by the weights\n",
		rep.Weights, rep.WeightsAt.Sub(rep.LoadAt).Round(time.Millisecond), rep.AppliedAt.Sub(rep.WeightsAt).Round(time.Millisecond),
		100*loaded.Share("n2"), 100*rep.ExpectedShare("n2"))
	if keep {
		tl.say("lab kept running; Ctrl-C to tear it down")
		<-ctx.Done()
	}
	return nil
}
