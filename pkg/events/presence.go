package events

import (
	"encoding/json"
	"fmt"
	"time"
)

// LiveRoot starts the presence beacons' subjects. Beacons are published on
// core NATS only and are never stored: at 10 to 20 a second per node they
// would drown the audit trail, and a missed one is worth nothing later. The
// decisions they lead to are audited, with the silence in their reason.
const LiveRoot = "fan.live"

// BeaconSubject carries one node's presence beacons.
func BeaconSubject(cluster, node string) string { return LiveRoot + "." + cluster + "." + node }

// AllBeacons matches every node's beacons in a cluster.
func AllBeacons(cluster string) string { return LiveRoot + "." + cluster + ".*" }

// Beacon says "this node's prober is alive and on the bus". The arbiter
// counts a node silent after a few missed beacons, which is how a crashed
// node or a cut link is noticed in a fraction of a second instead of after
// several heartbeat periods.
type Beacon struct {
	Node       string    `json:"node"`
	Seq        uint64    `json:"seq"`
	IntervalMS int64     `json:"interval_ms"`
	At         time.Time `json:"at"`
}

// Encode renders the beacon.
func (b Beacon) Encode() ([]byte, error) { return json.Marshal(b) }

// DecodeBeacon parses and validates a beacon.
func DecodeBeacon(data []byte) (Beacon, error) {
	var b Beacon
	if len(data) > 1024 {
		return b, fmt.Errorf("beacon: %w", ErrTooLarge)
	}
	if err := json.Unmarshal(data, &b); err != nil {
		return b, fmt.Errorf("beacon: %w", err)
	}
	if err := ValidToken("node", b.Node); err != nil {
		return b, fmt.Errorf("beacon: %w", err)
	}
	if b.IntervalMS <= 0 {
		return b, fmt.Errorf("beacon: %w: interval_ms", ErrMissingField)
	}
	if err := ValidBeaconInterval(b.IntervalMS); err != nil {
		return b, fmt.Errorf("beacon: %w", err)
	}
	return b, nil
}

// ArbiterPresenceSubject carries one arbiter replica's presence, on core
// NATS like the beacons (one token more, so AllBeacons never matches it).
func ArbiterPresenceSubject(cluster, node string) string {
	return LiveRoot + "." + cluster + ".arbiter." + node
}

// AllArbiterPresence matches every arbiter replica's presence in a cluster.
func AllArbiterPresence(cluster string) string { return LiveRoot + "." + cluster + ".arbiter.*" }

// ArbiterPresence says "this arbiter replica is running and on the bus".
// A standby replica (one on a PBX host) campaigns for the lease only while
// it hears no replica that is not a standby, and hands the lease back once
// it has heard one for a while.
type ArbiterPresence struct {
	Node       string    `json:"node"`
	Standby    bool      `json:"standby"`
	IntervalMS int64     `json:"interval_ms"`
	At         time.Time `json:"at"`
}

// Encode renders the presence.
func (p ArbiterPresence) Encode() ([]byte, error) { return json.Marshal(p) }

// DecodeArbiterPresence parses and validates an arbiter's presence.
func DecodeArbiterPresence(data []byte) (ArbiterPresence, error) {
	var p ArbiterPresence
	if len(data) > 1024 {
		return p, fmt.Errorf("arbiter presence: %w", ErrTooLarge)
	}
	if err := json.Unmarshal(data, &p); err != nil {
		return p, fmt.Errorf("arbiter presence: %w", err)
	}
	if err := ValidToken("node", p.Node); err != nil {
		return p, fmt.Errorf("arbiter presence: %w", err)
	}
	if p.IntervalMS <= 0 {
		return p, fmt.Errorf("arbiter presence: %w: interval_ms", ErrMissingField)
	}
	if err := ValidBeaconInterval(p.IntervalMS); err != nil {
		return p, fmt.Errorf("arbiter presence: %w", err)
	}
	return p, nil
}
