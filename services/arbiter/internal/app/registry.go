package app

import (
	"context"
	"fmt"
	"hash/fnv"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/daemon"
)

// registryWorkers write heartbeats to the registry in parallel; a node
// always goes to the same worker, so its own heartbeats never race.
const registryWorkers = 4

// runRegistry keeps the node registry while this replica leads: its own
// watch on heartbeats (so registry writes never delay a decision), sharded
// writers, and the sweeper. It returns only when ctx ends or the heartbeat
// watch ends (with the watch's error): a replica leading without that watch
// would sweep every node offline, so it belongs to the run group.
func (a *arbiter) runRegistry(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	shards, writersDone := a.startRegistryWriters(ctx)
	watchEnded := make(chan error, 1)
	go func() { watchEnded <- a.watchRegistryHeartbeats(ctx, shards) }()
	t := time.NewTicker(a.cfg.Registry.SweepEvery.D())
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			writersDone()
			<-watchEnded
			return nil
		case err := <-watchEnded:
			cancel()
			writersDone()
			if err == nil {
				err = daemon.ErrEssentialExited
			}
			return fmt.Errorf("registry heartbeat watch: %w", err)
		case now := <-t.C:
			a.sweepRegistry(ctx, now)
		}
	}
}

// startRegistryWriters starts the writers, one per shard, until ctx ends,
// and returns what waits for them to return.
func (a *arbiter) startRegistryWriters(ctx context.Context) (shards [registryWorkers]chan input, wait func()) {
	done := make(chan struct{}, registryWorkers)
	for i := range shards {
		shards[i] = make(chan input, 1024)
		go func(in <-chan input) {
			defer func() { done <- struct{}{} }()
			a.writeRegistry(ctx, in)
		}(shards[i])
	}
	return shards, func() {
		for range registryWorkers {
			<-done
		}
	}
}

// writeRegistry stores the heartbeats of one shard while this replica leads.
func (a *arbiter) writeRegistry(ctx context.Context, in <-chan input) {
	for {
		select {
		case <-ctx.Done():
			return
		case hb := <-in:
			if !a.lease.Leading() {
				continue
			}
			wctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			err := a.reg.Heartbeat(wctx, hb.env, hb.p.(*events.NodeHeartbeat), hb.at)
			cancel()
			if err != nil && ctx.Err() == nil {
				a.log.Warn("registry heartbeat write failed", "node", hb.env.Source.Node, "err", err)
			}
		}
	}
}

// watchRegistryHeartbeats hands every heartbeat to its node's shard until
// ctx ends or the watch does.
func (a *arbiter) watchRegistryHeartbeats(ctx context.Context, shards [registryWorkers]chan input) error {
	return a.bus.Watch(ctx, bus.WatchOptions{Subjects: []string{events.AllHeartbeats(a.cfg.Cluster)}},
		func(env events.Envelope, p events.Decoded, _ uint64) {
			hb, ok := p.(*events.NodeHeartbeat)
			if !ok {
				return
			}
			h := fnv.New32a()
			h.Write([]byte(hb.Node))
			select {
			case shards[h.Sum32()%registryWorkers] <- input{env: env, p: hb, at: time.Now()}:
			default:
				// Behind by a thousand heartbeats: the next one carries
				// the same facts, so dropping this one loses only a count.
				a.log.Warn("registry behind: heartbeat dropped", "node", hb.Node)
			}
		})
}

// sweepRegistry marks offline, while this replica leads, the nodes whose
// heartbeats stopped.
func (a *arbiter) sweepRegistry(ctx context.Context, now time.Time) {
	if !a.lease.Leading() {
		return
	}
	sctx, cancel := context.WithTimeout(ctx, a.cfg.Registry.SweepEvery.D())
	defer cancel()
	if _, err := a.reg.Sweep(sctx, now); err != nil && ctx.Err() == nil {
		a.log.Warn("registry sweep incomplete", "err", err)
	}
}
