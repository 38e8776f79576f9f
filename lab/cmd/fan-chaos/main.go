// Command fan-chaos runs fan's real binaries in a namespace lab under a
// randomized, seeded fault schedule and checks fan's invariants (docs/invariants.md)
// from the outside (see lab/chaos/README.md). It prints a line per fault as
// it happens and ends with exactly one line:
//
//	dual_holder_ms=<total> longest_outage_ms=<x> stale_epoch_executions=<n> faults=<n>
//
// It exits 1 when an invariant broke (and says which on stderr), 0 when
// none did. SIGINT or SIGTERM heals the fault in progress and removes the lab.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/fanpbx/fan/lab/chaos"
	"github.com/fanpbx/fan/lab/cmd/internal/labcmd"
	"github.com/fanpbx/fan/lab/stack"
)

// version is set by the Makefile (-X main.version), as for fan's services.
var version = "dev"

func main() { labcmd.Main("fan-chaos", version, run) }

func run(ctx context.Context, args []string) error {
	bin := flag.String("bin", "bin", "directory with fan's binaries (make build)")
	duration := flag.Duration("duration", 10*time.Minute, "how long to run the fault schedule")
	seed := flag.Uint64("seed", 0, "schedule seed (0: pick one from the clock; printed, so a run can be replayed)")
	verbose := flag.Bool("v", false, "print every episode and outage, and lab progress")
	topoFlag := flag.String("topology", "single", "where NATS and the arbiters run: single, colocated or dedicated (the last two add the faults of one NATS server: kill -9, routes cut)")
	placement := flag.Bool("leader-placement", true, "three-server topologies: run as the production guide configures them (bus.leader_servers, standby: true on the PBX hosts' arbiters); =false leaves the raft leaders and the lease where they fall, which no outage bound covers")
	scheduleText := flag.String("schedule", "", `faults to run instead of the seed's, separated by ";", each "kind target [service] hold=D [gap=D]" (e.g. "nats-kill standby hold=1s; link-cut holder hold=6s gap=3s")`)
	if err := flag.CommandLine.Parse(args); err != nil {
		return err
	}
	topo, err := stack.ParseTopology(*topoFlag)
	if err != nil {
		return labcmd.Status(2, err)
	}
	var schedule []chaos.Fault
	if *scheduleText != "" {
		lim := chaos.DefaultLimits()
		lim.ServerFaults = topo != stack.TopologySingle
		if schedule, err = chaos.ParseSchedule(*scheduleText, lim); err != nil {
			return labcmd.Status(2, fmt.Errorf("-schedule: %w", err))
		}
	}
	if *seed == 0 {
		*seed = uint64(time.Now().UnixNano())
	}
	absBin, err := filepath.Abs(*bin)
	if err != nil {
		return labcmd.Status(2, err)
	}
	if os.Geteuid() != 0 {
		return labcmd.Status(2, errors.New("the chaos run builds network namespaces: run it as root"))
	}
	level := slog.LevelWarn
	if *verbose {
		level = slog.LevelInfo
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))

	replay := fmt.Sprintf("-seed %d -duration %v -topology %s -leader-placement=%t", *seed, *duration, topo, *placement)
	if schedule != nil {
		replay = fmt.Sprintf("-schedule %q -duration %v -topology %s -leader-placement=%t", *scheduleText, *duration, topo, *placement)
	}
	fmt.Printf("fan-chaos: seed=%d (replay with %s)\n", *seed, replay)
	res, err := chaos.Run(ctx, chaos.Config{BinDir: absBin, Duration: *duration, Seed: *seed, Out: os.Stdout, Log: log, Verbose: *verbose,
		Topology: topo, Unplaced: !*placement, Schedule: schedule})
	if err != nil {
		if errors.Is(err, context.Canceled) {
			return labcmd.Status(130, fmt.Errorf("interrupted after %d faults; healed and torn down (seed %d)", len(res.Injected), *seed))
		}
		return labcmd.Status(2, fmt.Errorf("seed %d: %w", *seed, err))
	}
	report(res, *verbose)
	fmt.Println(res.Line())
	if len(res.Violations) > 0 {
		for _, v := range res.Violations {
			fmt.Fprintln(os.Stderr, "INVARIANT BROKEN:", v)
		}
		fmt.Fprintf(os.Stderr, "fan-chaos: replay with %s\n", replay)
		return labcmd.Status(1, nil)
	}
	return nil
}

// report prints the evidence behind the summary line on stderr: every dual
// episode, the outages, stale executions and refusals.
func report(r chaos.Result, verbose bool) {
	w := os.Stderr
	ts := func(t time.Time) string { return fmt.Sprintf("+%.3fs", t.Sub(r.Start).Seconds()) }
	fmt.Fprintf(w, "arp: %d rounds every %v (%d send errors); dual episodes: %d, counted %d ms, excused (within a partition bound after a heal) %d ms\n",
		r.Rounds, chaos.ARPInterval, r.ARPSendErrors, len(r.Episodes), r.DualCounted.Milliseconds(), r.DualExcused.Milliseconds())
	for _, e := range r.Episodes {
		fmt.Fprintf(w, "  dual %s length=%dms counted=%dms rounds=%d macs=%v %s\n", ts(e.Start), e.Length.Milliseconds(), e.Counted.Milliseconds(), e.Rounds, e.MACs, e.Context)
	}
	fmt.Fprintf(w, "sip: %d probes, %d answered; outages over %v: %d; longest counted %d ms (bound %v)\n",
		r.Probes, r.Answers, 50*time.Millisecond, len(r.Outages), r.LongestOutage.Counted.Milliseconds(), chaos.OutageBound)
	for _, o := range r.Outages {
		if verbose || o.Counted > 100*time.Millisecond {
			fmt.Fprintf(w, "  outage %s length=%dms counted=%dms %s\n", ts(o.Start), o.End.Sub(o.Start).Milliseconds(), o.Counted.Milliseconds(), o.Context)
		}
	}
	fmt.Fprintf(w, "epochs: %d applied, highest %d, %d refused as stale (fencing at work), %d without a known epoch, %d stale executions\n",
		r.Epochs.Applied, r.Epochs.MaxEpoch, r.Epochs.Refused, r.Epochs.Unknown, len(r.Epochs.Stale))
	for _, s := range r.Epochs.Stale {
		fmt.Fprintf(w, "  stale: %s\n", s)
	}
	fmt.Fprintf(w, "trail: %d moves, results, conflicts and corrections\n", len(r.Trail))
	for _, l := range r.Trail {
		fmt.Fprintln(w, "  "+l)
	}
	for _, in := range r.Injected {
		if in.Err != nil || !in.Settled {
			fmt.Fprintf(w, "fault #%d (%s %s on %s): settled before=%v err=%v\n", in.N, in.Fault.Kind, in.Fault.Service, in.Node, in.Settled, in.Err)
		}
	}
}
