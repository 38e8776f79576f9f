package stack

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/poll"
)

// PoolPhase is one stretch of the pool scenario and the calls each node
// received in it.
type PoolPhase struct {
	Name     string
	From, To time.Time
	Calls    map[string]int
}

// Total is the phase's calls.
func (p PoolPhase) Total() int {
	n := 0
	for _, c := range p.Calls {
		n += c
	}
	return n
}

// Share is node's part of the phase's calls.
func (p PoolPhase) Share(node string) float64 {
	if t := p.Total(); t > 0 {
		return float64(p.Calls[node]) / float64(t)
	}
	return 0
}

// PoolReport is what the pool scenario saw.
type PoolReport struct {
	OfflineAfter, Resync time.Duration
	// Silent is the node whose heartbeats stop, Loaded the one that
	// reports high CPU.
	Silent, Loaded string
	// When the silent node stopped posting, when the registry called it
	// offline (the node.presence event), when Kamailio showed it disabled;
	// when it posted again, was online, was enabled again, and its first
	// call after that.
	SilentAt, OfflineAt, DisabledAt      time.Time
	BackAt, OnlineAt, EnabledAt, FirstIn time.Time
	// When the loaded node reported high CPU, when the arbiter published
	// weights that rank it lower, and when Kamailio held them.
	LoadAt, WeightsAt, AppliedAt time.Time
	// Weights is the set applied after the load.
	Weights map[string]int
	Phases  []PoolPhase
	// AfterOffline are the calls that reached the silent node after the
	// offline decision plus one resync of the dispatcher executor.
	AfterOffline []Call
	Calls        []Call
	Trail        []Event
}

// ExpectedShare is node's share of calls the applied weights give.
func (r PoolReport) ExpectedShare(node string) float64 {
	sum := 0
	for _, w := range r.Weights {
		sum += w
	}
	if sum == 0 {
		return 0
	}
	return float64(r.Weights[node]) / float64(sum)
}

// Phase returns the phase of that name.
func (r PoolReport) Phase(name string) PoolPhase {
	for _, p := range r.Phases {
		if p.Name == name {
			return p
		}
	}
	return PoolPhase{}
}

// Names of the pool scenario's phases.
const (
	PhaseAll          = "all three post heartbeats"
	PhaseSilent       = "n3 silent, not offline yet"
	PhaseOffline      = "n3 offline"
	PhaseBack         = "n3 back"
	PhaseLoadedBefore = "n2 at high CPU, weights not yet applied"
	PhaseLoaded       = "n2 at high CPU, weights applied"
)

// dispatcherWatch reads the dispatcher set every 100 ms and tells its
// changes.
type dispatcherWatch struct {
	mu      sync.Mutex
	last    map[string]Destination
	changed chan struct{}
}

func (w *dispatcherWatch) run(ctx context.Context, p *Pool, r Reporter) {
	for ctx.Err() == nil {
		set, err := p.Dispatcher(ctx)
		if err == nil {
			w.mu.Lock()
			for _, n := range PoolNodes {
				if old, d := w.last[n], set[n]; old != d {
					r.Line(time.Now(), "kamailio@kam", fmt.Sprintf("%s %s flags %s rweight %d", n, d.URI, d.Flags, d.RWeight))
				}
			}
			w.last = set
			close(w.changed)
			w.changed = make(chan struct{})
			w.mu.Unlock()
		}
		sleepCtx(ctx, 100*time.Millisecond)
	}
}

// wait returns when cond holds over the set, and when it was seen.
func (w *dispatcherWatch) wait(ctx context.Context, within time.Duration, what string, cond func(map[string]Destination) bool) (time.Time, error) {
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	for {
		w.mu.Lock()
		ok, ch := w.last != nil && cond(w.last), w.changed
		w.mu.Unlock()
		if ok {
			return time.Now(), nil
		}
		select {
		case <-ctx.Done():
			return time.Time{}, fmt.Errorf("kamailio's set: waiting for %s: %w", what, ctx.Err())
		case <-ch:
		}
	}
}

func weightsAre(w map[string]int) func(map[string]Destination) bool {
	return func(set map[string]Destination) bool {
		for _, n := range PoolNodes {
			if set[n].RWeight != w[n] {
				return false
			}
		}
		return true
	}
}

// RunPoolScenario runs the pool lab's story with a caller placing calls
// throughout: n3's heartbeats stop, the registry calls it offline after
// offline_after and the dispatcher stops sending it calls; it posts again
// and gets calls again; n2 reports high CPU, the arbiter ranks it lower and
// it gets fewer calls, by what the weights say.
func RunPoolScenario(ctx context.Context, p *Pool, r Reporter) (rep PoolReport, err error) {
	rep = PoolReport{OfflineAfter: p.Opts.OfflineAfter, Resync: p.Opts.Resync, Silent: "n3", Loaded: "n2"}
	ctx, cancel := context.WithCancel(ctx)
	tr := newTrail()
	var wg sync.WaitGroup
	defer func() {
		cancel()
		wg.Wait()
		rep.Trail = tr.all()
	}()
	wg.Go(func() {
		_ = p.FollowEvents(ctx, func(e Event) {
			tr.add(e)
			if who, text, ok := PoolEventLine(e); ok {
				r.Line(e.Env.Time, who, text)
			}
		})
	})
	kam := &dispatcherWatch{changed: make(chan struct{})}
	wg.Go(func() { kam.run(ctx, p, r) })

	// Ready: the arbiter published weights for all three, Kamailio holds
	// them, and every node is active.
	we, _, err := tr.wait(ctx, 60*time.Second, "the first weights of all three nodes", 0, func(e Event) bool {
		w, ok := e.Payload.(*events.DispatcherWeights)
		return ok && w.Group == PoolGroup && len(w.Weights) == len(PoolNodes)
	})
	if err != nil {
		return rep, err
	}
	first := we.Payload.(*events.DispatcherWeights).Weights
	if _, err := kam.wait(ctx, 30*time.Second, "every node active with the first weights", func(set map[string]Destination) bool {
		return weightsAre(first)(set) && !slices.ContainsFunc(PoolNodes, func(n string) bool { return !strings.HasPrefix(set[n].Flags, "A") })
	}); err != nil {
		return rep, err
	}
	start := time.Now()
	r.Line(start, "lab", fmt.Sprintf("caller: SIPp on c starts placing %d calls a second through kam", p.Opts.Rate))
	if err := p.StartCalls(); err != nil {
		return rep, err
	}
	defer func() { _ = p.StopCalls() }()
	sleepCtx(ctx, 8*time.Second)

	// n3 falls silent.
	from := tr.len()
	rep.SilentAt = time.Now()
	r.Fault(rep.SilentAt)
	r.Line(rep.SilentAt, "lab", fmt.Sprintf("FAULT: n3 stops posting heartbeats (it still answers calls); registry.offline_after is %v", p.Opts.OfflineAfter))
	if err := p.StopHeartbeats("n3"); err != nil {
		return rep, err
	}
	oe, _, err := tr.wait(ctx, p.Opts.OfflineAfter+15*time.Second, "n3 offline", from, presence("n3", events.PresenceOffline))
	if err != nil {
		return rep, err
	}
	rep.OfflineAt = oe.Env.Time
	if rep.DisabledAt, err = kam.wait(ctx, 10*time.Second, "n3 disabled", func(set map[string]Destination) bool {
		return strings.HasPrefix(set["n3"].Flags, "D")
	}); err != nil {
		return rep, err
	}
	sleepCtx(ctx, 6*time.Second)

	// n3 posts again.
	from = tr.len()
	rep.BackAt = time.Now()
	r.Line(rep.BackAt, "lab", "n3 posts heartbeats again")
	if err := p.StartHeartbeats("n3"); err != nil {
		return rep, err
	}
	ne, _, err := tr.wait(ctx, 15*time.Second, "n3 online", from, presence("n3", events.PresenceOnline))
	if err != nil {
		return rep, err
	}
	rep.OnlineAt = ne.Env.Time
	if rep.EnabledAt, err = kam.wait(ctx, 10*time.Second, "n3 active", func(set map[string]Destination) bool {
		return strings.HasPrefix(set["n3"].Flags, "A")
	}); err != nil {
		return rep, err
	}
	if rep.FirstIn, err = firstCall(ctx, p, "n3", rep.EnabledAt, 10*time.Second); err != nil {
		return rep, err
	}
	r.Line(rep.FirstIn, "lab", fmt.Sprintf("n3 received a call again, %v after it was active", rep.FirstIn.Sub(rep.EnabledAt).Round(time.Millisecond)))
	sleepCtx(ctx, 6*time.Second)

	// n2 is loaded.
	from = tr.len()
	rep.LoadAt = time.Now()
	r.Line(rep.LoadAt, "lab", fmt.Sprintf("n2 reports %.0f%% CPU from its next heartbeat on (the others %.0f%%)", p.Opts.LoadedCPU, p.Opts.IdleCPU))
	if err := p.SetCPU("n2", p.Opts.LoadedCPU); err != nil {
		return rep, err
	}
	le, _, err := tr.wait(ctx, 30*time.Second, "weights ranking n2 lower", from, func(e Event) bool {
		w, ok := e.Payload.(*events.DispatcherWeights)
		return ok && w.Group == PoolGroup && len(w.Weights) == len(PoolNodes) && w.Weights["n2"] < w.Weights["n1"] && w.Weights["n2"] < w.Weights["n3"]
	})
	if err != nil {
		return rep, err
	}
	rep.WeightsAt = le.Env.Time
	rep.Weights = maps.Clone(le.Payload.(*events.DispatcherWeights).Weights)
	if rep.AppliedAt, err = kam.wait(ctx, 15*time.Second, "the new weights", weightsAre(rep.Weights)); err != nil {
		return rep, err
	}
	sleepCtx(ctx, 10*time.Second)
	end := time.Now()
	if err := p.StopCalls(); err != nil {
		return rep, err
	}
	sleepCtx(ctx, 500*time.Millisecond) // the last INVITEs in flight
	if rep.Calls, err = p.Calls(); err != nil {
		return rep, err
	}
	for _, ph := range []struct {
		name     string
		from, to time.Time
	}{
		{PhaseAll, start, rep.SilentAt},
		{PhaseSilent, rep.SilentAt, rep.OfflineAt},
		{PhaseOffline, rep.OfflineAt, rep.BackAt},
		{PhaseBack, rep.EnabledAt, rep.LoadAt},
		{PhaseLoadedBefore, rep.LoadAt, rep.AppliedAt},
		{PhaseLoaded, rep.AppliedAt, end},
	} {
		phase := PoolPhase{Name: ph.name, From: ph.from, To: ph.to, Calls: map[string]int{}}
		for _, c := range rep.Calls {
			if !c.At.Before(ph.from) && c.At.Before(ph.to) {
				phase.Calls[c.Node]++
			}
		}
		rep.Phases = append(rep.Phases, phase)
	}
	limit := rep.OfflineAt.Add(rep.Resync)
	for _, c := range rep.Calls {
		if c.Node == rep.Silent && c.At.After(limit) && c.At.Before(rep.BackAt) {
			rep.AfterOffline = append(rep.AfterOffline, c)
		}
	}
	return rep, nil
}

func presence(node string, p events.Presence) func(Event) bool {
	return func(e Event) bool {
		np, ok := e.Payload.(*events.NodePresence)
		return ok && np.Node == node && np.Presence == p
	}
}

// firstCall waits for the first call node received after since.
func firstCall(ctx context.Context, p *Pool, node string, since time.Time, within time.Duration) (time.Time, error) {
	var at time.Time
	// Each look reads every PBX's log.
	err := poll.Every(ctx, 100*time.Millisecond, within, "a call reaching "+node+" after "+since.Format(time.TimeOnly), func() error {
		calls, err := p.Calls()
		if err != nil {
			return err
		}
		for _, c := range calls {
			if c.Node == node && c.At.After(since) {
				at = c.At
				return nil
			}
		}
		return fmt.Errorf("%d calls, none there", len(calls))
	})
	return at, err
}

// PoolEventLine renders the events the pool scenario tells: presence
// flips, weight sets, the observer's transitions and the arbiter's
// decisions. ok is false for the rest.
func PoolEventLine(e Event) (who, text string, ok bool) {
	who = e.Env.Source.Service + "@" + e.Env.Source.Node
	switch v := e.Payload.(type) {
	case *events.NodePresence:
		return who, fmt.Sprintf("node.presence: %s %s (silent %v, threshold %v)", v.Node, v.Presence,
			time.Duration(v.SilentMS)*time.Millisecond, time.Duration(v.ThresholdMS)*time.Millisecond), true
	case *events.DispatcherWeights:
		var parts []string
		for _, n := range slices.Sorted(maps.Keys(v.Weights)) {
			l := v.Loads[n]
			parts = append(parts, fmt.Sprintf("%s %d (cpu %.0f%%, mem free %.0f%%)", n, v.Weights[n], l.CPUPercent, 100*l.MemFreeShare))
		}
		return who, "dispatcher.weights: " + strings.Join(parts, ", "), true
	case *events.HealthTransition, *events.ArbiterDecision, *events.ClaimIP, *events.ReleaseIP, *events.CommandResult:
		return SiteEventLine(e)
	}
	return "", "", false
}

// PhaseTable renders the phases: per node the calls received, and its share.
func (r PoolReport) PhaseTable() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%-42s %8s", "phase", "length")
	for _, n := range PoolNodes {
		fmt.Fprintf(&b, " %14s", n)
	}
	b.WriteString("\n")
	for _, ph := range r.Phases {
		fmt.Fprintf(&b, "%-42s %7.1fs", ph.Name, ph.To.Sub(ph.From).Seconds())
		for _, n := range PoolNodes {
			fmt.Fprintf(&b, " %5d (%4.1f%%)", ph.Calls[n], 100*ph.Share(n))
		}
		b.WriteString("\n")
	}
	return b.String()
}
