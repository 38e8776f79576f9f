package execute

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/daemon"
)

// Consumer reads a node's commands from its durable consumer (*bus.Bus).
// ConsumeCommands returns once ctx has ended and the handler call in hand
// has returned.
type Consumer interface {
	ConsumeCommands(ctx context.Context, node string, h bus.CommandHandler) error
}

// Releaser is what an executor that leaves something on the node (a
// floating address) provides to give it all up, with or without the bus.
type Releaser interface {
	ReleaseAll(ctx context.Context) error
}

// Open puts an executor under the contract on a service's runtime: epochs
// are checked against the arbiter lease's records in the command stream and
// results go through the runtime's outbox, so the last results are stored
// after the consumer stops, before the bus closes (Runtime.Close).
func Open(ctx context.Context, rt *daemon.Runtime, cfg Config) (*Contract, error) {
	leases, err := rt.Bus.LeaseRecords(ctx, events.ArbiterLease)
	if err != nil {
		return nil, fmt.Errorf("lease records: %w", err)
	}
	cfg.Terms = NewLeaseTerms(leases)
	cfg.Publisher = rt.Outbox
	return New(cfg), nil
}

// Consume takes the commands of every node in nodes (an IP executor has
// one, a DNS executor one per site) and hands each to Handle, one at a time
// across them, until ctx ends. It returns only once no command is in hand:
// the one being applied when ctx ends is finished (its context lives on for
// up to Config.Finish, so a stop does not turn a claim half done into a
// failure) and its result posted. A consumer that ends on its own ends the
// others, and Consume returns why.
func (c *Contract) Consume(ctx context.Context, from Consumer, nodes ...string) error {
	if len(nodes) == 0 {
		return errors.New("consume commands: no node")
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
	)
	for _, n := range nodes {
		wg.Go(func() {
			err := from.ConsumeCommands(ctx, n, c.finishing)
			if ctx.Err() != nil {
				return
			}
			if err == nil {
				err = errors.New("consumer ended")
			}
			mu.Lock()
			if first == nil {
				first = fmt.Errorf("commands for %s: %w", n, err)
			}
			mu.Unlock()
			cancel()
		})
	}
	wg.Wait()
	return first
}

// finishing is Handle under a context that outlives the stop by at most
// Config.Finish.
func (c *Contract) finishing(ctx context.Context, env events.Envelope, cmd events.Command, seq uint64) {
	hctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	// A timer left running past the command only cancels what is done.
	stop := context.AfterFunc(ctx, func() { time.AfterFunc(c.cfg.Finish, cancel) })
	defer stop()
	c.Handle(hctx, env, cmd, seq)
}
