package bus

import (
	"context"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
)

// Usage exports how full each of fan's streams and buckets is, so that an
// alert fires before a byte limit makes one discard its oldest messages:
// fan_stream_bytes, fan_stream_max_bytes (-1 where the stream has no byte
// limit) and fan_stream_messages, labelled by stream. From the same reads
// it exports the streams' raft peers and the servers' state (Peers); with
// System set, the meta group and every server's certificates too.
type Usage struct {
	bytes, maxBytes, msgs *prometheus.GaugeVec
	peers                 *Peers
	// System, when set, is a connection to the system account: the meta
	// group and the servers' own reports are read through it.
	System *nats.Conn
}

// NewUsage makes the gauges; register Collectors with the service's registry.
func NewUsage() *Usage {
	g := func(name, help string) *prometheus.GaugeVec {
		return prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, []string{"stream"})
	}
	return &Usage{
		bytes:    g("fan_stream_bytes", "Bytes a fan stream (or the stream of a bucket) holds on each server with a replica."),
		maxBytes: g("fan_stream_max_bytes", "The stream's byte limit, at which it discards its oldest messages; -1 when it has none."),
		msgs:     g("fan_stream_messages", "Messages a fan stream holds."),
		peers:    newPeers(),
	}
}

// Collectors are the gauges.
func (u *Usage) Collectors() []prometheus.Collector {
	return append([]prometheus.Collector{u.bytes, u.maxBytes, u.msgs}, u.peers.Collectors()...)
}

// UsageEvery is how often Report reads the streams' sizes: a stream nears
// its limit over days, and each read is one small request per stream.
const UsageEvery = 30 * time.Second

// Report reads every stream's size now and then every `every` until ctx
// ends. A stream it cannot read (not provisioned yet, no leader) keeps its
// last figures.
func (b *Bus) Report(ctx context.Context, u *Usage, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		b.ReadUsage(ctx, u)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// ReadUsage reads every stream's size and raft peers once (and, with
// u.System, the meta group and the servers' reports).
func (b *Bus) ReadUsage(ctx context.Context, u *Usage) {
	seen := servers{}
	for _, name := range Streams() {
		ictx, cancel := context.WithTimeout(ctx, 2*time.Second)
		st, err := b.JS.Stream(ictx, name)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			// No leader answered (or the stream is not provisioned yet):
			// no peer of it is known to be current.
			u.peers.unreadable(name)
			b.log.Debug("stream size unavailable", "stream", name, "err", err)
			continue
		}
		info := st.CachedInfo()
		u.bytes.WithLabelValues(name).Set(float64(info.State.Bytes))
		u.maxBytes.WithLabelValues(name).Set(float64(info.Config.MaxBytes))
		u.msgs.WithLabelValues(name).Set(float64(info.State.Msgs))
		u.peers.group(name, info.Config.Replicas, info.Cluster, seen)
	}
	if u.System != nil {
		if err := u.peers.readServers(ctx, u.System, seen); err != nil && ctx.Err() == nil {
			b.log.Debug("servers' reports incomplete", "err", err)
		}
	}
	if ctx.Err() == nil {
		u.peers.record(seen)
	}
}
