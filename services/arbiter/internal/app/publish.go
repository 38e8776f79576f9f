package app

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/services/arbiter/internal/decide"
)

// statusRefresh rewrites group status at least this often so fanctl shows
// fresh heartbeat ages even when nothing changed.
const statusRefresh = 5 * time.Second

// execute persists, then publishes, what the core decided, and reports
// whether everything was published. State goes to the bucket before
// anything leaves, so a successor never forgets a claim that may already
// be executing, nor an operator's freeze or standby. Commands are published
// here, fenced by the lease, and their failure is the core's to handle
// (claim timeout); decisions and every other record go to the outbox, which
// stores them in order once the audit stream can, without holding up the
// next decision while it elects a leader.
func (a *arbiter) execute(ctx context.Context, out decide.Output) bool {
	if len(out.Emits) == 0 {
		return true
	}
	if err := a.persist(ctx); err != nil {
		a.log.Error("persist arbiter state failed; nothing published", "err", err)
		a.persistFailed(ctx, time.Now(), err)
		return false
	}
	a.persisted()
	ok := true
	src := a.bus.Source()
	for _, e := range out.Emits {
		if !a.publish(ctx, src, e) {
			ok = false
		}
	}
	a.publishStatus(time.Now())
	return ok
}

// publish sends one thing the core decided: a command fenced by the lease,
// anything else through the outbox. It reports whether it was published
// (an invalid event, logged, counts as published: there is nothing to
// retry).
func (a *arbiter) publish(ctx context.Context, src events.Source, e decide.Emit) bool {
	env, err := events.New(src, a.cfg.Cluster, e.Payload, e.Options...)
	if err != nil {
		a.log.Error("core produced an invalid event", "type", e.Payload.EventType(), "err", err)
		return true
	}
	cmd, isCmd := e.Payload.(events.Command)
	if isCmd {
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err = a.lease.PublishCommand(pctx, env, cmd)
		cancel()
	} else {
		err = a.ob.PostEnvelope("", env, e.Payload)
	}
	if isCmd && a.lease.Leading() {
		// While it still leads, a command the bus would not store is
		// the steward's business too (a leaders hold may have to end).
		why := ""
		if err != nil {
			why = fmt.Sprintf("a command could not be stored at %s: %v", time.Now().UTC().Format(time.RFC3339), err)
		}
		a.trouble.set(&a.trouble.command, why)
	}
	if err != nil {
		// An unpublished command is caught by the core's claim timeout.
		a.log.Error("publish failed", "type", env.Type, "event_id", env.ID, "err", err)
		return false
	}
	if d, ok := e.Payload.(events.ArbiterDecision); ok {
		a.state.decided(d)
		a.log.Info("decision", "group", d.Group, "action", d.Action, "from", d.From, "to", d.To, "reason", d.Reason, "event_id", env.ID)
	}
	return true
}

func (a *arbiter) persist(ctx context.Context) error {
	b, err := stateRecord(a.core.Snapshot())
	if err != nil {
		return err
	}
	pctx, cancel := context.WithTimeout(ctx, min(2*time.Second, a.cfg.RestoreWithin.D()))
	defer cancel()
	_, err = a.kv.Put(pctx, events.ArbiterStateKey(a.cfg.Cluster), b)
	return err
}

// stateRecord encodes the state as it is persisted (before every command)
// and recorded at a term's start: without the per-node view, which restore
// ignores and the group status carries. With it, a thousand nodes made the
// record about 2.5 times larger, and re-encoding and storing it on every
// decision outlasted restore_within on a loaded host.
func stateRecord(st decide.State) ([]byte, error) {
	for i := range st.Groups {
		st.Groups[i].Nodes = nil
	}
	return json.Marshal(st)
}

// persistFailed bounds a leader that cannot persist: it publishes nothing
// (a command never leaves without its state), so it retries the write;
// past restore_within it gives the lease up.
func (a *arbiter) persistFailed(ctx context.Context, now time.Time, err error) {
	if !a.lease.Leading() {
		a.unwritable.reset()
		return
	}
	over := a.unwritable.failed(now)
	why := fmt.Sprintf("cannot persist decisions since %s: %v", a.unwritable.since.UTC().Format(time.RFC3339Nano), err)
	a.conds.Raise(condStateUnwritable, why)
	a.trouble.set(&a.trouble.persist, why)
	if over {
		a.log.Error("cannot persist arbiter state within restore_within; releasing the lease",
			"restore_within", a.cfg.RestoreWithin.D().String(), "err", err)
		a.giveUp(ctx, now, "state_unwritable")
	}
}

func (a *arbiter) persisted() {
	if a.unwritable.failing() {
		a.log.Info("arbiter state persisted again")
	}
	a.trouble.set(&a.trouble.persist, "")
	a.unwritable.reset()
	if a.releasedUntil.IsZero() {
		a.conds.Clear(condStateUnwritable)
	}
}

// publishStatus hands the core's view to the metrics and, on the leader,
// to the group status: one snapshot for both.
func (a *arbiter) publishStatus(now time.Time) {
	snap := a.core.Snapshot()
	a.writeStatus(snap, now)
	a.state.publish(snap, a.commanding())
}

// writeStatus publishes each group's status for fanctl and for executors
// restarting, when it changed or has grown stale. Only the leader writes,
// through the status writer (the loop never waits for the bucket).
func (a *arbiter) writeStatus(snap decide.State, now time.Time) {
	if !a.commanding() {
		return
	}
	refresh := now.Sub(a.statusAt) >= statusRefresh
	for i, g := range snap.Groups {
		st := events.GroupStatus{Group: g.Name, Addresses: a.cfg.Groups[i].Addresses, Holder: g.Holder, Epoch: snap.Epoch,
			Since: g.LastMove, Nodes: map[string]events.NodeStatus{}, Frozen: g.Frozen, Situation: g.Situation, NeedsHuman: g.NeedsHuman, MovesLastHour: movesWithin(g.Moves, now)}
		if g.Permit != nil && now.Before(g.Permit.ValidUntil) && !now.Before(g.Permit.ValidFrom) {
			st.PermitUntil = g.Permit.ValidUntil
		}
		if p := g.Planned; p != nil {
			st.Planned = &events.PlannedStatus{PlannedFacts: p.PlannedFacts, GaveUp: p.GaveUp}
		}
		st.Pin = decide.PinStatus(g)
		for prio, n := range g.Nodes {
			st.Nodes[n.Node] = events.NodeStatus{Health: n.Health, HealthSince: n.HealthSince, LastHeartbeat: n.LastHeartbeat, Silent: n.Silent, Priority: prio,
				Standby: n.Standby, Eligible: n.Eligible}
		}
		if !refresh && sameStatus(a.lastStatus[g.Name], st) {
			continue
		}
		st.UpdatedAt = now
		a.status.post(st)
		a.lastStatus[g.Name] = st
	}
	if refresh {
		a.statusAt = now
	}
}

func movesWithin(moves []time.Time, now time.Time) int {
	n := 0
	for _, m := range moves {
		if now.Sub(m) < time.Hour {
			n++
		}
	}
	return n
}

// sameStatus ignores heartbeat times, which change every second. It runs
// for every group at every tick, so it compares the nodes in place rather
// than comparing copies (which was most of what the arbiter allocated).
func sameStatus(a, b events.GroupStatus) bool {
	if len(a.Nodes) != len(b.Nodes) {
		return false
	}
	for n, x := range a.Nodes {
		y, ok := b.Nodes[n]
		x.LastHeartbeat, y.LastHeartbeat = time.Time{}, time.Time{}
		if !ok || x != y {
			return false
		}
	}
	a.UpdatedAt, b.UpdatedAt = time.Time{}, time.Time{}
	a.Nodes, b.Nodes = nil, nil
	return reflect.DeepEqual(a, b)
}
