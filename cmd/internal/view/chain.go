package view

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
)

// Entry is one event of the trail.
type Entry struct {
	Env events.Envelope
	P   events.Decoded
	// Stored is when its stream stored it, by the stream's clock.
	Stored time.Time
}

// ReadTrail reads the audit stream (events and the copies of commands) and
// the live stream (heartbeats and probe results, which decisions may cite)
// of cluster (every cluster when empty) from since to their end, in the
// order bus.ReadAll gives.
func ReadTrail(ctx context.Context, b *bus.Bus, cluster string, since time.Time) ([]Entry, error) {
	subjects := []string{events.ClusterEvents(cluster), events.ClusterCommands(cluster), events.ClusterLiveState(cluster)}
	if cluster == "" {
		subjects = []string{events.AllEvents(), events.AllCommands(), events.AllLiveState()}
	}
	stored, err := b.ReadAll(ctx, bus.WatchOptions{Subjects: subjects, Since: since})
	if err != nil {
		return nil, err
	}
	out := make([]Entry, 0, len(stored))
	for _, r := range stored {
		out = append(out, Entry{r.Env, r.Payload, r.At})
	}
	return out, nil
}

// IDTime reads the millisecond timestamp of an event id (a UUID v7).
func IDTime(id string) (time.Time, error) {
	raw, err := hex.DecodeString(strings.ReplaceAll(id, "-", ""))
	if err != nil || len(raw) != 16 || raw[6]>>4 != 7 {
		return time.Time{}, fmt.Errorf("%q is not an event id (a UUID v7)", id)
	}
	var ms int64
	for _, c := range raw[:6] {
		ms = ms<<8 | int64(c)
	}
	return time.UnixMilli(ms), nil
}

// Link is one line of an explanation: an event at its depth below the one
// explained (its causes are the links right after it, one deeper). Event
// is nil when the cause is not in the trail read; Repeat marks an event
// already shown higher up.
type Link struct {
	Depth  int              `json:"depth"`
	ID     string           `json:"id"`
	Event  *events.Envelope `json:"event,omitempty"`
	Repeat bool             `json:"repeat,omitempty"`
	// Consequence marks an event that followed the move explained rather
	// than caused it: its claim's result and the adoption of the calls,
	// listed after the causes.
	Consequence bool `json:"consequence,omitempty"`
	// Calls, on the first move decision of the chain, is what became of
	// the calls on the holder it left.
	Calls *CallsOutcome `json:"calls,omitempty"`
	p     events.Payload
}

// Payload is the link's decoded event; nil when the cause is not in the
// trail read.
func (l Link) Payload() events.Payload { return l.p }

// Explain reads the trail of cluster from lookback before the event id was
// made and walks from it back through its causes to the probe results.
func Explain(ctx context.Context, b *bus.Bus, cluster, id string, lookback time.Duration) ([]Link, error) {
	at, err := IDTime(id)
	if err != nil {
		return nil, err
	}
	trail, err := ReadTrail(ctx, b, cluster, at.Add(-lookback))
	if err != nil {
		return nil, err
	}
	return Chain(trail, id)
}

// Chain walks from id back through its causes to the probe results. A
// cause that is live state (a heartbeat) is found while the live stream
// keeps it (bus.limits.live_max_age); the decisions that cite a heartbeat
// also cite the transition it reported, which the audit stream keeps, so
// the chain reaches the transition and its probe evidence either way.
//
// The first decision of the chain that moves a group also gets what
// followed it (Consequence links, after the causes): its claim's result
// and, when that deferred the adoption of the calls, the calls.adopted
// event citing the claim, looked for in the trail after the decision up to
// OutcomeWithin; and what became of the calls (Link.Calls).
func Chain(trail []Entry, id string) ([]Link, error) {
	byID := make(map[string]Entry, len(trail))
	index := make(map[string]int, len(trail))
	for i, e := range trail {
		byID[e.Env.ID] = e
		index[e.Env.ID] = i
	}
	if _, ok := byID[id]; !ok {
		return nil, fmt.Errorf("%w: event %s is not in the trail (wrong cluster, or older than the stream keeps)", ErrNotInTrail, id)
	}
	var chain []Link
	seen := map[string]bool{}
	var walk func(id string, depth int)
	walk = func(id string, depth int) {
		e, ok := byID[id]
		if !ok {
			chain = append(chain, Link{Depth: depth, ID: id})
			return
		}
		env := e.Env
		if seen[id] {
			chain = append(chain, Link{Depth: depth, ID: id, Event: &env, Repeat: true, p: e.P})
			return
		}
		seen[id] = true
		chain = append(chain, Link{Depth: depth, ID: id, Event: &env, p: e.P})
		for _, c := range Causes(env, e.P) {
			walk(c, depth+1)
		}
	}
	walk(id, 0)
	for i, l := range chain {
		d, ok := l.p.(*events.ArbiterDecision)
		if !ok || l.Repeat || d.Action == events.ActionHold || d.To == "" {
			continue
		}
		after, o := outcome(trail, index[l.ID], d)
		chain[i].Calls = o
		for _, e := range after {
			env := e.Env
			chain = append(chain, Link{Depth: 1, ID: env.ID, Event: &env, Repeat: seen[env.ID], Consequence: true, p: e.P})
		}
		break
	}
	return chain, nil
}

// ErrNotInTrail is Chain's answer for an event the trail read does not hold.
var ErrNotInTrail = errors.New("not in the trail")

// Causes are the events an event names as its causes: a decision's or a
// planned move's list, otherwise the envelope's causation id.
func Causes(env events.Envelope, p events.Payload) []string {
	var causes []string
	switch v := p.(type) {
	case *events.ArbiterDecision:
		causes = v.CausedBy
	case *events.PlannedMove:
		causes = v.CausedBy
	case interface{ Causes() []string }: // pins, leaders holds
		causes = v.Causes()
	}
	if len(causes) == 0 && env.CausationID != "" {
		causes = []string{env.CausationID}
	}
	return causes
}
