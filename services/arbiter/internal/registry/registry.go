// Package registry keeps the node registry on JetStream: one key per
// node in the state bucket with its last heartbeat and metrics, and a
// sweeper that marks a node offline after a silence and online again when
// it is heard. Every write is a compare-and-set on the key's revision, so
// concurrent heartbeats and sweeps (two arbiter replicas during a handover,
// or the sharded writers of one) never lose an update: the loser re-reads
// and applies its change to what the winner wrote.
//
// The registry is not what failover is decided on: the decision core has
// its own, much shorter silence rule. It is the inventory an operator and
// a load-aware balancer read, and the record of when nodes came and went.
package registry

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/nats-io/nats.go/jetstream"
)

// DefaultOfflineAfter is the threshold after which a silent node counts as offline.
const DefaultOfflineAfter = 5 * time.Minute

// maxAttempts bounds a compare-and-set loop. Each retry means another
// writer changed the key in between; a hundred in a row means something is
// writing it in a loop, and giving up (logged) beats spinning.
const maxAttempts = 100

// ErrContention is returned when a write lost the race maxAttempts times.
var ErrContention = errors.New("registry key kept changing under the write")

// Emitter publishes an event (bus.Bus.Emit in production).
type Emitter func(ctx context.Context, p events.Payload, opts ...events.Option) (events.Envelope, error)

// Registry writes node records to a key-value bucket.
type Registry struct {
	kv           jetstream.KeyValue
	cluster      string
	offlineAfter time.Duration
	emit         Emitter
	log          *slog.Logger
}

// New returns a registry over kv (the state bucket).
func New(kv jetstream.KeyValue, cluster string, offlineAfter time.Duration, emit Emitter, log *slog.Logger) *Registry {
	if offlineAfter <= 0 {
		offlineAfter = DefaultOfflineAfter
	}
	return &Registry{kv: kv, cluster: cluster, offlineAfter: offlineAfter, emit: emit, log: log}
}

// OfflineAfter is the silence after which a node is marked offline.
func (r *Registry) OfflineAfter() time.Duration { return r.offlineAfter }

// update reads key, lets change modify the record (returning false to
// leave it alone), and writes it back only if nobody wrote in between. It
// returns the revision it wrote (0 when it wrote nothing).
func (r *Registry) update(ctx context.Context, key string, change func(rec *events.NodeRecord, exists bool) bool) (events.NodeRecord, events.NodeRecord, uint64, error) {
	for range maxAttempts {
		var before events.NodeRecord
		var rev uint64
		e, err := r.kv.Get(ctx, key)
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
		case err != nil:
			return before, before, 0, fmt.Errorf("read %s: %w", key, err)
		default:
			if err := json.Unmarshal(e.Value(), &before); err != nil {
				return before, before, 0, fmt.Errorf("decode %s: %w", key, err)
			}
			rev = e.Revision()
		}
		after := before
		if !change(&after, rev != 0) {
			return before, after, 0, nil
		}
		b, err := json.Marshal(after)
		if err != nil {
			return before, after, 0, fmt.Errorf("encode %s: %w", key, err)
		}
		var written uint64
		if rev == 0 {
			written, err = r.kv.Create(ctx, key, b)
		} else {
			written, err = r.kv.Update(ctx, key, b, rev)
		}
		if err == nil {
			return before, after, written, nil
		}
		if !lostRace(err) {
			return before, after, 0, fmt.Errorf("write %s: %w", key, err)
		}
	}
	return events.NodeRecord{}, events.NodeRecord{}, 0, fmt.Errorf("%s: %w", key, ErrContention)
}

// lostRace: another writer got there first (wrong revision, key created
// meanwhile, or the conservative "wrong last sequence" of a clustered
// stream while another expected-sequence write is in flight).
func lostRace(err error) bool {
	if errors.Is(err, jetstream.ErrKeyExists) {
		return true
	}
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		return apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
			apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant
	}
	return false
}

// Heartbeat records one heartbeat received at receivedAt (the registry's
// clock). A redelivered heartbeat (same id) changes nothing; an older one
// than the record holds is counted but does not overwrite newer metrics.
// A node heard for the first time, or again after being marked offline,
// goes online, and that is published as a NodePresence event.
func (r *Registry) Heartbeat(ctx context.Context, env events.Envelope, hb *events.NodeHeartbeat, receivedAt time.Time) error {
	key := events.RegistryKey(r.cluster, hb.Node)
	before, after, wrote, err := r.update(ctx, key, func(rec *events.NodeRecord, exists bool) bool {
		if exists && rec.HeartbeatID == env.ID {
			return false
		}
		rec.Node = hb.Node
		rec.Beats++
		if receivedAt.After(rec.LastHeartbeat) {
			rec.LastHeartbeat = receivedAt
		}
		if !env.Time.Before(rec.HeartbeatAt) {
			rec.HeartbeatAt, rec.HeartbeatID, rec.Seq = env.Time, env.ID, hb.Seq
			rec.IntervalMS, rec.CPUPercent, rec.Load1 = hb.IntervalMS, hb.CPUPercent, hb.Load1
			rec.MemAvailableBytes, rec.MemTotalBytes = hb.MemAvailableBytes, hb.MemTotalBytes
			rec.ActiveChannels, rec.ActiveCalls, rec.Version = hb.ActiveChannels, hb.ActiveCalls, hb.Version
		}
		if rec.Presence != events.PresenceOnline {
			rec.Presence, rec.PresenceSince = events.PresenceOnline, receivedAt
		}
		return true
	})
	if err != nil || wrote == 0 || before.Presence == events.PresenceOnline {
		return err
	}
	// This write is the one that flipped the node online: it alone reports it.
	p := events.NodePresence{Node: hb.Node, Presence: events.PresenceOnline, LastHeartbeat: after.LastHeartbeat,
		ThresholdMS: r.offlineAfter.Milliseconds(), Revision: wrote}
	if !before.LastHeartbeat.IsZero() {
		p.SilentMS = receivedAt.Sub(before.LastHeartbeat).Milliseconds()
	}
	if _, err := r.emit(ctx, p, events.CausedBy(env)); err != nil {
		return fmt.Errorf("node %s online: recorded, event not published: %w", hb.Node, err)
	}
	r.log.Info("node online", "node", hb.Node, "silent_ms", p.SilentMS)
	return nil
}

// Sweep marks offline every online node not heard for longer than the
// threshold at now, and returns how many it marked. A heartbeat landing
// between the sweep's read and write wins: the sweep's compare-and-set
// fails, it re-reads, and finds the node fresh.
func (r *Registry) Sweep(ctx context.Context, now time.Time) (int, error) {
	lister, err := r.kv.ListKeysFiltered(ctx, events.AllRegistryKeys(r.cluster))
	if err != nil {
		return 0, fmt.Errorf("list registry: %w", err)
	}
	var keys []string
	for k := range lister.Keys() {
		keys = append(keys, k)
	}
	marked := 0
	var errs []error
	for _, key := range keys {
		before, after, wrote, err := r.update(ctx, key, func(rec *events.NodeRecord, exists bool) bool {
			if !exists || rec.Presence != events.PresenceOnline || now.Sub(rec.LastHeartbeat) <= r.offlineAfter {
				return false
			}
			rec.Presence, rec.PresenceSince = events.PresenceOffline, now
			return true
		})
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if wrote == 0 {
			continue
		}
		marked++
		silent := now.Sub(before.LastHeartbeat)
		p := events.NodePresence{Node: after.Node, Presence: events.PresenceOffline, LastHeartbeat: before.LastHeartbeat,
			SilentMS: silent.Milliseconds(), ThresholdMS: r.offlineAfter.Milliseconds(), Revision: wrote}
		var opts []events.Option
		if before.HeartbeatID != "" {
			opts = append(opts, events.CausedByID(before.HeartbeatID, ""))
		}
		if _, err := r.emit(ctx, p, opts...); err != nil {
			errs = append(errs, fmt.Errorf("node %s offline: recorded, event not published: %w", after.Node, err))
			continue
		}
		r.log.Warn("node offline", "node", after.Node, "silent", silent.Round(time.Millisecond))
	}
	return marked, errors.Join(errs...)
}

// Get reads one node's record.
func (r *Registry) Get(ctx context.Context, node string) (events.NodeRecord, error) {
	var rec events.NodeRecord
	e, err := r.kv.Get(ctx, events.RegistryKey(r.cluster, node))
	if err != nil {
		return rec, fmt.Errorf("registry %s: %w", node, err)
	}
	if err := json.Unmarshal(e.Value(), &rec); err != nil {
		return rec, fmt.Errorf("registry %s: %w", node, err)
	}
	return rec, nil
}
