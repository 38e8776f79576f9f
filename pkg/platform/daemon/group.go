package daemon

import (
	"context"
	"errors"
	"fmt"
	"sync"
)

// ErrEssentialExited is the cause when an essential goroutine returned
// without an error while the service was still meant to run.
var ErrEssentialExited = errors.New("essential goroutine exited")

// Group is a service's run group: its actors are the watches, consumers and
// loops without which it would still run but no longer do its job. If any
// of them returns (with an error or without) before the service is asked
// to stop, the whole group stops and Wait returns the reason, so the
// service ends non-zero and systemd restarts it (Restart=on-failure)
// instead of leaving a process that answers /healthz and does nothing.
//
// Stopping is ordered: the actors are interrupted one at a time, in the
// order they were added, each only after the one before it has returned.
// A service therefore adds them in the order they must stop, which for a
// command executor is: stop taking commands (the consumer finishes the
// command in hand before it returns), then the loops that change things on
// their own, then what must be released. The results still queued are
// published and the bus closed after the group, by Serve (Runtime.Close).
// Interrupting everything at once, as a plain errgroup does, would let a
// release run while a command is still being applied.
//
// Only what must run for the service's life belongs in a Group; a
// goroutine that finishes its work on purpose does not.
type Group struct {
	parent context.Context
	// ctx ends when the group begins to stop: the parent ended or an
	// actor returned.
	ctx    context.Context
	cancel context.CancelFunc

	mu      sync.Mutex
	err     error
	actors  []*actor
	drained bool // every actor was interrupted; later ones stop at once
	wg      sync.WaitGroup
	stopped chan struct{}
}

type actor struct {
	name      string
	interrupt func(error)
	done      chan struct{}
}

// NewGroup returns a group and the context that ends when it begins to
// stop (ctx ended, or an actor returned).
func NewGroup(ctx context.Context) (*Group, context.Context) {
	gctx, cancel := context.WithCancel(ctx)
	g := &Group{parent: ctx, ctx: gctx, cancel: cancel, stopped: make(chan struct{})}
	go g.stopInOrder()
	return g, gctx
}

// Add runs execute as the actor name. interrupt must make execute return;
// it is called once, when the actor's turn to stop comes, with the reason
// the group stops.
func (g *Group) Add(name string, execute func() error, interrupt func(error)) {
	a := &actor{name: name, interrupt: interrupt, done: make(chan struct{})}
	g.mu.Lock()
	drained := g.drained
	if !drained {
		g.actors = append(g.actors, a)
	}
	g.mu.Unlock()
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		defer close(a.done)
		err := execute()
		if g.ctx.Err() != nil {
			return // the group is stopping: every return is expected
		}
		if err == nil {
			err = ErrEssentialExited
		}
		g.Fail(fmt.Errorf("%s: %w", name, err))
	}()
	if drained {
		interrupt(g.cause())
	}
}

// Go runs fn as the actor name, under a context of its own that ends at
// its turn to stop (not when ctx ends: that would stop every actor at once).
func (g *Group) Go(name string, fn func(ctx context.Context) error) {
	ctx, cancel := context.WithCancel(context.WithoutCancel(g.parent))
	g.Add(name, func() error {
		defer cancel()
		return fn(ctx)
	}, func(error) { cancel() })
}

// stopInOrder interrupts the actors one at a time once the group stops.
func (g *Group) stopInOrder() {
	defer close(g.stopped)
	<-g.ctx.Done()
	for i := 0; ; i++ {
		g.mu.Lock()
		if i == len(g.actors) {
			g.drained = true
			g.mu.Unlock()
			return
		}
		a := g.actors[i]
		g.mu.Unlock()
		a.interrupt(g.cause())
		<-a.done
	}
}

func (g *Group) cause() error {
	if err := g.Err(); err != nil {
		return err
	}
	return context.Cause(g.parent)
}

// Fail ends the group with err, as if an actor had returned it: for code
// that decides the service must restart (a state it cannot leave
// otherwise) without being an actor of its own. The first failure wins; a
// failure once the group is stopping is ignored.
func (g *Group) Fail(err error) {
	g.mu.Lock()
	if g.err == nil && g.ctx.Err() == nil {
		g.err = err
	}
	g.mu.Unlock()
	g.cancel()
}

// Wait waits until the group has stopped (ctx ended or an actor returned)
// and every actor has returned, and returns the first failure, or nil when
// they ended because ctx did.
func (g *Group) Wait() error {
	<-g.stopped
	g.wg.Wait()
	return g.Err()
}

// Err is the first failure so far, without waiting.
func (g *Group) Err() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.err
}
