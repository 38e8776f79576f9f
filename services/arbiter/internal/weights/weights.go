// Package weights ranks a group's nodes by load for a Kamailio dispatcher
// set (prefer low CPU and high free memory). It is pure: figures
// in, weight sets out, no clock and no I/O.
//
// Formula. For a node with CPU use c (percent of all its cores, 0..100) and
// free memory share m (available / total, 0..1):
//
//	score  = 0.6 × (1 − c/100) + 0.4 × m          (0..1)
//	weight = 1 + round(99 × score)                 (1..100)
//
// CPU weighs more because an Asterisk out of CPU garbles audio at once,
// while memory pressure builds up slowly. The floor of 1 keeps a loaded but
// healthy node in rotation; taking a node out is the eligibility rule's job
// (dispatcher state d), never the weight's.
//
// Hysteresis. A node's published weight changes only when its computed
// weight differs from the published one by at least Threshold in Confirm
// consecutive heartbeats; one busy second then moves nothing, and a set is
// published (and the proxy reloaded) only on a lasting change.
package weights

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"

	"github.com/fanpbx/fan/pkg/events"
)

// Defaults.
const (
	DefaultThreshold = 10
	DefaultConfirm   = 3
)

// Weight is the formula above.
func Weight(l events.NodeLoad) int {
	cpu := clamp(l.CPUPercent/100, 0, 1)
	mem := clamp(l.MemFreeShare, 0, 1)
	score := 0.6*(1-cpu) + 0.4*mem
	return events.MinWeight + int(math.Round(float64(events.MaxWeight-events.MinWeight)*score))
}

func clamp(v, lo, hi float64) float64 {
	if math.IsNaN(v) {
		return lo
	}
	return math.Min(hi, math.Max(lo, v))
}

// Load turns a heartbeat's figures into a NodeLoad; ok is false when the
// heartbeat carries no memory figures (nothing to rank on).
func Load(hb *events.NodeHeartbeat) (events.NodeLoad, bool) {
	if hb.MemTotalBytes == 0 {
		return events.NodeLoad{}, false
	}
	return events.NodeLoad{CPUPercent: hb.CPUPercent, MemFreeShare: float64(hb.MemAvailableBytes) / float64(hb.MemTotalBytes)}, true
}

// Tracker applies the hysteresis for one group.
type Tracker struct {
	threshold, confirm int
	published          map[string]int
	loads              map[string]events.NodeLoad
	streak             map[string]int
}

// New returns a tracker; zero values take the defaults.
func New(threshold, confirm int) *Tracker {
	if threshold <= 0 {
		threshold = DefaultThreshold
	}
	if confirm <= 0 {
		confirm = DefaultConfirm
	}
	return &Tracker{threshold: threshold, confirm: confirm,
		published: map[string]int{}, loads: map[string]events.NodeLoad{}, streak: map[string]int{}}
}

// Observe takes one heartbeat's load of node and reports whether the
// published set changed; if so, Set returns it. A node seen for the first
// time enters the set at once (it had no weight to protect).
func (t *Tracker) Observe(node string, l events.NodeLoad) (changed bool, reason string) {
	w := Weight(l)
	old, known := t.published[node]
	switch {
	case !known:
		t.published[node], t.loads[node] = w, l
		return true, fmt.Sprintf("%s enters with weight %d", node, w)
	case abs(w-old) < t.threshold:
		t.streak[node] = 0
		return false, ""
	}
	t.streak[node]++
	if t.streak[node] < t.confirm {
		return false, ""
	}
	t.streak[node] = 0
	t.published[node], t.loads[node] = w, l
	return true, fmt.Sprintf("%s weight %d -> %d for %d heartbeats (cpu %.0f%%, free memory %.0f%%)",
		node, old, w, t.confirm, l.CPUPercent, 100*l.MemFreeShare)
}

// Set is the published weights and the loads they came from.
func (t *Tracker) Set(group, reason string) events.DispatcherWeights {
	return events.DispatcherWeights{Group: group, Weights: maps.Clone(t.published), Loads: maps.Clone(t.loads), Reason: reason}
}

// String renders the published set stably, for logs.
func (t *Tracker) String() string {
	var parts []string
	for _, n := range slices.Sorted(maps.Keys(t.published)) {
		parts = append(parts, fmt.Sprintf("%s=%d", n, t.published[n]))
	}
	return strings.Join(parts, " ")
}

func abs(v int) int {
	if v < 0 {
		return -v
	}
	return v
}
