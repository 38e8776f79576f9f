package app

import (
	"context"

	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/daemon"
	"github.com/fanpbx/fan/services/arbiter/internal/steward"
	"github.com/nats-io/nats.go"
)

// connectSystem opens the connection to the system account (bus.system),
// nil when none is configured or it cannot be opened: that costs the meta
// leader's placement and the servers' own reports, nothing else.
func (s *Service) connectSystem() *nats.Conn {
	sys, err := bus.ConnectSystem(s.cfg.Bus, "fan-arbiter-"+s.cfg.Node+"-system", s.log)
	if err != nil {
		s.log.Error("system account unavailable; the meta leader is left where it is and the servers' reports are not read", "err", err)
		return nil
	}
	return sys
}

// runSteward keeps raft leaders on bus.leader_servers while this replica
// holds the lease, and returns a function that waits for it to stop. With
// no leader servers configured it starts nothing. Without a system account
// (sys nil) only the meta group's placement is lost: the streams and
// consumers are still kept.
func (a *arbiter) runSteward(ctx context.Context, rt *daemon.Runtime, sys *nats.Conn) (wait func()) {
	bc := a.cfg.Bus
	if len(bc.LeaderServers) == 0 {
		return func() {}
	}
	st := steward.New(steward.Config{LeaderServers: bc.LeaderServers, Streams: bus.Streams(), Leading: a.lease.Leading,
		Hold: a.hold.forSteward, Trouble: a.trouble.String, Break: func(id, why string) { a.breakHold(ctx, id, why) }},
		rt.Bus.NC, rt.Bus.JS, sys, a.log)
	for _, c := range st.Collectors() {
		_ = rt.Metrics.Register(c)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := st.Run(ctx); err != nil {
			a.log.Error("leader steward stopped", "err", err)
		}
	}()
	return func() { <-done }
}
