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

// Group runs a service's essential goroutines: the watches, consumers and
// loops without which it would still run but no longer do its job. If any
// of them returns (with an error or without) before the service is asked
// to stop, the group cancels the others and Wait returns the reason, so
// the service ends non-zero and systemd restarts it (Restart=on-failure)
// instead of leaving a process that answers /healthz and does nothing.
//
// Only what must run for the service's life belongs in a Group; a
// goroutine that finishes its work on purpose does not.
type Group struct {
	parent context.Context
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu  sync.Mutex
	err error
}

// NewGroup returns a group and the context its goroutines run under: it
// ends when ctx ends or when any of them fails.
func NewGroup(ctx context.Context) (*Group, context.Context) {
	gctx, cancel := context.WithCancel(ctx)
	return &Group{parent: ctx, ctx: gctx, cancel: cancel}, gctx
}

// Go runs fn as the essential goroutine name.
func (g *Group) Go(name string, fn func(ctx context.Context) error) {
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		err := fn(g.ctx)
		if g.parent.Err() != nil {
			return // asked to stop: every return is expected
		}
		if err == nil {
			err = ErrEssentialExited
		}
		g.Fail(fmt.Errorf("%s: %w", name, err))
	}()
}

// Fail ends the group with err, as if an essential goroutine had returned
// it: for code that decides the service must restart (a state it cannot
// leave otherwise) without being a goroutine of its own. The first failure
// wins; a failure after the parent context ended is ignored.
func (g *Group) Fail(err error) {
	if g.parent.Err() != nil {
		return
	}
	g.mu.Lock()
	if g.err == nil {
		g.err = err
	}
	g.mu.Unlock()
	g.cancel()
}

// Wait waits for every goroutine and returns the first failure, or nil
// when they ended because the parent context did.
func (g *Group) Wait() error {
	g.wg.Wait()
	g.cancel()
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.err
}

// Err is the first failure so far, without waiting.
func (g *Group) Err() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.err
}
