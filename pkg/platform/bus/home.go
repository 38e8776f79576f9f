package bus

import (
	"context"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fanpbx/fan/pkg/events"
)

// homeEvery is how often a connection on a server other than bus.url's
// first looks whether one it prefers is back.
var homeEvery = 10 * time.Second

// homeFirstLook is how often the connection looks during the first
// homeEvery after a reconnect; from then on it looks every homeEvery. A
// restarted server takes a few seconds to answer for the state bucket, and
// until the look that sees it the connection may sit on a server it must
// not stay on: in the colocated chaos the witness's arbiter, moved to a PBX
// host's server when its own was killed for a second, stayed there 15 s at
// one look every 10 s, lost the bus with that host's link cut 10 s after
// the kill, and with it the lease in the middle of the failover.
var homeFirstLook = time.Second

// homeProbeTimeout bounds one look at a preferred server: the dial, the
// login and one JetStream request.
const homeProbeTimeout = 2 * time.Second

// home brings the connection back to the server it prefers once that one
// answers again. Without it a service that moved to the next server (its
// own was killed or restarted) stayed there for good: in the colocated
// chaos the witness's arbiter was left on a PBX host's server, lost the bus
// with that host's link, and the lease changed term in the middle of the
// very failover the link cut called for.
//
// A preferred server counts as back only when, on a connection of its
// own, it answers for the state bucket's stream (which needs the stream's
// raft leader): a server that is up but cut off from the cluster is no
// place to return to. The move itself is a reconnect that the order
// (serverOrder.move) sends to that server; should its dial fail, the
// order's usual choice follows.
func (b *Bus) home(order *serverOrder, auth []nats.Option, stop <-chan struct{}) {
	// Even the first connection may have landed on a server it prefers
	// less (its own was down when the service started).
	every, first := homeEvery, min(homeFirstLook, homeEvery)
	moved := time.Now()
	next := func() time.Duration {
		if time.Since(moved) < every {
			return first
		}
		return every
	}
	t := time.NewTimer(next())
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-b.homeWake:
			moved = time.Now()
			t.Reset(next())
			continue
		case <-t.C:
		}
		t.Reset(next())
		if !b.NC.IsConnected() {
			continue // the reconnect in progress follows the order anyway
		}
		cur := serverHost(b.NC.ConnectedUrl())
		rank := order.rank(cur, len(order.prefer))
		for i := 0; i < rank && i < len(order.urls); i++ {
			if !probeServer(order.urls[i], auth) {
				continue
			}
			b.log.Info("bus: a preferred server answers again; moving back to it",
				"from", cur, "to", order.prefer[i])
			cancel := order.move(order.prefer[i])
			if err := b.NC.ForceReconnect(); err != nil {
				cancel()
				b.log.Warn("bus: reconnect to the preferred server failed", "err", err)
			}
			break
		}
		b.homeLooks.Add(1)
	}
}

// probeServer says whether url takes this identity's login and answers for
// the state bucket's stream.
func probeServer(url string, auth []nats.Option) bool {
	opts := append([]nats.Option{nats.Name("fan-home-probe"), nats.Timeout(homeProbeTimeout), nats.NoReconnect()}, auth...)
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		return false
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), homeProbeTimeout)
	defer cancel()
	s, err := js.Stream(ctx, events.KVStreamName(StateBucket))
	if err != nil {
		return false
	}
	info := s.CachedInfo()
	return info.Cluster == nil || info.Cluster.Leader != ""
}
