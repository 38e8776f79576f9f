// Command fan-bench measures failover time of fan and of keepalived in the
// same namespace topology, scenario by scenario, and prints one line per
// scenario:
//
//	scenario=<name> cycles=<n> fan_p50_ms=<x> fan_p99_ms=<x> keepalived_p50_ms=<x> keepalived_p99_ms=<x> ratio_p99=<fan/keepalived>
//
// `fan-bench sip-ping ADDR` is the SIP check keepalived's vrrp_script runs.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/fanpbx/fan/lab/bench"
	"github.com/fanpbx/fan/lab/netlab"
	"github.com/fanpbx/fan/lab/stack"
	"github.com/fanpbx/fan/pkg/sipoptions"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "sip-ping" {
		os.Exit(sipPing(os.Args[2:]))
	}
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "fan-bench:", err)
		os.Exit(1)
	}
}

// sipPing exits 0 when addr answers an OPTIONS with a final response below 500.
func sipPing(args []string) int {
	fs := flag.NewFlagSet("sip-ping", flag.ContinueOnError)
	timeout := fs.Duration("timeout", 500*time.Millisecond, "deadline")
	if err := fs.Parse(args); err != nil || fs.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: fan-bench sip-ping [-timeout 500ms] IP:PORT")
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	r, err := sipoptions.Ping(ctx, fs.Arg(0))
	if err != nil || r.Status >= 500 {
		return 1
	}
	return 0
}

func run() error {
	bin := flag.String("bin", "bin", "directory with fan's binaries (make build)")
	cycles := flag.Int("cycles", 30, "failovers per scenario and system")
	only := flag.String("scenarios", "pbx-death,node-crash,link-cut", "comma-separated scenarios")
	systems := flag.String("systems", "fan,keepalived", "comma-separated systems to measure")
	advert := flag.Float64("advert", 0.05, "keepalived VRRPv3 advert interval in seconds, also fan's peer-probe and presence-beacon interval")
	fall := flag.Int("fall", 3, "consecutive misses before acting, on both sides")
	verbose := flag.Bool("v", false, "print every cycle")
	flapFor := flag.Duration("flap", 5*time.Minute, "length of the flap scenario (primary's PBX toggling every 5 s); 0 skips it")
	defaults := flag.Bool("fan-defaults", false, "run fan with its default settings (peer probes every 200 ms, beacons every 100 ms) instead of keepalived's budget")
	topoFlag := flag.String("topology", "single", "fan's bus: single (one NATS server on ctl), colocated (servers and arbiters on n1, n2 and the witness ctl), dedicated (three NATS hosts)")
	leadersFlag := flag.String("leaders", "fan", "node-crash in a three-server topology: fan (raft leaders and the lease where fan puts them) or forced (all moved onto the crashing node just before the fault)")
	placement := flag.Bool("leader-placement", true, "three-server topologies: write the arbiters' bus.leader_servers (the witness's server; all three in dedicated) and bus.system, and standby: true on the PBX hosts' arbiters (colocated): fan keeps the raft leaders and the lease off the PBX hosts; =false leaves them where they fall")
	flag.Parse()
	topo, err := stack.ParseTopology(*topoFlag)
	if err != nil {
		return err
	}
	if *leadersFlag != "fan" && *leadersFlag != "forced" {
		return fmt.Errorf("-leaders %q: want fan or forced", *leadersFlag)
	}
	if *leadersFlag == "forced" && topo == stack.TopologySingle {
		return errors.New("-leaders forced needs -topology colocated or dedicated")
	}
	rc := runConfig{topo: topo, forced: *leadersFlag == "forced", placement: *placement}
	absBin, err := filepath.Abs(*bin)
	if err != nil {
		return err
	}
	if os.Geteuid() != 0 {
		return errors.New("the benchmark builds network namespaces: run it as root")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))

	results := map[string]map[bench.Scenario][]bench.Cycle{}
	var scenarios []bench.Scenario
	for _, s := range strings.Split(*only, ",") {
		scenarios = append(scenarios, bench.Scenario(strings.TrimSpace(s)))
	}
	for _, system := range strings.Split(*systems, ",") {
		results[system] = map[bench.Scenario][]bench.Cycle{}
		for _, sc := range scenarios {
			cs, err := measure(ctx, log, rc, system, sc, absBin, *cycles, *advert, *fall, *verbose, *defaults)
			if err != nil {
				return fmt.Errorf("%s %s: %w", system, sc, err)
			}
			results[system][sc] = cs
		}
	}
	for _, sc := range scenarios {
		fmt.Println(bench.Line(sc, results["fan"][sc], results["keepalived"][sc]))
	}
	if *flapFor > 0 {
		line, err := flap(ctx, log, absBin, *flapFor, *advert, *fall, *verbose)
		if err != nil {
			return fmt.Errorf("flap: %w", err)
		}
		fmt.Println(line)
	}
	return nil
}

// flap toggles the holder's PBX every 5 s with no failback window open and
// counts, from the audit trail, how often the address moved and how often
// it moved back.
func flap(ctx context.Context, log *slog.Logger, bin string, d time.Duration, advert float64, fall int, verbose bool) (string, error) {
	l, err := netlab.Build(ctx, netlab.Spec{Logger: log})
	if err != nil {
		return "", err
	}
	defer l.Close()
	// The production flap cap stays on here: the scenario is about flapping.
	opts := fanOptions(bin, log, advert, fall)
	opts.MaxMovesPerHour = 0
	st, err := stack.Start(ctx, l, opts)
	if st != nil {
		defer st.Stop()
	}
	if err != nil {
		return "", err
	}
	c, err := bench.NewClient(l)
	if err != nil {
		return "", err
	}
	defer c.Close()
	primary, err := c.Holder(ctx, 30*time.Second)
	if err != nil {
		return "", err
	}
	toggles, dead := 0, false
	end := time.Now().Add(d)
	for time.Now().Before(end) && ctx.Err() == nil {
		if dead {
			err = st.ThawPBX(ctx, primary)
		} else {
			err = st.KillPBX(ctx, primary)
		}
		if err != nil {
			return "", err
		}
		dead = !dead
		toggles++
		if verbose {
			fmt.Fprintf(os.Stderr, "flap: %s's PBX %s\n", primary, map[bool]string{true: "down", false: "up"}[dead])
		}
		select {
		case <-ctx.Done():
		case <-time.After(5 * time.Second):
		}
	}
	if dead {
		_ = st.ThawPBX(ctx, primary)
	}
	evs, err := st.Events(ctx)
	if err != nil {
		return "", err
	}
	moves, failbacks := bench.CountMoves(evs)
	return fmt.Sprintf("scenario=flap duration_s=%.0f toggles=%d moves=%d failbacks=%d", d.Seconds(), toggles, moves, failbacks), nil
}

// runConfig is what the flags say about fan's topology.
type runConfig struct {
	topo      stack.Topology
	forced    bool
	placement bool
}

// fanOptions gives fan the budgets the comparison asks for: its peer probes
// and presence beacons at keepalived's advert interval, the same fall.
func fanOptions(bin string, log *slog.Logger, advert float64, fall int) stack.Options {
	every := time.Duration(advert * float64(time.Second))
	// Silence is 3 missed beacons, as keepalived's master-down is 3 missed
	// adverts (plus its skew); a small grace and a fine tick keep the
	// arbiter from adding more than keepalived's skew on top.
	return stack.Options{BinDir: bin, Log: log, Fall: fall, PeerInterval: every, PeerTimeout: every * 4 / 5, PresenceInterval: every,
		PresenceGrace: every / 5, ArbiterTick: 10 * time.Millisecond,
		MaxMovesPerHour: -1} // every cycle is a justified move: the flap cap would freeze the group
}

// measure runs one system through one scenario on a fresh lab, so one
// scenario's leftovers never bias the next.
func measure(ctx context.Context, log *slog.Logger, rc runConfig, system string, sc bench.Scenario, bin string, cycles int, advert float64, fall int, verbose, defaults bool) ([]bench.Cycle, error) {
	l, err := netlab.Build(ctx, rc.topo.LabSpec(netlab.Spec{Logger: log}))
	if err != nil {
		return nil, err
	}
	defer l.Close()
	var sys bench.System
	switch system {
	case "fan":
		opts := fanOptions(bin, log, advert, fall)
		if defaults {
			opts = stack.Options{BinDir: bin, Log: log, MaxMovesPerHour: -1}
		}
		// Placement is the whole of it: leaders on the witness (bus.leader_servers,
		// bus.system) and the lease off the PBX hosts (standby arbiters).
		opts.Topology, opts.LeaderPlacement, opts.StandbyArbiters = rc.topo, rc.placement, rc.placement
		st, err := stack.Start(ctx, l, opts)
		if st != nil {
			defer st.Stop()
		}
		if err != nil {
			return nil, err
		}
		f := &bench.Fan{St: st, ForceLeaders: rc.forced}
		defer f.Close()
		sys = f
	case "keepalived":
		k := &bench.Keepalived{Lab: l, BinDir: bin, AdvertInt: advert, ScriptInterval: 1, Fall: fall}
		defer k.Close()
		if err := k.Start(ctx); err != nil {
			return nil, err
		}
		sys = k
	}
	c, err := bench.NewClient(l)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	cs, err := bench.Run(ctx, sys, c, sc, cycles, func(cy bench.Cycle) {
		if verbose {
			fmt.Fprintf(os.Stderr, "%s %s %s->%s %v\n", system, sc, cy.From, cy.To, cy.Took.Round(time.Millisecond))
		}
	})
	if err != nil && verbose {
		if lg, ok := sys.(interface{ Logs() string }); ok {
			fmt.Fprintln(os.Stderr, lg.Logs())
		}
	}
	return cs, err
}
