package bench

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/fanpbx/fan/lab/stack"
	"github.com/fanpbx/fan/pkg/events"
	"github.com/nats-io/nats.go"
)

// Beacons records when each node's presence beacons reach the control
// host, the arbiter's side of the bus: the last one a crashed or cut-off
// holder got through is where its silence starts.
type Beacons struct {
	mu  sync.Mutex
	at  map[string][]time.Time
	sub *nats.Subscription
}

// beaconsKept bounds the arrivals kept per node (a minute at 50 ms): a
// cycle only looks back to its own fault.
const beaconsKept = 1200

// WatchBeacons subscribes to every node's beacons from the control host.
func (f *Fan) WatchBeacons(cluster string) (*Beacons, error) {
	nc, _, err := f.bus()
	if err != nil {
		return nil, err
	}
	b := &Beacons{at: map[string][]time.Time{}}
	b.sub, err = nc.Subscribe(events.AllBeacons(cluster), func(m *nats.Msg) {
		now := time.Now()
		bc, err := events.DecodeBeacon(m.Data)
		if err != nil {
			return
		}
		b.mu.Lock()
		defer b.mu.Unlock()
		a := append(b.at[bc.Node], now)
		if len(a) > beaconsKept {
			a = slices.Delete(a, 0, len(a)-beaconsKept)
		}
		b.at[bc.Node] = a
	})
	if err != nil {
		return nil, fmt.Errorf("subscribe to beacons: %w", err)
	}
	return b, nil
}

// LastBefore is the arrival of node's last beacon at or before t (zero if none).
func (b *Beacons) LastBefore(node string, t time.Time) time.Time {
	b.mu.Lock()
	defer b.mu.Unlock()
	a := b.at[node]
	i, _ := slices.BinarySearchFunc(a, t, func(x, t time.Time) int { return x.Compare(t) })
	// a[i] is the first arrival at or after t.
	if i < len(a) && a[i].Equal(t) {
		return a[i]
	}
	if i == 0 {
		return time.Time{}
	}
	return a[i-1]
}

// Close stops recording.
func (b *Beacons) Close() {
	if b != nil && b.sub != nil {
		_ = b.sub.Unsubscribe()
	}
}

// Phases is where one fan failover's time went, each mark measured from
// the fault (negative: before it). A mark the trail did not have is NaN.
type Phases struct {
	Cycle Cycle
	// LastBeacon: the holder's last beacon to reach the control host.
	// Silent: LastBeacon plus the arbiter's silence limit, the earliest the
	// arbiter may call the holder silent.
	LastBeacon, Silent float64
	// PeerDown: the peer's transition saying it cannot reach the holder
	// (the prober's clock, which is the same machine's).
	PeerDown float64
	// Decided: the failover decision (the arbiter's clock), and what made
	// it decide: a tick (the silence came last) or an event (the peer's
	// transition came last).
	Decided float64
	Trigger events.Trigger
	// Received, Recorded and Announced: the new holder's executor got the
	// claim, wrote its at-most-once record (the one disk write on the
	// path), and sent its first gratuitous ARP (the claim's result's steps).
	Received, Recorded, Announced float64
	// Answered: the client's first answer from the new holder.
	Answered float64
}

// Explain finds each cycle's marks in fan's audit trail. lastBeacon gives
// the holder's last beacon before a time (nil: not recorded); silence is
// the arbiter's silence limit (misses × beacon interval + grace).
func Explain(cs []Cycle, evs []stack.Event, lastBeacon func(node string, before time.Time) time.Time, silence time.Duration) []Phases {
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	results := map[string]*events.CommandResult{}
	for _, e := range evs {
		if r, ok := e.Payload.(*events.CommandResult); ok && r.CommandType == events.TypeClaimIP {
			results[r.CommandID] = r
		}
	}
	out := make([]Phases, 0, len(cs))
	for _, cy := range cs {
		answered := cy.At.Add(cy.Took)
		p := Phases{Cycle: cy, Answered: ms(cy.Took)}
		p.LastBeacon, p.Silent, p.PeerDown, p.Decided = math.NaN(), math.NaN(), math.NaN(), math.NaN()
		p.Received, p.Recorded, p.Announced = math.NaN(), math.NaN(), math.NaN()
		if lastBeacon != nil {
			if lb := lastBeacon(cy.From, answered); !lb.IsZero() {
				p.LastBeacon, p.Silent = ms(lb.Sub(cy.At)), ms(lb.Add(silence).Sub(cy.At))
			}
		}
		var d *events.ArbiterDecision
		for _, e := range evs {
			if e.Env.Time.Before(cy.At) || e.Env.Time.After(answered.Add(time.Second)) {
				continue
			}
			switch v := e.Payload.(type) {
			case *events.HealthTransition:
				if math.IsNaN(p.PeerDown) && v.Role == events.RolePeer && v.TargetNode == cy.From && v.To == events.HealthDown {
					p.PeerDown = ms(e.Env.Time.Sub(cy.At))
				}
			case *events.ArbiterDecision:
				if d == nil && v.From == cy.From && (v.Action == events.ActionFailover || v.Action == events.ActionRetry) {
					d = v
					p.Decided, p.Trigger = ms(e.Env.Time.Sub(cy.At)), v.Trigger
				}
			}
		}
		if d != nil {
			for _, id := range d.Commands {
				r := results[id]
				if r == nil {
					continue
				}
				for _, s := range r.Steps {
					switch s.Name {
					case events.StepReceived:
						p.Received = ms(s.At.Sub(cy.At))
					case events.StepRecorded:
						p.Recorded = ms(s.At.Sub(cy.At))
					case events.StepAnnounced:
						p.Announced = ms(s.At.Sub(cy.At))
					}
				}
			}
		}
		out = append(out, p)
	}
	return out
}

// String renders one cycle's marks for -v.
func (p Phases) String() string {
	return fmt.Sprintf("%s->%s last_beacon=%.0f silent=%.0f peer_down=%.0f decided=%.0f(%s) received=%.0f recorded=%.0f announced=%.0f answered=%.0f",
		p.Cycle.From, p.Cycle.To, p.LastBeacon, p.Silent, p.PeerDown, p.Decided, p.Trigger, p.Received, p.Recorded, p.Announced, p.Answered)
}

// BreakdownLine renders the median and the worst of each mark over a
// scenario's cycles, and how many decisions the silence (a tick) or the
// peer's transition (an event) triggered:
//
//	breakdown scenario=<s> cycles=<n> last_beacon_ms=<p50>/<max> silent_ms=... peer_down_ms=... decided_ms=... received_ms=... recorded_ms=... announced_ms=... answered_ms=... on_tick=<n> on_event=<n>
func BreakdownLine(s Scenario, ps []Phases) string {
	var b strings.Builder
	fmt.Fprintf(&b, "breakdown scenario=%s cycles=%d", s, len(ps))
	marks := []struct {
		name string
		get  func(Phases) float64
	}{
		{"last_beacon", func(p Phases) float64 { return p.LastBeacon }},
		{"silent", func(p Phases) float64 { return p.Silent }},
		{"peer_down", func(p Phases) float64 { return p.PeerDown }},
		{"decided", func(p Phases) float64 { return p.Decided }},
		{"received", func(p Phases) float64 { return p.Received }},
		{"recorded", func(p Phases) float64 { return p.Recorded }},
		{"announced", func(p Phases) float64 { return p.Announced }},
		{"answered", func(p Phases) float64 { return p.Answered }},
	}
	for _, m := range marks {
		var v []float64
		for _, p := range ps {
			if x := m.get(p); !math.IsNaN(x) {
				v = append(v, x)
			}
		}
		fmt.Fprintf(&b, " %s_ms=%.0f/%.0f", m.name, median(v), maxOf(v))
	}
	triggers := map[events.Trigger]int{}
	for _, p := range ps {
		triggers[p.Trigger]++
	}
	fmt.Fprintf(&b, " on_tick=%d on_event=%d", triggers[events.TriggerTick], triggers[events.TriggerEvent])
	return b.String()
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func maxOf(v []float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	return slices.Max(v)
}
