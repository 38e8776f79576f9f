// Command fan-bench measures failover time of fan and of keepalived in the
// same namespace topology, scenario by scenario, and prints one line per
// scenario:
//
//	scenario=<name> cycles=<n> fan_p50_ms=<x> fan_p99_ms=<x> keepalived_p50_ms=<x> keepalived_p99_ms=<x> ratio_p99=<fan/keepalived>
//
// With -trail D it measures instead what fan writes to the bus at the lab's
// check rates (three checks per node: AMI, SIP, the peer's SIP; heartbeats
// every second; beacons every 100 ms): the audit and live streams' growth
// over a steady window of D, per PBX node per day, and the audit stream's
// growth per failover:
//
//	trail nodes=2 steady_s=<s> failovers=<n> audit_bytes_per_node_day=<b> live_bytes_per_node_day=<b> audit_bytes_per_failover=<b> ...
//
// For fan each scenario line is followed by where its time went, from the
// audit trail and the beacons seen from the control host (median/worst in
// ms from the fault; -v prints every cycle):
//
//	breakdown scenario=<name> cycles=<n> last_beacon_ms=<p50>/<max> silent_ms=... peer_down_ms=... decided_ms=... received_ms=... recorded_ms=... announced_ms=... answered_ms=... on_tick=<n> on_event=<n>
//
// With -hog D it counts false failovers instead: each of -systems runs D
// with nothing failing while a busy loop runs on every core, at keepalived's
// budget (or fan's defaults with -fan-defaults):
//
//	hog system=fan budget=<keepalived|fan-defaults> duration_s=<s> hog_cores=<n> false_failovers=<n> peer_down=<n> self_down=<n> silent_holds=<n> beacon_gaps_over_limit=<n> max_beacon_gap_ms=<ms>
//	hog system=keepalived advert_ms=<ms> duration_s=<s> hog_cores=<n> false_failovers=<n>
//
// With -scenarios calls it measures calls in progress when the holder's PBX
// is killed (kill -9): -calls-direct calls with direct media and
// -calls-anchored with their audio through the PBX, between phones on the
// lab's phone hosts, kept -calls-hold after the failover, then hung up by
// their callers, on fan's stand-in PBX (or a real Asterisk 22 with
// -asterisk), fan and keepalived each moving the same address:
//
//	calls system=<fan|keepalived> pbx=<standin|asterisk> cycles=<n> direct=<n> anchored=<n> hold_s=<s> calls_up=<n>/<n> calls_survived=<n>/<n> longest_audio_gap_ms=<ms> phones_send_stall_ms=<ms> hangups_propagated=<n>/<n> hangups_propagated_p99_ms=<ms|inf> orphaned_legs=<n> anchored_lost=<n> failover_p50_ms=<ms>
//
// `fan-bench sip-ping ADDR` is the SIP check keepalived's vrrp_script runs;
// `fan-bench hog` is one busy loop.
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
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/fanpbx/fan/lab/bench"
	"github.com/fanpbx/fan/lab/netlab"
	"github.com/fanpbx/fan/lab/stack"
	"github.com/fanpbx/fan/pkg/sipoptions"
)

// peerTimeout is the only flag fanOptions reads itself: every mode that
// runs fan at keepalived's budget uses it.
var peerTimeout = flag.Duration("peer-timeout", 0, "with keepalived's budget: fan's peer-probe timeout (0: 4/5 of the advert interval); a timed-out probe is one of the fall misses, so on a cut link the peers' verdict comes (fall-1) intervals plus this after the first lost probe")

// peerMargin is fan's decisive_margin for the peer checks at keepalived's
// budget.
var peerMargin = flag.Duration("peer-margin", 0, "with keepalived's budget: the peer checks' decisive_margin (0: 1/5 of the advert interval, as the presence grace; negative: off, every probe waits its timeout)")

// version is set by the Makefile (-X main.version), as for fan's services.
var version = "dev"

func main() {
	if len(os.Args) == 2 && (os.Args[1] == "-version" || os.Args[1] == "--version") {
		fmt.Println("fan-bench", version)
		return
	}
	if len(os.Args) > 1 && os.Args[1] == "sip-ping" {
		os.Exit(sipPing(os.Args[2:]))
	}
	if len(os.Args) == 2 && os.Args[1] == "hog" {
		bench.Spin()
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
	keep := flag.String("keep", "", "copy every process's log of each measured lab into DIR/<system>-<scenario> before the lab is removed")
	trailFor := flag.Duration("trail", 0, "measure the streams' growth over this steady window at the lab's check rates instead of failover times")
	trailFailovers := flag.Int("trail-failovers", 3, "with -trail: pbx-death failovers after the window, to measure the audit stream's growth per failover")
	placement := flag.Bool("leader-placement", true, "three-server topologies: write the arbiters' bus.leader_servers (the witness's server; all three in dedicated) and bus.system, and standby: true on the PBX hosts' arbiters (colocated): fan keeps the raft leaders and the lease off the PBX hosts; =false leaves them where they fall")
	hogFor := flag.Duration("hog", 0, "instead of failover times: run each of -systems this long with no fault while a busy loop runs on every core, and count the failovers (false ones: nothing failed)")
	callsDirect := flag.Int("calls-direct", 10, "scenario calls: calls with direct media")
	callsAnchored := flag.Int("calls-anchored", 2, "scenario calls: calls with their audio through the PBX (direct_media = no)")
	callsHold := flag.Duration("calls-hold", 10*time.Second, "scenario calls: how long the calls stay up after the failover before their callers hang up")
	asterisk := flag.String("asterisk", os.Getenv("FAN_ASTERISK"), "scenario calls: an Asterisk 22 install (its sbin/asterisk) to run as the PBXs instead of fan-pbxstandin (FAN_ASTERISK)")
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
	rc := runConfig{topo: topo, forced: *leadersFlag == "forced", placement: *placement, keep: *keep}
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
	if *trailFor > 0 {
		line, err := trail(ctx, log, absBin, *trailFor, *trailFailovers)
		if err != nil {
			return fmt.Errorf("trail: %w", err)
		}
		fmt.Println(line)
		return nil
	}

	if *hogFor > 0 {
		for _, system := range strings.Split(*systems, ",") {
			line, err := hogged(ctx, log, absBin, system, *hogFor, *advert, *fall, *defaults, *verbose)
			if err != nil {
				return fmt.Errorf("hog %s: %w", system, err)
			}
			fmt.Println(line)
		}
		return nil
	}

	results := map[string]map[bench.Scenario][]bench.Cycle{}
	breakdowns := map[bench.Scenario]string{}
	var scenarios []bench.Scenario
	for _, s := range strings.Split(*only, ",") {
		scenarios = append(scenarios, bench.Scenario(strings.TrimSpace(s)))
	}
	var callsLines []string
	if i := slices.Index(scenarios, bench.Calls); i >= 0 {
		scenarios = slices.Delete(scenarios, i, i+1)
		cc := callsRun{cfg: bench.CallsConfig{Direct: *callsDirect, Anchored: *callsAnchored, Hold: *callsHold}, pbx: stack.PBXStandIn, asterisk: *asterisk}
		if *asterisk != "" {
			cc.pbx = stack.PBXAsterisk
		}
		for _, system := range strings.Split(*systems, ",") {
			line, err := calls(ctx, log, rc, cc, system, absBin, *cycles, *advert, *fall, *verbose, *defaults)
			if err != nil {
				return fmt.Errorf("%s calls: %w", system, err)
			}
			callsLines = append(callsLines, line)
		}
	}
	defer func() {
		for _, l := range callsLines {
			fmt.Println(l)
		}
	}()
	for _, system := range strings.Split(*systems, ",") {
		results[system] = map[bench.Scenario][]bench.Cycle{}
		for _, sc := range scenarios {
			cs, bd, err := measure(ctx, log, rc, system, sc, absBin, *cycles, *advert, *fall, *verbose, *defaults)
			if err != nil {
				return fmt.Errorf("%s %s: %w", system, sc, err)
			}
			results[system][sc] = cs
			if bd != "" {
				breakdowns[sc] = bd
			}
		}
	}
	for _, sc := range scenarios {
		fmt.Println(bench.Line(sc, results["fan"][sc], results["keepalived"][sc]))
		if bd := breakdowns[sc]; bd != "" {
			fmt.Println(bd)
		}
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

// hogged runs one system with nothing failing for d while a busy loop runs
// on every core, and reports the failovers it made anyway.
func hogged(ctx context.Context, log *slog.Logger, bin, system string, d time.Duration, advert float64, fall int, defaults, verbose bool) (string, error) {
	self, err := os.Executable()
	if err != nil {
		return "", err
	}
	l, err := netlab.Build(ctx, netlab.Spec{Logger: log})
	if err != nil {
		return "", err
	}
	defer l.Close()
	c, err := bench.NewClient(l)
	if err != nil {
		return "", err
	}
	defer c.Close()
	// window holds the hog for d once the system has its holder.
	window := func() (from, to time.Time, cores int, err error) {
		if _, err := c.Holder(ctx, 60*time.Second); err != nil {
			return from, to, 0, err
		}
		h, err := bench.StartHog(self, 0)
		if err != nil {
			return from, to, 0, err
		}
		defer h.Stop()
		from = time.Now()
		if verbose {
			fmt.Fprintf(os.Stderr, "hog: %d busy loops for %v on %s\n", h.Cores(), d, system)
		}
		select {
		case <-ctx.Done():
		case <-time.After(d):
		}
		return from, time.Now(), h.Cores(), ctx.Err()
	}
	switch system {
	case "fan":
		opts, budget := fanOptions(bin, log, advert, fall), "keepalived"
		if defaults {
			opts, budget = stack.Options{BinDir: bin, Log: log, MaxMovesPerHour: -1}, "fan-defaults"
		}
		f, err := startFan(ctx, l, opts)
		if err != nil {
			return "", err
		}
		defer f.Close()
		st := f.St
		beacons, err := f.WatchBeacons(st.Cluster())
		if err != nil {
			return "", err
		}
		defer beacons.Close()
		from, to, cores, err := window()
		if err != nil {
			return "", err
		}
		evs, err := st.Events(ctx)
		if err != nil {
			return "", err
		}
		idle := bench.IdleFrom(evs, beacons, from, to, st.SilenceLimit())
		if verbose {
			for _, w := range idle.Why {
				fmt.Fprintf(os.Stderr, "hog: false failover: %s\n", w)
			}
		}
		return bench.IdleLine(budget, to.Sub(from), cores, idle), nil
	case "keepalived":
		k := &bench.Keepalived{Lab: l, BinDir: bin, AdvertInt: advert, ScriptInterval: 1, Fall: fall}
		defer k.Close()
		if err := k.Start(ctx); err != nil {
			return "", err
		}
		// Every start enters MASTER once on the first holder: count only
		// what the window adds.
		if _, err := c.Holder(ctx, 60*time.Second); err != nil {
			return "", err
		}
		sizes := k.LogSizes()
		from, to, cores, err := window()
		if err != nil {
			return "", err
		}
		n, err := bench.MasterEntries(sizes)
		if err != nil {
			return "", err
		}
		return fmt.Sprintf("hog system=keepalived advert_ms=%.0f duration_s=%.0f hog_cores=%d false_failovers=%d",
			advert*1000, to.Sub(from).Seconds(), cores, n), nil
	}
	return "", fmt.Errorf("unknown system %q", system)
}

// trail runs fan at the lab's default check rates (not keepalived's budget)
// and measures its streams' growth.
func trail(ctx context.Context, log *slog.Logger, bin string, steady time.Duration, failovers int) (string, error) {
	l, err := netlab.Build(ctx, netlab.Spec{Logger: log})
	if err != nil {
		return "", err
	}
	defer l.Close()
	f, err := startFan(ctx, l, stack.Options{BinDir: bin, Log: log, MaxMovesPerHour: -1})
	if err != nil {
		return "", err
	}
	defer f.Close()
	c, err := bench.NewClient(l)
	if err != nil {
		return "", err
	}
	defer c.Close()
	r, err := bench.Trail(ctx, f, c, len(l.Nodes()), steady, failovers)
	if err != nil {
		return "", err
	}
	return r.Line(), nil
}

// startFan starts fan's stack on l; closing the Fan stops it. A start that
// failed half-way stops what it had started.
func startFan(ctx context.Context, l *netlab.Lab, opts stack.Options) (*bench.Fan, error) {
	st, err := stack.Start(ctx, l, opts)
	if err != nil {
		if st != nil {
			st.Stop()
		}
		return nil, err
	}
	return &bench.Fan{St: st}, nil
}

// callsRun is what the flags say about the calls scenario.
type callsRun struct {
	cfg      bench.CallsConfig
	pbx      stack.PBX
	asterisk string
}

// calls runs the calls scenario on one system, in a lab of its own with
// the phones' hosts, and returns its line.
func calls(ctx context.Context, log *slog.Logger, rc runConfig, cc callsRun, system, bin string, cycles int, advert float64, fall int, verbose, defaults bool) (string, error) {
	eps, err := bench.CallEndpoints(cc.cfg.Direct, cc.cfg.Anchored)
	if err != nil {
		return "", err
	}
	l, err := netlab.Build(ctx, rc.topo.LabSpec(netlab.Spec{Logger: log, Clients: netlab.PhoneHosts()}))
	if err != nil {
		return "", err
	}
	defer func() {
		if rc.keep != "" {
			if err := l.CopyTo(filepath.Join(rc.keep, system+"-calls")); err != nil {
				log.Warn("keep logs", "err", err)
			}
		}
		l.Close()
	}()
	var sys bench.System
	switch system {
	case "fan":
		opts := fanOptions(bin, log, advert, fall)
		if defaults {
			opts = stack.Options{BinDir: bin, Log: log, MaxMovesPerHour: -1}
		}
		opts.Topology, opts.LeaderPlacement, opts.StandbyArbiters = rc.topo, rc.placement, rc.placement
		opts.PBX, opts.Asterisk, opts.Endpoints = cc.pbx, cc.asterisk, eps
		f, err := startFan(ctx, l, opts)
		if err != nil {
			return "", err
		}
		defer f.Close()
		sys = f
	case "keepalived":
		pbx := stack.PBXConfig{Kind: cc.pbx, BinDir: bin, Asterisk: cc.asterisk, Endpoints: eps, Dir: filepath.Join(l.Dir(), "pbx")}
		k := &bench.Keepalived{Lab: l, BinDir: bin, AdvertInt: advert, ScriptInterval: 1, Fall: fall,
			PBX: func(ctx context.Context, node string) (*netlab.Proc, error) { return stack.StartPBX(ctx, l, node, pbx) }}
		defer k.Close()
		if err := k.Start(ctx); err != nil {
			return "", err
		}
		sys = k
	default:
		return "", fmt.Errorf("unknown system %q", system)
	}
	pairs, err := bench.CallPhones(l, eps)
	if err != nil {
		return "", err
	}
	defer bench.ClosePhones(pairs)
	cs, err := bench.RunCalls(ctx, sys, l, pairs, cc.cfg, cycles, func(c bench.CallsCycle) {
		if verbose {
			fmt.Fprintln(os.Stderr, bench.CallsCycleLine(system, c))
		}
	})
	if err != nil {
		if lg, ok := sys.(interface{ Logs() string }); ok && verbose {
			fmt.Fprintln(os.Stderr, lg.Logs())
		}
		return "", err
	}
	return bench.CallsLine(system, cc.pbx, cc.cfg, cs), nil
}

// runConfig is what the flags say about fan's topology.
type runConfig struct {
	topo      stack.Topology
	forced    bool
	placement bool
	keep      string // copy each lab's logs under it ("" keeps nothing)
}

// fanOptions gives fan the budgets the comparison asks for: its peer probes
// and presence beacons at keepalived's advert interval, the same fall.
func fanOptions(bin string, log *slog.Logger, advert float64, fall int) stack.Options {
	every := time.Duration(advert * float64(time.Second))
	timeout := *peerTimeout
	if timeout == 0 {
		timeout = every * 4 / 5
	}
	// Silence is 3 missed beacons, as keepalived's master-down is 3 missed
	// adverts (plus its skew); a small grace and a fine tick keep the
	// arbiter from adding more than keepalived's skew on top. The peers'
	// verdict gets the same margin after their third unanswered probe.
	margin := *peerMargin
	if margin == 0 {
		margin = every / 5
	}
	return stack.Options{BinDir: bin, Log: log, Fall: fall, PeerInterval: every, PeerTimeout: timeout, PeerDecisiveMargin: margin, PresenceInterval: every,
		PresenceGrace: every / 5, ArbiterTick: 10 * time.Millisecond,
		MaxMovesPerHour: -1} // every cycle is a justified move: the flap cap would freeze the group
}

// measure runs one system through one scenario on a fresh lab, so one
// scenario's leftovers never bias the next.
//
// For fan it also returns the breakdown line: where each cycle's time went,
// from the audit trail and the beacons seen from the control host.
func measure(ctx context.Context, log *slog.Logger, rc runConfig, system string, sc bench.Scenario, bin string, cycles int, advert float64, fall int, verbose, defaults bool) ([]bench.Cycle, string, error) {
	l, err := netlab.Build(ctx, rc.topo.LabSpec(netlab.Spec{Logger: log}))
	if err != nil {
		return nil, "", err
	}
	defer func() {
		if rc.keep != "" {
			if err := l.CopyTo(filepath.Join(rc.keep, system+"-"+string(sc))); err != nil {
				log.Warn("keep logs", "err", err)
			}
		}
		l.Close()
	}()
	var (
		sys     bench.System
		explain func(cs []bench.Cycle) string
	)
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
			return nil, "", err
		}
		f := &bench.Fan{St: st, ForceLeaders: rc.forced}
		if rc.placement && rc.topo == stack.TopologyColocated {
			f.LeadersOn = []string{st.ServerName(stack.WitnessHost)}
		}
		defer f.Close()
		sys = f
		beacons, err := f.WatchBeacons(st.Cluster())
		if err != nil {
			return nil, "", err
		}
		defer beacons.Close()
		explain = func(cs []bench.Cycle) string {
			evs, err := st.Events(ctx)
			if err != nil {
				log.Warn("breakdown: read the trail", "err", err)
				return ""
			}
			ps := bench.Explain(cs, evs, beacons.LastBefore, st.SilenceLimit())
			if verbose {
				for _, p := range ps {
					fmt.Fprintf(os.Stderr, "fan %s %s\n", sc, p)
				}
			}
			return bench.BreakdownLine(sc, ps)
		}
	case "keepalived":
		k := &bench.Keepalived{Lab: l, BinDir: bin, AdvertInt: advert, ScriptInterval: 1, Fall: fall}
		defer k.Close()
		if err := k.Start(ctx); err != nil {
			return nil, "", err
		}
		sys = k
	}
	c, err := bench.NewClient(l)
	if err != nil {
		return nil, "", err
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
	var bd string
	if err == nil && explain != nil {
		bd = explain(cs)
	}
	return cs, bd, err
}
