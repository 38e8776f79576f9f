package app

import (
	"context"

	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/daemon"
	"github.com/nats-io/nats.go"
)

// runUsage exports how full each of fan's streams and buckets is
// (fan_stream_bytes, fan_stream_max_bytes), for the alert that fires before
// a byte limit discards the oldest records, and from the same reads the
// raft peers of each stream and whether each NATS server is up; with the
// system account sys (nil: none), the meta group's peers and the servers'
// certificates too. Every replica reports, leading or not: the figures are
// the cluster's, and a follower's scrape still warns while the leader's
// host is down. It returns a function that waits for it to stop.
func (s *Service) runUsage(ctx context.Context, rt *daemon.Runtime, sys *nats.Conn) (wait func()) {
	u := bus.NewUsage()
	u.System = sys
	for _, c := range u.Collectors() {
		_ = rt.Metrics.Register(c)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		rt.Bus.Report(ctx, u, bus.UsageEvery)
	}()
	return func() { <-done }
}
