package view

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/nats-io/nats.go/jetstream"
)

// Keyed is one state-bucket record with its key.
type Keyed[T any] struct {
	Key   string
	Value T
}

// Records reads every JSON record of the state bucket whose key matches
// filter, in key order. A key deleted between listing and reading is
// skipped.
func Records[T any](ctx context.Context, b *bus.Bus, filter string) ([]Keyed[T], error) {
	kv, err := b.StateKV(ctx)
	if err != nil {
		return nil, err
	}
	lister, err := kv.ListKeysFiltered(ctx, filter)
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", filter, err)
	}
	var keys []string
	for k := range lister.Keys() {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var out []Keyed[T]
	for _, k := range keys {
		e, err := kv.Get(ctx, k)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", k, err)
		}
		var v T
		if err := json.Unmarshal(e.Value(), &v); err != nil {
			return nil, fmt.Errorf("decode %s: %w", k, err)
		}
		out = append(out, Keyed[T]{k, v})
	}
	return out, nil
}

// StatusFilter is the state-bucket filter of every group status record of
// cluster, or of every cluster when cluster is empty.
func StatusFilter(cluster string) string {
	if cluster == "" {
		return events.StateKeyPrefix + ".>"
	}
	return events.AllGroupStatusKeys(cluster)
}

// ScheduleFilter is the state-bucket filter of the scheduler's plan of
// cluster, or of every cluster's when cluster is empty.
func ScheduleFilter(cluster string) string {
	if cluster == "" {
		return events.AllScheduleKeys()
	}
	return events.ScheduleKey(cluster)
}

// ClusterOfKey reads the cluster from a group status key (group.CLUSTER.GROUP).
func ClusterOfKey(key string) string {
	parts := strings.Split(key, ".")
	if len(parts) < 3 {
		return ""
	}
	return parts[1]
}

// Heard is a node's latest heartbeat as the live stream keeps it.
type Heard struct {
	// At is when the bus stored it (the stream's clock).
	At   time.Time
	Beat *events.NodeHeartbeat
}

// HeardKey keys Heartbeats' answer.
func HeardKey(cluster, node string) string { return cluster + "/" + node }

// Heartbeats finds, for every node of every group record, the latest
// heartbeat the live stream holds, keyed by HeardKey. The status record is
// rewritten only when something changes or every few seconds, so its
// heartbeat time lags; the stream's does not. A node with no heartbeat in
// the stream, or whose last one is not what its subject says, is left out.
func Heartbeats(ctx context.Context, b *bus.Bus, records []Keyed[events.GroupStatus]) map[string]Heard {
	out := map[string]Heard{}
	st, err := b.JS.Stream(ctx, bus.LiveStream)
	if err != nil {
		return out
	}
	for _, r := range records {
		cluster := ClusterOfKey(r.Key)
		for n := range r.Value.Nodes {
			if _, done := out[HeardKey(cluster, n)]; done {
				continue
			}
			m, err := st.GetLastMsgForSubject(ctx, events.HeartbeatSubject(cluster, n))
			if err != nil {
				continue
			}
			if _, p, ok := b.DecodeFrom(m.Subject, m.Data); ok {
				if hb, isBeat := p.(*events.NodeHeartbeat); isBeat {
					out[HeardKey(cluster, n)] = Heard{At: m.Time, Beat: hb}
				}
			}
		}
	}
	return out
}

// LastHeard maps "group/node" to when the node was last heard, from
// Heartbeats' answer: what PrintStatus and Notes take.
func LastHeard(records []Keyed[events.GroupStatus], beats map[string]Heard) map[string]time.Time {
	out := map[string]time.Time{}
	for _, r := range records {
		for n := range r.Value.Nodes {
			if h, ok := beats[HeardKey(ClusterOfKey(r.Key), n)]; ok {
				out[r.Value.Group+"/"+n] = h.At
			}
		}
	}
	return out
}

// Seen is when a node of g was last heard: the live stream's time from
// heard ("group/node", LastHeard) when it is newer than the arbiter's own
// record of its last heartbeat.
func Seen(g events.GroupStatus, heard map[string]time.Time, node string) time.Time {
	if t, ok := heard[g.Group+"/"+node]; ok && t.After(g.Nodes[node].LastHeartbeat) {
		return t
	}
	return g.Nodes[node].LastHeartbeat
}

// NodesByPriority lists g's nodes, most preferred first.
func NodesByPriority(g events.GroupStatus) []string {
	names := make([]string, 0, len(g.Nodes))
	for n := range g.Nodes {
		names = append(names, n)
	}
	sort.Slice(names, func(i, j int) bool {
		pi, pj := g.Nodes[names[i]].Priority, g.Nodes[names[j]].Priority
		if pi != pj {
			return pi < pj
		}
		return names[i] < names[j]
	})
	return names
}

// Notes are the situation lines: what the arbiter is waiting for and why
// (frozen groups, the last "decided not to move", the failback permit,
// standbys, a planned move waiting to drain), one line per fact, each
// starting with its group, sorted. Empty when there is nothing to say.
func Notes(groups []events.GroupStatus, heard map[string]time.Time, now time.Time) []string {
	var notes []string
	for _, g := range groups {
		if g.Frozen != "" {
			notes = append(notes, fmt.Sprintf("%s: FROZEN: %s", g.Group, g.Frozen))
		}
		switch {
		case g.NeedsHuman && g.Situation != "":
			notes = append(notes, fmt.Sprintf("%s: NEEDS A HUMAN: %s%s", g.Group, g.Situation, staleNote(g, heard, now)))
		case g.NeedsHuman:
			notes = append(notes, g.Group+": NEEDS A HUMAN")
		case g.Situation != "":
			notes = append(notes, fmt.Sprintf("%s: %s%s", g.Group, g.Situation, staleNote(g, heard, now)))
		}
		if !g.PermitUntil.IsZero() {
			notes = append(notes, fmt.Sprintf("%s: failback permitted until %s", g.Group, Time(g.PermitUntil)))
		}
		for n, s := range g.Nodes {
			if s.Standby {
				notes = append(notes, fmt.Sprintf("%s: %s is in standby", g.Group, n))
			}
		}
		if p := g.Planned; p != nil {
			notes = append(notes, plannedNote(g.Group, p, now))
		}
		if p := g.Pin; p != nil {
			notes = append(notes, PinNote(g.Group, p, now))
		}
	}
	sort.Strings(notes)
	return notes
}

// plannedNote says who asked for the waiting move, since when, the
// holder's channels now and the deadline.
func plannedNote(group string, p *events.PlannedStatus, now time.Time) string {
	what := fmt.Sprintf("switchover from %s to %s", p.From, p.To)
	if p.Verb == events.OpNodeStandby {
		what = fmt.Sprintf("move off %s (standby)", p.From)
	}
	if p.GaveUp {
		return fmt.Sprintf("%s: PLANNED %s asked by %s at %s GAVE UP at %s: %s keeps the group", group, what, p.Operator,
			Time(p.RequestedAt), Time(p.Deadline), p.From)
	}
	count := "unknown active channels now"
	if p.Channels != nil {
		count = fmt.Sprintf("%d active channels now", *p.Channels)
	}
	// With the holder's calls summary, the wait is only for the channels
	// of calls that cannot be carried across.
	if c := p.Calls; c != nil && c.CarriedChannels > 0 {
		count += fmt.Sprintf(", %d of them in %s carried across: %d waited for", c.CarriedChannels, plural(c.Carriable, "call"), c.Uncarried())
	}
	then := "then gives up"
	if p.Drain == events.DrainForceAfter {
		then = "then moves anyway"
	}
	return fmt.Sprintf("%s: PLANNED %s asked by %s at %s (%s ago), waiting for %s to drain: %s (limit %d); deadline %s (in %s), %s",
		group, what, p.Operator, Time(p.RequestedAt), HumanDuration(now.Sub(p.RequestedAt)), p.From, count, p.MaxChannels,
		Time(p.Deadline), HumanDuration(p.Deadline.Sub(now)), then)
}

// staleNote qualifies a situation written when a node had not been heard
// yet: the arbiter restates it at its next decision, the table already
// shows the node heard, and the two must not seem to disagree.
func staleNote(g events.GroupStatus, heard map[string]time.Time, now time.Time) string {
	var since []string
	for n := range g.Nodes {
		if seen := Seen(g, heard, n); strings.Contains(g.Situation, n+" never heard") && !seen.IsZero() {
			since = append(since, fmt.Sprintf("%s heard %s ago", n, HumanDuration(now.Sub(seen))))
		}
	}
	if len(since) == 0 {
		return ""
	}
	sort.Strings(since)
	return " (as of the arbiter's last decision; since then " + strings.Join(since, ", ") + ")"
}
