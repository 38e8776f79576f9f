package app

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/services/arbiter/internal/decide"
	"github.com/prometheus/client_golang/prometheus"
)

// The conditions the arbiter raises (daemon.Conditions): /healthz answers
// 503 while one is up.
const (
	// condRestoreFailed: holding the lease without having restored the
	// term's state (kept up after a release until this replica may
	// campaign again).
	condRestoreFailed = "restore_failed"
	// condStateUnwritable: leading, but decisions cannot be persisted, so
	// nothing is published.
	condStateUnwritable = "state_unwritable"
)

type arbiterMetrics struct {
	restoreFailures prometheus.Counter
	releases        *prometheus.CounterVec
	corrupt         prometheus.Counter
}

func newArbiterMetrics(r prometheus.Registerer) *arbiterMetrics {
	m := &arbiterMetrics{
		restoreFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fan_arbiter_restore_failures_total",
			Help: "Attempts to restore the arbiter state after taking the lease that failed (each is retried).",
		}),
		releases: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fan_arbiter_lease_releases_total",
			Help: "Leases given up because this replica could not command within restore_within, by reason.",
		}, []string{"reason"}),
		corrupt: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fan_arbiter_state_corrupt_total",
			Help: "Arbiter state records that could not be decoded or restored; the state was rebuilt from group status.",
		}),
	}
	r.MustRegister(m.restoreFailures, m.releases, m.corrupt)
	return m
}

// rebuild replaces a corrupt state record with a view rebuilt from what
// the leader also wrote: each group's status (its confirmed holder, the
// term, whether it was frozen, which nodes were in standby). Starting
// from nothing instead would let the new leader place a group that
// already has a holder on a second node. The rebuilt view errs towards
// doing nothing automatically where it is unsure: a group whose status is
// missing or unreadable, which shows no holder, or which was frozen or
// had a node in standby is restored frozen (maintenance), so a human
// decides (`fanctl maintenance off --group G`); a group with a known
// holder and nothing unusual keeps failing over as before. What the
// record alone held is lost: an outstanding claim (its result is then
// ignored), the move history of the flap cap, the last permit (the
// scheduler restates it). The next persist overwrites the corrupt record.
func (a *arbiter) rebuild(ctx context.Context, corrupt error) (decide.State, error) {
	st := decide.State{Cluster: a.cfg.Cluster}
	for _, g := range a.cfg.Groups {
		gs := decide.GroupState{Name: g.Name}
		freeze := func(why string) {
			gs.Maintenance = "arbiter state was corrupt and rebuilt from group status; " + why + ": check the group, then unfreeze it"
		}
		// Through the leader, as the state itself (restore).
		raw, err := a.bus.LeaderGetKV(ctx, events.StateBucket, events.GroupStatusKey(a.cfg.Cluster, g.Name))
		switch {
		case err == nil && raw == nil:
			freeze("no group status")
		case err != nil:
			// Transient: retried like any unreadable state.
			return st, fmt.Errorf("%w; rebuilding: read group status %s: %w", corrupt, g.Name, err)
		default:
			var gst events.GroupStatus
			if err := json.Unmarshal(raw, &gst); err != nil {
				freeze("group status unreadable")
				break
			}
			a.log.Debug("rebuild: group status", "group", g.Name, "status", string(raw))
			if slices.Contains(g.Nodes, gst.Holder) {
				gs.Holder, gs.LastMove = gst.Holder, gst.Since
			}
			st.Epoch = max(st.Epoch, gst.Epoch)
			var standby []string
			for n, ns := range gst.Nodes {
				if ns.Standby {
					standby = append(standby, n)
				}
			}
			switch {
			case gs.Holder == "":
				freeze("no known holder")
			case gst.Frozen != "":
				freeze("it was frozen: " + gst.Frozen)
			case len(standby) > 0:
				slices.Sort(standby)
				freeze(fmt.Sprintf("nodes in standby: %v", standby))
			}
		}
		st.Groups = append(st.Groups, gs)
	}
	if err := a.core.Restore(st); err != nil {
		return st, fmt.Errorf("%w; rebuilding: %w", corrupt, err)
	}
	a.metrics.corrupt.Inc()
	a.log.Error("arbiter state record corrupt: rebuilt from group status", "err", corrupt, "groups", len(st.Groups))
	for _, g := range st.Groups {
		a.log.Warn("rebuilt group", "group", g.Name, "holder", g.Holder, "frozen", g.Maintenance)
	}
	return st, nil
}
