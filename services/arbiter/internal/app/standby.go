package app

import (
	"context"
	"sync"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/nats-io/nats.go"
)

// Presence timing of arbiter replicas (core NATS, never stored). A replica
// not heard for presenceDeadAfter is gone; a standby hands the lease back
// only after hearing a replica that is not a standby for presenceSettle
// without a gap, so that one that flaps does not make the lease flap.
const (
	presenceEvery     = 250 * time.Millisecond
	presenceDeadAfter = 4 * presenceEvery
	presenceSettle    = 2 * time.Second
)

// primaries tracks the replicas that are not standbys, as their presence
// arrives. It is the standby's view of "is anyone better placed alive?".
type primaries struct {
	mu sync.Mutex
	// start: a standby that has just started has not heard anyone yet;
	// it waits one presence timeout before its first campaign.
	start time.Time
	since map[string]time.Time // first heard in the current unbroken run
	last  map[string]time.Time
}

func newPrimaries(now time.Time) *primaries {
	return &primaries{start: now, since: map[string]time.Time{}, last: map[string]time.Time{}}
}

func (p *primaries) heard(node string, at time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if l, ok := p.last[node]; !ok || at.Sub(l) > presenceDeadAfter {
		p.since[node] = at
	}
	p.last[node] = at
}

// mayHold answers the lease for a standby: campaign only while no primary
// is alive; hold, once leading, until a primary has been alive for
// presenceSettle.
func (p *primaries) mayHold(now time.Time, leading bool) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !leading && now.Sub(p.start) < presenceDeadAfter {
		return false
	}
	for node, l := range p.last {
		if now.Sub(l) > presenceDeadAfter {
			continue
		}
		if !leading || now.Sub(p.since[node]) >= presenceSettle {
			return false
		}
	}
	return true
}

// mayHoldHeld is mayHold while an operator may hold the leaders (fanctl
// leaders hold): a standby that leads keeps the lease while the hold is in
// force, rather than hand it to a primary coming back from a reboot.
func (p *primaries) mayHoldHeld(now time.Time, leading, held bool) bool {
	return p.mayHold(now, leading) || (leading && held)
}

// announcePresence publishes this replica's presence until ctx ends.
func (s *Service) announcePresence(ctx context.Context, b *bus.Bus) {
	t := time.NewTicker(presenceEvery)
	defer t.Stop()
	subject := events.ArbiterPresenceSubject(s.cfg.Cluster, s.cfg.Node)
	for {
		data, _ := events.ArbiterPresence{Node: s.cfg.Node, Standby: s.cfg.Standby, IntervalMS: presenceEvery.Milliseconds(), At: time.Now().UTC()}.Encode()
		_ = b.NC.Publish(subject, data) // a lost one is covered by the next
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// watchPrimaries feeds p with the presence of replicas that are not standbys.
func (s *Service) watchPrimaries(b *bus.Bus, p *primaries) (stop func(), err error) {
	sub, err := b.NC.Subscribe(events.AllArbiterPresence(s.cfg.Cluster), func(m *nats.Msg) {
		a, err := events.DecodeArbiterPresence(m.Data)
		if err != nil || a.Standby || a.Node == s.cfg.Node || m.Subject != events.ArbiterPresenceSubject(s.cfg.Cluster, a.Node) {
			return
		}
		p.heard(a.Node, time.Now())
	})
	if err != nil {
		return nil, err
	}
	return func() { _ = sub.Unsubscribe() }, nil
}
