package events

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"
)

// One forged or corrupted event must not change a consumer's view for
// longer than a bound: every out-of-range number and oversized text is
// refused by Validate (and so by Decode), while the golden samples pass.
func TestPayloadBounds(t *testing.T) {
	hb := func(f func(*NodeHeartbeat)) Payload {
		h := samples()[TypeNodeHeartbeat].(NodeHeartbeat)
		f(&h)
		return h
	}
	huge := 1 << 40
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	long := strings.Repeat("x", MaxTextLen+1)
	cases := map[string]Payload{
		"heartbeat interval_ms 10^12":  hb(func(h *NodeHeartbeat) { h.IntervalMS = 1e12 }),
		"heartbeat interval_ms maxint": hb(func(h *NodeHeartbeat) { h.IntervalMS = math.MaxInt64 }),
		"heartbeat interval_ms 1":      hb(func(h *NodeHeartbeat) { h.IntervalMS = 1 }),
		"heartbeat cpu 1000%":          hb(func(h *NodeHeartbeat) { h.CPUPercent = 1000 }),
		"heartbeat cpu NaN":            hb(func(h *NodeHeartbeat) { h.CPUPercent = math.NaN() }),
		"heartbeat mem available>total": hb(func(h *NodeHeartbeat) {
			h.MemAvailableBytes, h.MemTotalBytes = 2, 1
		}),
		"heartbeat channels 2^40": hb(func(h *NodeHeartbeat) { h.ActiveChannels = &huge }),
		"heartbeat version 1k":    hb(func(h *NodeHeartbeat) { h.Version = strings.Repeat("v", 1000) }),
		"heartbeat negative load": hb(func(h *NodeHeartbeat) { h.Load1 = -1 }),
		"heartbeat pbx_system_name 1k": hb(func(h *NodeHeartbeat) {
			s := strings.Repeat("s", 1000)
			h.PBXSystemName = &s
		}),
		"transition rise 10^6":     HealthTransition{Check: "c", TargetNode: "n", Role: RoleSelf, From: HealthUp, To: HealthDown, Rise: 1e6, Fall: 1, Evidence: []Evidence{{At: at}}},
		"transition reason 2k":     HealthTransition{Check: "c", TargetNode: "n", Role: RoleSelf, From: HealthUp, To: HealthDown, Rise: 1, Fall: 1, Reason: long, Evidence: []Evidence{{At: at}}},
		"probe duration -1":        ProbeResult{Check: "c", TargetNode: "n", Kind: "tcp", Role: RoleSelf, OK: true, DurationMS: -1, At: at},
		"probe error 2k":           ProbeResult{Check: "c", TargetNode: "n", Kind: "tcp", Role: RoleSelf, Error: long, At: at},
		"decision reason 2k":       ArbiterDecision{Group: "g", Action: ActionHold, Reason: long, CausedBy: []string{"x"}},
		"permit for a year":        FailbackPermit{Group: "g", Window: "w", ValidFrom: at, ValidUntil: at.Add(365 * 24 * time.Hour)},
		"presence threshold 1y":    NodePresence{Node: "n", Presence: PresenceOnline, LastHeartbeat: at, ThresholdMS: 365 * 24 * 3600 * 1000},
		"weights cpu 500":          DispatcherWeights{Group: "g", Weights: map[string]int{"n": MinWeight}, Loads: map[string]NodeLoad{"n": {CPUPercent: 500}}, Reason: "r"},
		"replication negative lag": ReplicationStatus{Node: "n", Peer: "p", Tree: "t", LagMS: -MaxLagMS * 2},
	}
	for name, p := range cases {
		if err := p.Validate(); !errors.Is(err, ErrInvalidField) {
			t.Errorf("%s: Validate = %v, want ErrInvalidField", name, err)
		}
	}
	for typ, p := range samples() {
		if err := p.Validate(); err != nil {
			t.Errorf("golden sample %s refused: %v", typ, err)
		}
	}
	if _, err := DecodeBeacon([]byte(`{"node":"n1","seq":1,"interval_ms":1000000000000,"at":"2026-01-02T03:04:05Z"}`)); !errors.Is(err, ErrInvalidField) {
		t.Errorf("beacon interval_ms 10^12: %v, want ErrInvalidField", err)
	}
	if _, err := DecodeArbiterPresence([]byte(`{"node":"a1","interval_ms":9223372036854775807,"at":"2026-01-02T03:04:05Z"}`)); !errors.Is(err, ErrInvalidField) {
		t.Errorf("arbiter presence interval_ms maxint: %v, want ErrInvalidField", err)
	}
}
