package vip

import (
	"context"
	"fmt"
	"time"

	"github.com/vishvananda/netlink"
)

// Watch reports changes to the interface's addresses as a coalesced signal:
// a value on the returned channel means "something changed, look again",
// never what changed. Consumers re-read the full state, so a burst of
// updates costs one reconcile pass and a dropped detail cannot mislead them.
//
// When the subscription fails (for example the kernel dropped messages
// because the socket buffer overflowed) Watch signals, since changes may have
// been missed, and subscribes again with backoff. The channel is closed after
// ctx is done. Only the first subscription's error is returned.
func (m *Manager) Watch(ctx context.Context) (<-chan struct{}, error) {
	sub, err := m.subscribe(ctx)
	if err != nil {
		return nil, err
	}
	out := make(chan struct{}, 1)
	go m.watch(ctx, sub, out)
	return out, nil
}

type subscription struct {
	updates chan netlink.AddrUpdate
	done    chan struct{}
}

// stop ends the subscription and drains it, so the library's reader
// goroutine can deliver what it holds, see the closed socket and exit.
func (s *subscription) stop() {
	close(s.done)
	for range s.updates {
	}
}

func (m *Manager) subscribe(ctx context.Context) (*subscription, error) {
	s := &subscription{
		updates: make(chan netlink.AddrUpdate, 64),
		done:    make(chan struct{}),
	}
	opts := netlink.AddrSubscribeOptions{
		ErrorCallback: func(err error) {
			// A closed socket after stop is expected, not news.
			if ctx.Err() == nil {
				m.log.Warn("address watch error", "err", err)
			}
		},
	}
	if m.ns.IsOpen() {
		ns := m.ns
		opts.Namespace = &ns
	}
	if err := netlink.AddrSubscribeWithOptions(s.updates, s.done, opts); err != nil {
		close(s.done)
		return nil, fmt.Errorf("subscribe to address changes: %w", err)
	}
	return s, nil
}

const (
	resubscribeMin = 50 * time.Millisecond
	resubscribeMax = 5 * time.Second
)

func (m *Manager) watch(ctx context.Context, sub *subscription, out chan struct{}) {
	defer close(out)
	for {
		select {
		case <-ctx.Done():
			sub.stop()
			return
		case u, ok := <-sub.updates:
			if ok {
				if u.LinkIndex == int(m.index.Load()) {
					signal(out)
				}
				continue
			}
		}
		// The reader gave up: whatever happened meanwhile is unknown.
		close(sub.done)
		signal(out)
		sub = m.resubscribe(ctx)
		if sub == nil {
			return
		}
		// Refresh the index in case the interface was re-created, and look
		// again in case something changed while we were not subscribed.
		if _, err := m.link(); err != nil {
			m.log.Warn("address watch: interface lookup failed", "err", err)
		}
		signal(out)
	}
}

func (m *Manager) resubscribe(ctx context.Context) *subscription {
	wait := resubscribeMin
	for {
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
		sub, err := m.subscribe(ctx)
		if err == nil {
			m.log.Info("address watch resubscribed")
			return sub
		}
		m.log.Warn("address watch: resubscribe failed", "err", err, "retry_in", wait)
		wait = min(2*wait, resubscribeMax)
	}
}

func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}
