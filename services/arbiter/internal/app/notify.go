package app

import (
	"context"
	"encoding/json"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/daemon"
	"github.com/fanpbx/fan/services/arbiter/internal/lease"
	"github.com/fanpbx/fan/services/arbiter/internal/notify"
)

// runNotify adds the notify hooks to the run group when any is configured.
// They read the audit stream through a watch of their own and run only
// while this replica holds the lease (see notify.Notifier): nothing the
// decision loop does waits for them.
func (s *Service) runNotify(ctx context.Context, g *daemon.Group, rt *daemon.Runtime, l *lease.Lease) error {
	if len(s.cfg.Notify.Hooks) == 0 {
		return nil
	}
	groups := s.cfg.notifyGroups()
	// Best effort, and bounded as a whole: without it the claim or the
	// decision names the previous holder.
	kctx, cancel := context.WithTimeout(ctx, time.Second)
	for i := range groups {
		groups[i].Holder = s.knownHolder(kctx, groups[i].Name)
	}
	cancel()
	n, err := notify.New(s.cfg.Notify, notify.Options{Cluster: s.cfg.Cluster, Agent: "fan-arbiter/" + s.version,
		Groups: groups, Leading: l.Leading, Log: s.log, Metrics: rt.Metrics})
	if err != nil {
		return err
	}
	g.Go("notify", func(ctx context.Context) error { return n.Run(ctx, rt.Bus.Watch) })
	return nil
}

// notifyGroups tells the notifier which checks each group decides on.
func (c *Config) notifyGroups() []notify.Group {
	out := make([]notify.Group, len(c.Groups))
	for i, g := range c.Groups {
		var hf map[string]notify.HealthSource
		for n, hs := range g.HealthFrom {
			if hf == nil {
				hf = map[string]notify.HealthSource{}
			}
			hf[n] = notify.HealthSource{Observer: hs.Observer, Check: hs.Check}
		}
		out[i] = notify.Group{Name: g.Name, Nodes: g.Nodes, HealthCheck: g.HealthCheck, PeerChecks: g.PeerChecks, HealthFrom: hf}
	}
	return out
}

// knownHolder is the holder the group status names, so that the first
// holder change told after a start names the previous holder.
func (s *Service) knownHolder(ctx context.Context, group string) string {
	e, err := s.kv.Get(ctx, events.GroupStatusKey(s.cfg.Cluster, group))
	if err != nil {
		return ""
	}
	var st events.GroupStatus
	if json.Unmarshal(e.Value(), &st) != nil {
		return ""
	}
	return st.Holder
}
