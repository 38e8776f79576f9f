package app

import (
	"context"

	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/daemon"
	"github.com/fanpbx/fan/services/arbiter/internal/steward"
)

// runSteward keeps raft leaders on bus.leader_servers while this replica
// holds the lease, and returns a function that waits for it to stop. With
// no leader servers configured it starts nothing. A system account that
// cannot be reached costs only the meta group's placement: the streams and
// consumers are still kept.
func (s *Service) runSteward(ctx context.Context, rt *daemon.Runtime) (wait func()) {
	bc := s.cfg.Bus
	if len(bc.LeaderServers) == 0 {
		return func() {}
	}
	sys, err := bus.ConnectSystem(bc, "fan-arbiter-"+s.cfg.Node+"-system", s.log)
	if err != nil {
		s.log.Error("system account unavailable; the meta leader is left where it is", "err", err)
	}
	st := steward.New(steward.Config{LeaderServers: bc.LeaderServers, Streams: bus.Streams(), Leading: s.lease.Leading},
		rt.Bus.NC, rt.Bus.JS, sys, s.log)
	for _, c := range st.Collectors() {
		_ = rt.Metrics.Register(c)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := st.Run(ctx); err != nil {
			s.log.Error("leader steward stopped", "err", err)
		}
		if sys != nil {
			sys.Close()
		}
	}()
	return func() { <-done }
}
