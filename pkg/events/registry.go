package events

import (
	"fmt"
	"time"
)

// The node registry: every node's last heartbeat and metrics in
// the state bucket, one key per node, written with compare-and-set so that
// concurrent heartbeats and sweeps never lose an update; a sweeper marks a
// node offline after a silence, and a heartbeat marks it online again. Both
// changes are NodePresence events.

// TypeNodePresence is the wire name of NodePresence.
const TypeNodePresence Type = "node.presence"

func init() {
	register(TypeNodePresence, func() Decoded { return &NodePresence{} })
}

// Presence is a node's registry state.
type Presence string

const (
	PresenceOnline  Presence = "online"
	PresenceOffline Presence = "offline"
)

// NodePresence reports a node going offline (silent longer than the
// threshold) or coming online (heard for the first time, or again). Its
// causation id is the heartbeat that brought it online, or the last
// heartbeat heard before it went offline.
type NodePresence struct {
	Node     string   `json:"node"`
	Presence Presence `json:"presence"`
	// LastHeartbeat is when the registry last heard the node (registry's clock).
	LastHeartbeat time.Time `json:"last_heartbeat"`
	// SilentMS is how long the node had been silent when it was marked
	// offline, or was silent before this heartbeat brought it back.
	SilentMS    int64 `json:"silent_ms,omitempty"`
	ThresholdMS int64 `json:"threshold_ms"`
	// Revision is the registry record's revision written by the flip.
	// Several writers publish flips concurrently, so events may arrive out
	// of order; consumers order a node's flips by this, not by arrival.
	Revision uint64 `json:"revision,omitempty"`
}

func (NodePresence) EventType() Type    { return TypeNodePresence }
func (NodePresence) SchemaVersion() int { return 1 }
func (p NodePresence) subject(e Envelope) string {
	return PresenceSubject(e.Cluster, p.Node)
}

func (p NodePresence) Validate() error {
	if err := ValidToken("node", p.Node); err != nil {
		return err
	}
	if p.Presence != PresenceOnline && p.Presence != PresenceOffline {
		return fmt.Errorf("%w: presence %q", ErrInvalidField, p.Presence)
	}
	if p.LastHeartbeat.IsZero() {
		return fmt.Errorf("%w: last_heartbeat", ErrMissingField)
	}
	if p.ThresholdMS <= 0 {
		return fmt.Errorf("%w: threshold_ms", ErrMissingField)
	}
	// The registry's offline_after is at most 24h; silence is reported as
	// measured (concurrent writers' clocks may make it slightly negative).
	return firstErr(
		intIn("threshold_ms", p.ThresholdMS, 1, ms(24*time.Hour)),
		intIn("silent_ms", p.SilentMS, -int64(MaxLagMS), int64(MaxLagMS)),
	)
}

// PresenceSubject carries one node's presence changes.
func PresenceSubject(cluster, node string) string {
	return EventRoot + "." + cluster + ".registry." + node + ".presence"
}

// AllPresence matches every node's presence changes in a cluster.
func AllPresence(cluster string) string { return EventRoot + "." + cluster + ".registry.*.presence" }

// NodeRecord is one node's registry entry (the value under RegistryKey).
type NodeRecord struct {
	Node     string   `json:"node"`
	Presence Presence `json:"presence"`
	// PresenceSince is when the node last went online or offline.
	PresenceSince time.Time `json:"presence_since"`
	// LastHeartbeat is when the registry received the last heartbeat (its
	// own clock: the sweeper compares it with its own clock too).
	LastHeartbeat time.Time `json:"last_heartbeat"`
	// HeartbeatAt is the heartbeat's own time (the node's clock).
	HeartbeatAt       time.Time `json:"heartbeat_at"`
	HeartbeatID       string    `json:"heartbeat_id"`
	Seq               uint64    `json:"seq"`
	IntervalMS        int64     `json:"interval_ms"`
	CPUPercent        float64   `json:"cpu_percent"`
	MemAvailableBytes uint64    `json:"mem_available_bytes"`
	MemTotalBytes     uint64    `json:"mem_total_bytes"`
	Load1             float64   `json:"load1"`
	ActiveChannels    *int      `json:"active_channels,omitempty"`
	ActiveCalls       *int      `json:"active_calls,omitempty"`
	Version           string    `json:"version"`
	// Beats counts the heartbeats recorded: a lost update shows as a gap.
	Beats uint64 `json:"beats"`
}

// RegistryKeyPrefix starts every registry key in the state bucket.
const RegistryKeyPrefix = "registry"

// RegistryKey is one node's registry entry in the state bucket.
func RegistryKey(cluster, node string) string {
	return RegistryKeyPrefix + "." + cluster + "." + node
}

// AllRegistryKeys matches every node's registry entry in a cluster.
func AllRegistryKeys(cluster string) string { return RegistryKeyPrefix + "." + cluster + ".*" }
