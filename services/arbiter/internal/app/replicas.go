package app

import (
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
)

// replicaPresence tracks which arbiter replicas this one hears, from the
// presence every replica announces on core NATS (presenceEvery), and
// exports it: fan_arbiter_replica_up{node} for each replica configured
// (replicas) or heard since start, and fan_arbiter_replicas_expected.
//
// Presence, and not the lease records or NATS service discovery, because
// it is already there for every replica, heard within presenceDeadAfter,
// and says the same whether the replica's process or its whole host is
// gone: no announcement arrives. A replica hears its own presence back
// through its server, so one cut off from the bus reports itself down too.
type replicaPresence struct {
	expected []string
	now      func() time.Time

	mu   sync.Mutex
	last map[string]time.Time

	up, count *prometheus.Desc
}

func newReplicaPresence(expected []string, now func() time.Time) *replicaPresence {
	return &replicaPresence{expected: slices.Clone(expected), now: now, last: map[string]time.Time{},
		up: prometheus.NewDesc("fan_arbiter_replica_up",
			"1 while this replica hears the arbiter replica's presence (every 250 ms, gone after 1 s of silence), 0 while not; "+
				"every replica named in replicas, and any other heard since start.", []string{"node"}, nil),
		count: prometheus.NewDesc("fan_arbiter_replicas_expected",
			"The arbiter replicas the configuration names (replicas); absent when it names none.", nil, nil),
	}
}

func (r *replicaPresence) heard(node string) {
	r.mu.Lock()
	r.last[node] = r.now()
	r.mu.Unlock()
}

// alive reports each replica known (configured or heard) and whether it is
// heard now.
func (r *replicaPresence) alive() map[string]bool {
	now := r.now()
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]bool{}
	for _, n := range r.expected {
		out[n] = false
	}
	for n, at := range r.last {
		out[n] = now.Sub(at) <= presenceDeadAfter
	}
	return out
}

func (r *replicaPresence) Describe(ch chan<- *prometheus.Desc) {
	ch <- r.up
	ch <- r.count
}

func (r *replicaPresence) Collect(ch chan<- prometheus.Metric) {
	alive := r.alive()
	for _, n := range slices.Sorted(maps.Keys(alive)) {
		ch <- prometheus.MustNewConstMetric(r.up, prometheus.GaugeValue, b2f(alive[n]), n)
	}
	if len(r.expected) > 0 {
		ch <- prometheus.MustNewConstMetric(r.count, prometheus.GaugeValue, float64(len(r.expected)))
	}
}

// watchReplicas feeds r with every replica's presence, this one's included.
func (s *Service) watchReplicas(b *bus.Bus, r *replicaPresence) (stop func(), err error) {
	sub, err := b.NC.Subscribe(events.AllArbiterPresence(s.cfg.Cluster), func(m *nats.Msg) {
		a, err := events.DecodeArbiterPresence(m.Data)
		if err != nil || m.Subject != events.ArbiterPresenceSubject(s.cfg.Cluster, a.Node) {
			return
		}
		r.heard(a.Node)
	})
	if err != nil {
		return nil, err
	}
	return func() { _ = sub.Unsubscribe() }, nil
}
