package app

import (
	"context"
	"slices"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/daemon"
	"github.com/fanpbx/fan/services/arbiter/internal/decide"
)

// defaultTickEvery drives the core's timers that no input announces
// (stability, settle, backoff expiry). A holder's silence and a claim's
// deadline do not wait for it: the loop also ticks at the instant the core
// names (Core.Wake). It does not delay a health transition, which is
// handled as it arrives. A tick costs microseconds per group.
const defaultTickEvery = 25 * time.Millisecond

// maxBatch bounds the inputs decided in one round before their state is
// persisted and their commands published, so a flood of inputs cannot hold
// the first one's commands back for long.
const maxBatch = 256

// run serves the HTTP heartbeats, hands the actors to a run group and
// decides until ctx ends or an actor does.
//
// Every actor is essential: an arbiter whose watch ended would hold the
// lease deciding on nothing, so any of them ending ends the service, and
// systemd restarts it. They are added in the order they stop
// (daemon.Group): the decision loop ends first, then the inputs (watches,
// registry, weights), and the lease last, so nothing is decided under a
// lease already given up. The presence announcer, the leader steward and
// the usage report run beside them until the group begins to stop.
func (a *arbiter) run(ctx context.Context) error {
	stopHeartbeats, err := a.serveHTTPHeartbeats()
	if err != nil {
		return err
	}
	defer stopHeartbeats()
	g, ctx := daemon.NewGroup(ctx)
	defer a.startCompanions(ctx)()
	a.addActors(ctx, g)
	return a.decide(ctx, g)
}

// serveHTTPHeartbeats starts the HTTP heartbeat endpoint when one is
// configured, and returns what stops it.
func (a *arbiter) serveHTTPHeartbeats() (stop func(), err error) {
	hh := a.cfg.HTTPHeartbeat
	if hh.Listen == "" {
		return func() {}, nil
	}
	a.rt.Certs.Add(daemon.CertFile{Role: "http_heartbeat", Path: hh.TLS.Cert})
	return a.serveHeartbeats(hh, a.bus.Emit, a.rt.Metrics)
}

// startCompanions starts what runs beside the actors until ctx ends, and
// returns what waits for it: presence, the steward and the usage report.
func (a *arbiter) startCompanions(ctx context.Context) (wait func()) {
	presenceDone := make(chan struct{})
	go func() { a.announcePresence(ctx, a.bus); close(presenceDone) }()
	stewardDone := a.runSteward(ctx, a.rt, a.sys)
	usageDone := a.runUsage(ctx, a.rt, a.sys)
	return func() {
		usageDone()
		stewardDone()
		<-presenceDone
	}
}

// addActors adds the inputs, the registry, the hold's keepers, the status
// writer, the weights, the notify hooks and the lease, in that order.
func (a *arbiter) addActors(ctx context.Context, g *daemon.Group) {
	toCore := a.toCore(ctx)
	// The inputs are read from the start announcement on, not from when
	// the watch's consumers happen to exist (on a loaded host, a second
	// later): nothing published meanwhile is missed, and a replay that
	// begins at the announcement (fanctl replay) feeds exactly what
	// this replica read.
	g.Go("watch", func(ctx context.Context) error {
		return a.watchInputs(ctx, bus.WatchOptions{Since: a.rt.Announced(), Subjects: []string{
			events.AllHealth(a.cfg.Cluster), events.AllHeartbeats(a.cfg.Cluster),
			events.AllCommandResults(a.cfg.Cluster), events.AllReplication(a.cfg.Cluster),
			// The replicators' calls summaries: what a planned move
			// waits for, and what a move away from a holder records.
			events.AllCallsSummaries(a.cfg.Cluster),
		}}, toCore)
	})
	// A permit in force was published up to the scheduler's tick_every
	// ago: start from each group's last one, or a restarted arbiter would
	// not fail back inside an open window until the next tick.
	g.Go("watch_permits", func(ctx context.Context) error {
		return a.bus.Watch(ctx, bus.WatchOptions{Subjects: []string{events.AllPermits(a.cfg.Cluster)}, LastPerSubject: true}, toCore)
	})
	g.Go("registry", a.runRegistry)
	// Every replica follows the leaders hold (a standby that leads
	// keeps the lease while it holds); the leader ends it at its end.
	g.Go("watch_hold", func(ctx context.Context) error {
		return a.bus.WatchKV(ctx, []string{events.LeadersHoldKey(a.cfg.Cluster)}, a.hold.onKey)
	})
	g.Go("hold_keeper", func(ctx context.Context) error { a.runHoldKeeper(ctx); return nil })
	g.Go("status", func(ctx context.Context) error { a.status.run(ctx); return nil })
	g.Go("weights", func(ctx context.Context) error {
		if !slices.ContainsFunc(a.cfg.Groups, func(g GroupConfig) bool { return g.Weights.Enabled }) {
			<-ctx.Done() // nothing to track: runWeights returns at once
			return nil
		}
		a.runWeights(ctx)
		return nil
	})
	if a.notifier != nil {
		g.Go("notify", func(ctx context.Context) error { return a.notifier.Run(ctx, a.bus.Watch) })
	}
	g.Go("lease", func(ctx context.Context) error { a.lease.Run(ctx, a.changes); return nil })
}

// toCore queues an input for the decision loop until the group stops.
func (a *arbiter) toCore(ctx context.Context) bus.EventHandler {
	return func(env events.Envelope, p events.Decoded, _ uint64) {
		select {
		case a.inputs <- input{env: env, p: p}:
		case <-ctx.Done():
		}
	}
}

// decide is the decision loop: the one goroutine that drives the core. It
// returns, once ctx ends, what ended the group.
func (a *arbiter) decide(ctx context.Context, g *daemon.Group) error {
	t := time.NewTicker(a.cfg.Policy.TickEvery.D())
	defer t.Stop()
	wake := newWakeTimer()
	defer wake.stop()
	// The watchdog counts the decision loop alive while it ticks; a
	// loop stuck in a publish for seconds is worth a restart.
	alive := a.rt.Loop("decide", 10*time.Second)
	defer alive.Done()
	for {
		select {
		case <-ctx.Done():
			// The lease's last change (stepping down) may still be
			// queued; nobody needs it now.
			go func() {
				for range a.changes {
				}
			}()
			return g.Wait()
		case in := <-a.inputs:
			now := time.Now()
			a.decideInputs(ctx, now, in)
			wake.rearm(a.core, now)
		case b := <-a.beacons:
			now := time.Now()
			out := a.core.Beacon(now, b)
			a.execute(ctx, out)
			// A beacon moves only its node's silence limit, and later:
			// an armed timer then fires early at worst and re-arms.
			// Re-arming walks every group, which at ten beacons a
			// second per node is the loop's largest cost; a beacon
			// that decided something, or no timer armed, re-arms.
			if wake.armed.IsZero() || len(out.Emits) > 0 {
				wake.rearm(a.core, now)
			}
		case m := <-a.ops:
			a.operate(ctx, m)
			wake.rearm(a.core, time.Now())
		case ch, ok := <-a.changes:
			if ok {
				a.leadership(ctx, ch)
				wake.rearm(a.core, time.Now())
			}
		case <-wake.t.C:
			wake.armed = time.Time{}
			a.heard(ctx)
			now := time.Now()
			a.execute(ctx, a.core.Tick(now))
			a.tickedAt.Store(now.UnixNano())
			wake.rearm(a.core, now)
		case now := <-t.C:
			alive.Alive()
			a.retryStuck(ctx, now)
			a.heard(ctx)
			a.execute(ctx, a.core.Tick(now))
			a.tickedAt.Store(now.UnixNano())
			a.publishStatus(now)
			wake.rearm(a.core, now)
		}
	}
}

// decideInputs decides in, and with it the inputs already waiting (group
// commit): their state is persisted once before any of their commands
// leaves. Persisting and publishing the status walk every group, so one
// round per input made a burst (a thousand nodes starting) cost groups
// squared.
func (a *arbiter) decideInputs(ctx context.Context, now time.Time, in input) {
	a.state.observed(in.p, a.commanding())
	out := a.core.Handle(now, in.env, in.p)
	for range maxBatch - 1 {
		select {
		case in = <-a.inputs:
			a.state.observed(in.p, a.commanding())
			out.Emits = append(out.Emits, a.core.Handle(now, in.env, in.p).Emits...)
			continue
		default:
		}
		break
	}
	a.execute(ctx, out)
}

// heard gives the core every beacon already received before a tick
// judges silence: select picks among ready cases at random, and on a
// busy host a beacon that came in time can sit in the channel while
// the timer fires; judged without it, a live holder looks silent.
func (a *arbiter) heard(ctx context.Context) {
	for {
		select {
		case b := <-a.beacons:
			a.execute(ctx, a.core.Beacon(time.Now(), b))
		default:
			return
		}
	}
}

// wakeTimer ticks the core once more at the moment it named (Core.Wake):
// the end of a holder's silence limit, a claim's deadline. It is re-armed
// after every input, since a beacon moves the holder's.
type wakeTimer struct {
	t     *time.Timer
	armed time.Time // zero: not armed
}

func newWakeTimer() *wakeTimer { return &wakeTimer{t: time.NewTimer(time.Hour)} }

func (w *wakeTimer) rearm(core *decide.Core, now time.Time) {
	at := core.Wake(now)
	if at.Equal(w.armed) {
		return
	}
	w.armed = at
	if at.IsZero() {
		w.t.Stop()
		return
	}
	w.t.Reset(at.Sub(now))
}

func (w *wakeTimer) stop() { w.t.Stop() }
