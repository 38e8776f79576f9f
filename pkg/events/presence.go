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
	return b, nil
}
