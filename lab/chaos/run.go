package chaos

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/fanpbx/fan/lab/bench"
	"github.com/fanpbx/fan/lab/leaders"
	"github.com/fanpbx/fan/lab/netlab"
	"github.com/fanpbx/fan/lab/stack"
	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/poll"
	"github.com/nats-io/nats.go/jetstream"
)

// Config is one chaos run.
type Config struct {
	BinDir   string
	Duration time.Duration
	Seed     uint64
	Limits   Limits
	// Out receives one line per fault as it happens.
	Out     io.Writer
	Log     *slog.Logger
	Verbose bool
	// SettleTimeout bounds the wait for the system to settle between faults.
	SettleTimeout time.Duration
	// Topology is where NATS and the arbiters run (stack.Topology; empty:
	// single). The colocated and dedicated topologies get the one-server
	// faults (Limits.ServerFaults).
	Topology stack.Topology
	// Unplaced runs a three-server topology without the placement the
	// production guide configures (bus.leader_servers, standby: true on the
	// PBX hosts' arbiters): raft leaders and the lease fall where they
	// fall, and a cut PBX host may take a leader whose election (4 to 9 s)
	// no outage bound covers. For comparison only.
	Unplaced bool
	// Schedule, when set (ParseSchedule), is run instead of the seed's.
	Schedule []Fault
}

// Injected is a fault as it was carried out.
type Injected struct {
	N        int
	Fault    Fault
	Node     string // the node it landed on, or "ctl"
	At       time.Time
	HealedAt time.Time
	// Settled is false when the system had not settled within the timeout
	// before this fault was injected.
	Settled bool
	Err     error
}

func (in Injected) label() string {
	s := fmt.Sprintf("#%d %s on %s", in.N, in.Fault.Kind, in.Node)
	if in.Fault.Service != "" {
		s += " (" + in.Fault.Service + ")"
	}
	if in.Fault.Target == Holder || in.Fault.Target == Standby {
		s += " [" + string(in.Fault.Target) + "]"
	}
	return s
}

// Result is what a run measured.
type Result struct {
	Seed     uint64
	Start    time.Time
	End      time.Time
	Injected []Injected

	Rounds        int
	ARPSendErrors int
	Episodes      []Episode
	DualCounted   time.Duration
	DualExcused   time.Duration

	Probes        int
	Answers       int
	Outages       []Outage
	LongestOutage Outage

	Epochs EpochReport
	// Trail is the moves and fencing outcomes of the audit trail, one line
	// each, as evidence for the episodes above.
	Trail []string
	// Violations names every broken invariant; empty means the run passed.
	Violations []string
}

// Line is the run's one-line summary.
func (r Result) Line() string {
	return fmt.Sprintf("dual_holder_ms=%d longest_outage_ms=%d stale_epoch_executions=%d faults=%d",
		r.DualCounted.Milliseconds(), r.LongestOutage.Counted.Milliseconds(), len(r.Epochs.Stale), len(r.Injected))
}

// Run builds a lab, starts fan in it, runs the schedule for cfg.Seed and
// judges the result. It heals the fault in progress and tears everything
// down when ctx ends early; the error is then ctx's.
func Run(ctx context.Context, cfg Config) (res Result, err error) {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Out == nil {
		cfg.Out = io.Discard
	}
	if cfg.Limits.Hold == nil {
		cfg.Limits = DefaultLimits()
	}
	if cfg.SettleTimeout == 0 {
		cfg.SettleTimeout = 60 * time.Second
	}
	if cfg.Topology == "" {
		cfg.Topology = stack.TopologySingle
	}
	cfg.Limits.ServerFaults = cfg.Topology != stack.TopologySingle
	res.Seed = cfg.Seed
	// The tail after the last fault: settle, then observe a little longer.
	// The schedule is generated for more time than the run has (faults often
	// settle faster than budgeted); the runner stops when the time is up.
	schedule := cfg.Schedule
	if schedule == nil {
		schedule = Generate(cfg.Seed, 3*cfg.Duration, cfg.Limits)
	}
	if err := Check(schedule, cfg.Limits); err != nil {
		return res, fmt.Errorf("schedule for seed %d: %w", cfg.Seed, err)
	}

	l, err := netlab.Build(ctx, cfg.Topology.LabSpec(netlab.Spec{Logger: cfg.Log}))
	if err != nil {
		return res, err
	}
	defer func() {
		if cerr := l.Close(); cerr != nil {
			err = errors.Join(err, cerr)
		}
	}()
	// No flap cap: a chaos run causes a justified failover every minute or
	// so, and with the production cap (5 an hour, then a needs_human freeze)
	// it would measure the freeze instead of failover.
	// The three-server topologies run as the production guide sets them up:
	// leaders kept on the witness, the PBX hosts' arbiters standbys.
	placed := cfg.Topology != stack.TopologySingle && !cfg.Unplaced
	st, err := stack.Start(ctx, l, stack.Options{BinDir: cfg.BinDir, Log: cfg.Log, MaxMovesPerHour: -1, Topology: cfg.Topology,
		LeaderPlacement: placed, StandbyArbiters: placed})
	if st != nil {
		defer st.Stop()
	}
	if err != nil {
		return res, err
	}
	r := &runner{cfg: cfg, l: l, st: st}
	defer func() {
		if err != nil && cfg.Verbose {
			fmt.Fprintln(cfg.Out, st.Logs(4000))
		}
	}()
	nc, js, err := st.Connect(netlab.ControlHost)
	if err != nil {
		return res, err
	}
	defer nc.Close()
	r.js = js
	r.client, err = bench.NewClient(l)
	if err != nil {
		return res, err
	}
	defer r.client.Close()
	if _, err := r.client.Holder(ctx, 60*time.Second); err != nil {
		return res, fmt.Errorf("initial placement: %w", err)
	}

	arp, err := NewARPObserver(l, ARPInterval)
	if err != nil {
		return res, err
	}
	defer arp.Stop()
	sip, err := NewSIPObserver(l, SIPInterval, SIPTimeout)
	if err != nil {
		return res, err
	}
	defer sip.Stop()
	res.Start = time.Now()
	r.t0 = res.Start
	arp.Start()
	sip.Start()
	r.printf("chaos: seed=%d duration=%v faults_available=%d partition_bound=%v route_partition_bound=%v rejoin_bound=%v route_rejoin_bound=%v outage_bound=%v topology=%s",
		cfg.Seed, cfg.Duration, len(schedule), PartitionBound, RoutePartitionBound, RejoinBound, RouteRejoinBound, OutageBound, cfg.Topology)

	deadline := res.Start.Add(cfg.Duration)
	runErr := r.runSchedule(ctx, schedule, deadline)
	if runErr == nil {
		// Let the last heal settle, so its consequences (a dual holder
		// after a link heals, an outage) are measured.
		if !r.waitSettled(ctx, cfg.SettleTimeout) {
			r.printf("%s  system did not settle after the last fault within %v", r.rel(time.Now()), cfg.SettleTimeout)
		}
		sleepCtx(ctx, 2*time.Second)
	}
	stopAt := time.Now()
	sip.Stop()
	arp.Stop()
	res.Injected = r.done
	if runErr != nil {
		return res, runErr
	}
	res.End = stopAt.Add(-SIPTimeout) // probes still in flight at Stop were abandoned, not lost

	ectx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	evs, err := st.Events(ectx)
	if err != nil {
		return res, fmt.Errorf("reading the audit trail: %w", err)
	}
	sends, sightings, sendErrs := arp.Capture()
	judge(&res, l, sends, sightings, sendErrs, sip.Probes(), evs, cfg.Topology == stack.TopologyColocated)
	return res, nil
}

// judge computes every figure from the raw observations; it is separate from
// the run so its parts can be tested on synthetic data.
//
// colocated says the PBX nodes' hosts run the cluster's NATS servers: a
// node's return then costs a raft election (RejoinBound).
func judge(res *Result, l *netlab.Lab, sends []time.Time, sightings []Sighting, sendErrs int, probes []Probe, evs []stack.Event, colocated bool) {
	macNode := map[string]string{}
	for _, h := range l.Hosts() {
		macNode[h.MAC] = h.Name
	}
	rounds := Rounds(sends, sightings, ARPInterval)
	res.Rounds, res.ARPSendErrors = len(rounds), sendErrs
	var allowed []Window
	for _, in := range res.Injected {
		// The windows are per fault; the message below names the shortest.
		bound, rejoin := PartitionBound, colocated && in.Node != netlab.ControlHost
		if rejoin {
			bound = RejoinBound
		}
		if (in.Fault.Kind == LinkCut || in.Fault.Kind == NATSPartition) && !in.HealedAt.IsZero() {
			allowed = append(allowed, HealWindow(in.HealedAt, bound, in.label()))
		}
		if in.Fault.Kind == RoutePartition && !in.HealedAt.IsZero() {
			bound = RoutePartitionBound
			if rejoin {
				bound = RouteRejoinBound
			}
			allowed = append(allowed, HealWindow(in.HealedAt, bound, in.label()))
		}
	}
	res.Episodes, res.DualCounted = DualEpisodes(rounds, allowed)
	for i := range res.Episodes {
		e := &res.Episodes[i]
		res.DualExcused += e.Length - e.Counted
		e.Context = context1(res.Injected, e.Start)
		for j, m := range e.MACs {
			if n := macNode[m]; n != "" {
				e.MACs[j] = n + "=" + m
			}
		}
	}

	nodes := []string{}
	per := map[string][]Window{}
	for _, n := range l.Nodes() {
		nodes = append(nodes, n.Name)
	}
	for _, in := range res.Injected {
		if in.Fault.AffectsNode() && !in.At.IsZero() {
			to := in.HealedAt
			if to.IsZero() {
				to = res.End
			}
			per[in.Node] = append(per[in.Node], Window{From: in.At, To: to, Why: in.label()})
		}
	}
	res.Probes = len(probes)
	for _, p := range probes {
		if p.Answered {
			res.Answers++
		}
	}
	res.Outages = Outages(probes, res.Start, res.End, outageMinGap, AllUnhealthy(nodes, per))
	for i := range res.Outages {
		res.Outages[i].Context = context1(res.Injected, res.Outages[i].FirstMissed)
	}
	if o, ok := Longest(res.Outages); ok {
		res.LongestOutage = o
	}
	res.Epochs = StaleEpochs(evs)
	res.Trail = trailLines(evs, res.Start)

	if res.DualCounted > 0 {
		res.Violations = append(res.Violations, fmt.Sprintf("invariant 1 (one holder): two MACs answered ARP for the floating IP for %v outside the partition bounds (%v after a heal; %v after a PBX host's server rejoins)",
			res.DualCounted.Round(time.Microsecond), PartitionBound, RejoinBound))
	}
	if res.LongestOutage.Counted > OutageBound {
		res.Violations = append(res.Violations, fmt.Sprintf("outage bound: the floating IP went unanswered for %d ms while a node was healthy (bound %v) from %s (%s)",
			res.LongestOutage.Counted.Milliseconds(), OutageBound, res.LongestOutage.Start.Format("15:04:05.000"), res.LongestOutage.Context))
	}
	if len(res.Epochs.Stale) > 0 {
		res.Violations = append(res.Violations, fmt.Sprintf("invariant 2 (fenced commands): %d command(s) applied under an epoch older than one applied before", len(res.Epochs.Stale)))
	}
}

// trailLines picks from the trail what explains the address's moves:
// decisions, commands' results other than plain duplicates, conflicts and
// corrections.
func trailLines(evs []stack.Event, t0 time.Time) []string {
	var out []string
	for _, e := range evs {
		at := fmt.Sprintf("%+9.3fs", e.Env.Time.Sub(t0).Seconds())
		switch p := e.Payload.(type) {
		case *events.ArbiterDecision:
			out = append(out, fmt.Sprintf("%s %s decision %s %s->%s epoch=%d: %s", at, e.Env.ID, p.Action, p.From, p.To, e.Env.Epoch, p.Reason))
		case *events.CommandResult:
			if p.Outcome != events.OutcomeDuplicate {
				out = append(out, fmt.Sprintf("%s %s result %s on %s epoch=%d: %s %s", at, e.Env.ID, p.CommandType, p.Node, e.Env.Epoch, p.Outcome, p.Error))
			}
		case *events.AddressConflict, *events.AddressCorrection:
			out = append(out, fmt.Sprintf("%s %s %s from %s: %+v", at, e.Env.ID, e.Env.Type, e.Env.Source.Node, p))
		}
	}
	return out
}

// context1 names the fault active at t, or the last one healed before t.
func context1(inj []Injected, t time.Time) string {
	var last *Injected
	for i := range inj {
		in := &inj[i]
		if in.At.IsZero() || in.At.After(t) {
			continue
		}
		if in.HealedAt.IsZero() || !in.HealedAt.Before(t) {
			return "during " + in.label()
		}
		last = in
	}
	if last == nil {
		return "before any fault"
	}
	return fmt.Sprintf("%v after %s healed", t.Sub(last.HealedAt).Round(time.Millisecond), last.label())
}

type runner struct {
	cfg    Config
	l      *netlab.Lab
	st     *stack.Stack
	client *bench.Client
	js     jetstream.JetStream
	t0     time.Time
	done   []Injected
}

func (r *runner) printf(format string, args ...any) {
	fmt.Fprintf(r.cfg.Out, format+"\n", args...)
}

func (r *runner) rel(t time.Time) string {
	return fmt.Sprintf("+%8.3fs", t.Sub(r.t0).Seconds())
}

func (r *runner) runSchedule(ctx context.Context, schedule []Fault, deadline time.Time) error {
	for i, f := range schedule {
		if !sleepCtx(ctx, f.Gap) {
			return ctx.Err()
		}
		settled := r.waitSettled(ctx, r.cfg.SettleTimeout)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if !settled {
			r.printf("%s  not settled after %v; injecting anyway", r.rel(time.Now()), r.cfg.SettleTimeout)
		}
		if time.Now().Add(f.Hold + 10*time.Second).After(deadline) {
			r.printf("%s  time is up: %d of %d planned faults injected", r.rel(time.Now()), len(r.done), len(schedule))
			return nil
		}
		in := Injected{N: i + 1, Fault: f, Settled: settled}
		in.Node = r.resolve(ctx, f.Target)
		in.At = time.Now()
		if err := r.inject(ctx, in); err != nil {
			in.Err = err
			r.printf("%s  FAULT %s: inject failed: %v", r.rel(in.At), in.label(), err)
		} else {
			r.printf("%s  FAULT %s for %v", r.rel(in.At), in.label(), f.Hold)
		}
		interrupted := !sleepCtx(ctx, f.Hold)
		// Healing must happen even when the run is being interrupted, so it
		// gets its own context.
		hctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		herr := r.heal(hctx, in)
		cancel()
		in.HealedAt = time.Now()
		if herr != nil {
			in.Err = errors.Join(in.Err, herr)
			r.printf("%s  HEAL  %s failed: %v", r.rel(in.HealedAt), in.label(), herr)
		} else {
			r.printf("%s  HEAL  %s", r.rel(in.HealedAt), in.label())
		}
		r.done = append(r.done, in)
		if herr != nil {
			return fmt.Errorf("healing %s: %w", in.label(), herr)
		}
		if interrupted {
			return ctx.Err()
		}
	}
	return nil
}

// resolve picks the node a fault lands on now.
func (r *runner) resolve(ctx context.Context, t Target) string {
	if t == Control {
		return netlab.ControlHost
	}
	nodes := r.l.Nodes()
	holder := nodes[0].Name
	if hs, err := bench.AddressHolders(ctx, r.l); err == nil && len(hs) == 1 {
		holder = hs[0]
	}
	if t == Holder {
		return holder
	}
	for _, n := range nodes {
		if n.Name != holder {
			return n.Name
		}
	}
	return holder
}

func (r *runner) inject(ctx context.Context, in Injected) error {
	switch in.Fault.Kind {
	case KillService:
		return r.st.KillService(in.Node, in.Fault.Service)
	case NATSRestart:
		return r.st.StopNATS()
	case PBXFreeze:
		return r.st.KillPBX(ctx, in.Node)
	case LinkCut:
		return r.l.LinkDown(in.Node)
	case NATSPartition:
		return r.st.PartitionFromNATS(ctx, in.Node)
	case NATSKill:
		return r.st.KillNATS(in.Node)
	case RoutePartition:
		return r.st.CutRoutes(ctx, in.Node)
	}
	return fmt.Errorf("unknown fault kind %q", in.Fault.Kind)
}

func (r *runner) heal(ctx context.Context, in Injected) error {
	switch in.Fault.Kind {
	case KillService:
		return r.st.RestartService(ctx, in.Node, in.Fault.Service)
	case NATSRestart:
		return r.st.StartNATS(ctx)
	case PBXFreeze:
		return r.st.ThawPBX(ctx, in.Node)
	case LinkCut:
		return r.l.LinkUp(in.Node)
	case NATSPartition:
		return r.st.HealNATSPartition(ctx, in.Node)
	case NATSKill:
		return r.st.StartNATSOn(ctx, in.Node)
	case RoutePartition:
		return r.st.HealRoutes(ctx, in.Node)
	}
	return fmt.Errorf("unknown fault kind %q", in.Fault.Kind)
}

// waitSettled waits until the arbiter names a holder, sees every node up
// and heard, exactly that node carries the address, and the client gets
// answers from it.
func (r *runner) waitSettled(ctx context.Context, within time.Duration) bool {
	why := ""
	// Each look asks the bus, every namespace and the client.
	err := poll.Every(ctx, 250*time.Millisecond, within, "settled", func() error {
		if why = r.unsettled(ctx); why != "" {
			return errors.New(why)
		}
		return nil
	})
	if err != nil && ctx.Err() == nil {
		r.printf("%s  unsettled: %s", r.rel(time.Now()), why)
	}
	return err == nil
}

func (r *runner) unsettled(ctx context.Context) string {
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	gs, err := r.st.Status(sctx)
	if err != nil {
		return err.Error()
	}
	if len(gs) != 1 {
		return fmt.Sprintf("%d groups in status", len(gs))
	}
	g := gs[0]
	if g.Holder == "" {
		return "no holder in status"
	}
	var bad []string
	for _, n := range r.l.Nodes() {
		ns, ok := g.Nodes[n.Name]
		if !ok || ns.Health != events.HealthUp || ns.Silent {
			bad = append(bad, fmt.Sprintf("%s health=%s silent=%v", n.Name, ns.Health, ns.Silent))
		}
	}
	if len(bad) > 0 {
		return strings.Join(bad, ", ")
	}
	hs, err := bench.AddressHolders(sctx, r.l)
	if err != nil {
		return err.Error()
	}
	if !slices.Equal(hs, []string{g.Holder}) {
		return fmt.Sprintf("address on %v, status holder %s", hs, g.Holder)
	}
	who, err := r.client.Holder(sctx, 2*time.Second)
	if err != nil {
		return err.Error()
	}
	if who != g.Holder {
		return fmt.Sprintf("client answered by %s, status holder %s", who, g.Holder)
	}
	// The next fault must find every peer check up again: a link healed
	// a moment ago still has them down until rise probes answer, and a
	// fault on the other node then is decided on silence alone.
	since := r.t0
	if len(r.done) > 0 {
		since = r.done[len(r.done)-1].HealedAt
	}
	if why := bench.PeersReachEachOther(sctx, r.js, r.st, since); why != "" {
		return why
	}
	if r.cfg.Topology != stack.TopologySingle {
		// The next fault may take a server: every raft group must be able
		// to lose one.
		lg, err := leaders.List(sctx, r.js)
		if err != nil {
			return err.Error()
		}
		if !leaders.Settled(lg) {
			return "raft groups not settled: " + leaders.Describe(lg)
		}
		// Placement restores itself after a server returns (the arbiter's
		// steward); a fault before it has is two faults at once.
		if servers := r.st.LeaderServers(); servers != nil {
			if off := leaders.Off(lg, servers...); len(off) > 0 {
				return fmt.Sprintf("leaders not yet back on %v: %s", servers, leaders.Describe(off))
			}
			lease, err := leaders.ArbiterLease(sctx, r.js, r.st.Cluster())
			if err != nil {
				return err.Error()
			}
			for _, n := range r.l.Nodes() {
				if n.Name == lease.Node() {
					return fmt.Sprintf("the arbiter lease is held by the standby replica on %s", n.Name)
				}
			}
		}
	}
	return ""
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
