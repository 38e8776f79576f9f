package app

import (
	"context"
	"encoding/json"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/services/arbiter/internal/lease"
	"github.com/fanpbx/fan/services/arbiter/internal/notify"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
)

// newNotifier makes the notify hooks' notifier, nil when none is
// configured. It reads the audit stream through a watch of its own and
// runs only while this replica holds the lease (see notify.Notifier):
// nothing the decision loop does waits for it.
func (s *Service) newNotifier(ctx context.Context, kv jetstream.KeyValue, l *lease.Lease, metrics prometheus.Registerer) (*notify.Notifier, error) {
	if len(s.cfg.Notify.Hooks) == 0 {
		return nil, nil
	}
	groups := s.cfg.notifyGroups()
	// Best effort, and bounded as a whole: without it the claim or the
	// decision names the previous holder.
	kctx, cancel := context.WithTimeout(ctx, time.Second)
	for i := range groups {
		groups[i].Holder = knownHolder(kctx, kv, s.cfg.Cluster, groups[i].Name)
	}
	cancel()
	return notify.New(s.cfg.Notify, notify.Options{Cluster: s.cfg.Cluster, Agent: "fan-arbiter/" + s.version,
		Groups: groups, Leading: l.Leading, Log: s.log, Metrics: metrics})
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
func knownHolder(ctx context.Context, kv jetstream.KeyValue, cluster, group string) string {
	e, err := kv.Get(ctx, events.GroupStatusKey(cluster, group))
	if err != nil {
		return ""
	}
	var st events.GroupStatus
	if json.Unmarshal(e.Value(), &st) != nil {
		return ""
	}
	return st.Holder
}
