package bus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
)

// MetaGroup names the JetStream meta group (which creates every stream and
// consumer) in the group label of the raft gauges.
const MetaGroup = "meta"

// peerActiveWithin: a raft peer heard from within this long is a server
// that runs, even while it catches up (not current).
const peerActiveWithin = 10 * time.Second

// serversAnswerWithin is how long a ping of every server through the
// system account collects answers.
const serversAnswerWithin = time.Second

// Peers exports what fan's redundancy on the bus rests on: for each raft
// group (each of fan's streams, the meta group with a system account) how
// many peers it should have and how many are current; whether each NATS
// server is up; and, with a system account, when each server's TLS
// certificates expire. Usage reads it beside the streams' sizes.
type Peers struct {
	// known are the groups read once at least (only the reading goroutine
	// uses it): a group never read has no figures to contradict.
	known             map[string]bool
	expected, current *prometheus.GaugeVec
	serverUp          *prometheus.GaugeVec
	certNotAfter      *prometheus.GaugeVec
}

func newPeers() *Peers {
	return &Peers{
		known: map[string]bool{},
		expected: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "fan_raft_peers",
			Help: "Peers a raft group should have: a stream's replicas, the meta group's cluster size."}, []string{"group"}),
		current: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "fan_raft_peers_current",
			Help: "Peers of the raft group that are current: its leader and every replica seen recently and caught up; 0 while the group cannot be read (no leader)."},
			[]string{"group"}),
		serverUp: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "fan_nats_server_up",
			Help: "1 while the NATS server leads or is an active peer of one of fan's raft groups (or answers through the system account); 0 while the groups count it offline or silent."},
			[]string{"server"}),
		certNotAfter: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "fan_nats_cert_not_after_timestamp_seconds",
			Help: "When the NATS server's TLS certificate expires (Unix time), by listener (client, cluster); read through the system account."},
			[]string{"server", "listener"}),
	}
}

// Collectors are the gauges.
func (p *Peers) Collectors() []prometheus.Collector {
	return []prometheus.Collector{p.expected, p.current, p.serverUp, p.certNotAfter}
}

// servers gathers what one read learnt of each server: up wins over down.
type servers map[string]bool

func (s servers) saw(name string, up bool) {
	if name == "" {
		return
	}
	s[name] = s[name] || up
}

// group records one raft group's figures and its peers' states.
func (p *Peers) group(name string, expected int, ci *jetstream.ClusterInfo, seen servers) {
	current := 0
	if ci == nil {
		// A server without clustering: the one server is the group.
		current = 1
	} else {
		if ci.Leader != "" {
			current++
			seen.saw(ci.Leader, true)
		}
		for _, r := range ci.Replicas {
			if r == nil {
				continue
			}
			if r.Current && !r.Offline {
				current++
			}
			seen.saw(r.Name, !r.Offline && r.Active <= peerActiveWithin)
		}
	}
	p.known[name] = true
	p.expected.WithLabelValues(name).Set(float64(expected))
	p.current.WithLabelValues(name).Set(float64(current))
}

// unreadable records a group that did not answer: none of its peers is
// known to be current. Its expected count stays as last read; a group
// never read (not provisioned yet, a server without clustering has no meta
// group) gets no figures.
func (p *Peers) unreadable(name string) {
	if p.known[name] {
		p.current.WithLabelValues(name).Set(0)
	}
}

// record publishes what one read learnt of the servers, replacing the last
// read's list (a server removed from the cluster disappears).
func (p *Peers) record(seen servers) {
	if len(seen) == 0 {
		return
	}
	p.serverUp.Reset()
	for name, up := range seen {
		v := 0.0
		if up {
			v = 1
		}
		p.serverUp.WithLabelValues(name).Set(v)
	}
}

// MetaInfo is the meta group as its leader sees it.
type MetaInfo struct {
	Cluster *jetstream.ClusterInfo
	// Size is the cluster's known size (its servers with JetStream).
	Size int
}

// jszReply is the part of a server's JetStream report that names the meta
// group's leader and, as that leader sees them, its peers.
type jszReply struct {
	Server struct {
		Name string `json:"name"`
	} `json:"server"`
	Data struct {
		Meta *struct {
			Leader   string                `json:"leader"`
			Replicas []*jetstream.PeerInfo `json:"replicas"`
			Size     int                   `json:"cluster_size"`
		} `json:"meta_cluster"`
	} `json:"data"`
}

// MetaCluster asks every server for its JetStream report through the system
// account connection sys and keeps the meta leader's own: only the leader
// knows how recently it heard each peer.
func MetaCluster(ctx context.Context, sys *nats.Conn) (MetaInfo, error) {
	var out MetaInfo
	err := pingServers(ctx, sys, events.JSServerPingJSZ, []byte(`{"leader_only":true}`), func(data []byte) bool {
		var r jszReply
		if json.Unmarshal(data, &r) != nil || r.Data.Meta == nil || r.Data.Meta.Leader == "" || r.Data.Meta.Leader != r.Server.Name {
			return false
		}
		out = MetaInfo{Cluster: &jetstream.ClusterInfo{Leader: r.Data.Meta.Leader, Replicas: r.Data.Meta.Replicas}, Size: r.Data.Meta.Size}
		return true
	})
	if err != nil {
		return MetaInfo{}, fmt.Errorf("meta info: %w", err)
	}
	if out.Cluster == nil {
		return MetaInfo{}, errors.New("meta info: no answer from the meta leader")
	}
	return out, nil
}

// varzReply is the part of a server's general report that names it and
// says when its certificates expire.
type varzReply struct {
	Server struct {
		Name string `json:"name"`
	} `json:"server"`
	Data struct {
		TLSCertNotAfter time.Time `json:"tls_cert_not_after"`
		Cluster         struct {
			TLSCertNotAfter time.Time `json:"tls_cert_not_after"`
		} `json:"cluster"`
	} `json:"data"`
}

// pingServers publishes a request every server answers and hands each
// answer to take until take says it has what it wanted or the answers stop
// coming (serversAnswerWithin).
func pingServers(ctx context.Context, sys *nats.Conn, subject string, body []byte, take func([]byte) bool) error {
	inbox := sys.NewRespInbox()
	replies := make(chan *nats.Msg, 16)
	sub, err := sys.ChanSubscribe(inbox, replies)
	if err != nil {
		return err
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := sys.PublishRequest(subject, inbox, body); err != nil {
		return err
	}
	t := time.NewTimer(serversAnswerWithin)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
			return nil
		case m := <-replies:
			if take(m.Data) {
				return nil
			}
		}
	}
}

// readServers reads the meta group and every server's report through the
// system account.
func (p *Peers) readServers(ctx context.Context, sys *nats.Conn, seen servers) error {
	var errs []error
	if meta, err := MetaCluster(ctx, sys); err != nil {
		p.unreadable(MetaGroup)
		errs = append(errs, err)
	} else {
		p.group(MetaGroup, meta.Size, meta.Cluster, seen)
	}
	err := pingServers(ctx, sys, events.JSServerPingVarz, nil, func(data []byte) bool {
		var r varzReply
		if json.Unmarshal(data, &r) != nil || r.Server.Name == "" {
			return false
		}
		seen.saw(r.Server.Name, true)
		for listener, at := range map[string]time.Time{"client": r.Data.TLSCertNotAfter, "cluster": r.Data.Cluster.TLSCertNotAfter} {
			if !at.IsZero() {
				p.certNotAfter.WithLabelValues(r.Server.Name, listener).Set(float64(at.Unix()))
			}
		}
		return false
	})
	if err != nil {
		errs = append(errs, fmt.Errorf("server reports: %w", err))
	}
	return errors.Join(errs...)
}
