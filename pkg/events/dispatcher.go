package events

import "fmt"

// Load-aware preference: the arbiter ranks a group's active
// nodes by their heartbeats' CPU and free memory and publishes the weights
// a Kamailio dispatcher set should use; the dispatcher executor applies
// them. A new set is published only when a weight moved far enough for
// long enough (hysteresis), so the proxy is not reloaded on every beat.

// TypeDispatcherWeights is the wire name of DispatcherWeights.
const TypeDispatcherWeights Type = "dispatcher.weights"

func init() {
	register(TypeDispatcherWeights, func() Decoded { return &DispatcherWeights{} })
}

// Weight bounds: Kamailio's dispatcher treats weights as percentages.
const (
	MinWeight = 1
	MaxWeight = 100
)

// NodeLoad is the figures a weight was computed from.
type NodeLoad struct {
	CPUPercent float64 `json:"cpu_percent"`
	// MemFreeShare is available / total memory, 0..1.
	MemFreeShare float64 `json:"mem_free_share"`
}

// DispatcherWeights is the weight of every ranked node of a group. Nodes
// not listed have no figures (never heartbeated) and keep their weight.
type DispatcherWeights struct {
	Group   string              `json:"group"`
	Weights map[string]int      `json:"weights"`
	Loads   map[string]NodeLoad `json:"loads,omitempty"`
	// Reason names the nodes whose change triggered this set.
	Reason string `json:"reason"`
}

func (DispatcherWeights) EventType() Type    { return TypeDispatcherWeights }
func (DispatcherWeights) SchemaVersion() int { return 1 }
func (w DispatcherWeights) subject(e Envelope) string {
	return WeightsSubject(e.Cluster, w.Group)
}

func (w DispatcherWeights) Validate() error {
	if err := ValidToken("group", w.Group); err != nil {
		return err
	}
	if len(w.Weights) == 0 {
		return fmt.Errorf("%w: weights", ErrMissingField)
	}
	for n, v := range w.Weights {
		if err := ValidToken("weights key", n); err != nil {
			return err
		}
		if v < MinWeight || v > MaxWeight {
			return fmt.Errorf("%w: weight of %s is %d, want %d..%d", ErrInvalidField, n, v, MinWeight, MaxWeight)
		}
	}
	if w.Reason == "" {
		return fmt.Errorf("%w: reason", ErrMissingField)
	}
	if err := firstErr(textIn("reason", w.Reason, MaxTextLen), listIn("weights", len(w.Weights), MaxListLen), listIn("loads", len(w.Loads), MaxListLen)); err != nil {
		return err
	}
	for n, l := range w.Loads {
		if err := firstErr(floatIn("loads["+n+"].cpu_percent", l.CPUPercent, 0, 100), floatIn("loads["+n+"].mem_free_share", l.MemFreeShare, 0, 1)); err != nil {
			return err
		}
	}
	return nil
}

// WeightsSubject carries one group's dispatcher weight sets.
func WeightsSubject(cluster, group string) string {
	return EventRoot + "." + cluster + ".arbiter." + group + ".weights"
}
