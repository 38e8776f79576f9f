// Package chaos runs fan's real binaries in a namespace lab under a
// randomized, seeded fault schedule and checks fan's invariants (docs/invariants.md) from
// the outside: an ARP observer in the client namespace counts time with two
// MACs answering for the floating IP, a SIP client counts time with no
// answer while a healthy node existed, and the audit trail is searched for
// commands executed under a stale epoch. See README.md for the bounds.
package chaos

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"
)

// Kind is a kind of fault.
type Kind string

const (
	// KillService: kill -9 of one fan service, restarted after Hold.
	KillService Kind = "kill-service"
	// NATSRestart: fan-nats stopped, started again on the same store after Hold.
	NATSRestart Kind = "nats-restart"
	// PBXFreeze: the node's AMI accepts TCP and never answers, SIP stops
	// (stack.KillPBX), thawed after Hold.
	PBXFreeze Kind = "pbx-freeze"
	// LinkCut: the node's port on the bridge goes down, up again after Hold.
	LinkCut Kind = "link-cut"
	// NATSPartition: iptables in the node's namespace drops everything to
	// and from the control host, removed after Hold.
	NATSPartition Kind = "nats-partition"
	// NATSKill: kill -9 of one server of a three-server bus (the holder's,
	// the standby's or the witness's), restarted after Hold.
	NATSKill Kind = "nats-kill"
	// RoutePartition: one server of a three-server bus cut off from the
	// other two (its cluster routes only; its clients stay connected to it),
	// healed after Hold.
	RoutePartition Kind = "route-partition"
)

// Kinds lists every fault kind.
var Kinds = []Kind{KillService, NATSRestart, PBXFreeze, LinkCut, NATSPartition, NATSKill, RoutePartition}

// serverFault is true for the faults of one NATS server.
func (k Kind) serverFault() bool { return k == NATSKill || k == RoutePartition }

// Target says where a fault lands. Node faults name a role, not a node:
// which node holds the address is only known when the fault is injected
// (the arbiter does not fail back, so the holder wanders), and naming the
// role keeps a replayed schedule meaningful.
type Target string

const (
	Holder  Target = "holder"
	Standby Target = "standby"
	Control Target = "ctl"
)

// Services that may be killed, by where they run.
var (
	NodeServices    = []string{"fan-prober", "fan-ipmover", "fan-replicator"}
	ControlServices = []string{"fan-arbiter", "fan-scheduler"}
)

// Fault is one step of a schedule: wait at least Gap (and until the system
// has settled), inject, wait Hold, heal.
type Fault struct {
	Kind    Kind
	Target  Target
	Service string // KillService only
	Gap     time.Duration
	Hold    time.Duration
}

func (f Fault) String() string {
	s := fmt.Sprintf("%s %s", f.Kind, f.Target)
	if f.Service != "" {
		s += " " + f.Service
	}
	return fmt.Sprintf("%s hold=%v", s, f.Hold)
}

// AffectsNode reports whether the fault takes a PBX node out of the healthy
// set while it is active (a killed control service does not: the nodes
// still serve).
func (f Fault) AffectsNode() bool {
	return (f.Target == Holder || f.Target == Standby) && !f.Kind.serverFault()
}

// Limits bound a generated schedule. The ranges are chosen so that every
// fault lasts long enough to be detected (longer than the arbiter's silence
// threshold for some of them, shorter for others), and the gap leaves the
// system time to settle before the next one.
type Limits struct {
	Gap        [2]time.Duration
	Hold       map[Kind][2]time.Duration
	HolderBias float64 // probability a node fault hits the holder
	// Settle is the time budgeted after each heal for the system to settle
	// (the runner waits on conditions; this only sizes the schedule).
	Settle time.Duration
	// ServerFaults, for a three-server bus (the colocated topology), hits
	// one NATS server at a time: NATSKill where a single bus would restart
	// NATS, RoutePartition where it would partition a node from it.
	ServerFaults bool
}

// DefaultLimits are the chaos run's ranges.
func DefaultLimits() Limits {
	return Limits{
		Gap: [2]time.Duration{3 * time.Second, 8 * time.Second},
		Hold: map[Kind][2]time.Duration{
			KillService:    {500 * time.Millisecond, 6 * time.Second},
			NATSRestart:    {500 * time.Millisecond, 5 * time.Second},
			PBXFreeze:      {2 * time.Second, 8 * time.Second},
			LinkCut:        {2 * time.Second, 10 * time.Second},
			NATSPartition:  {2 * time.Second, 10 * time.Second},
			NATSKill:       {500 * time.Millisecond, 6 * time.Second},
			RoutePartition: {2 * time.Second, 10 * time.Second},
		},
		HolderBias: 0.6,
		Settle:     4 * time.Second,
	}
}

// Generate makes the schedule for seed that fits in total: the same seed
// and limits always give the same schedule. Faults run one at a time, so a
// fault never overlaps another and at least one PBX node is healthy at
// every instant (never both nodes faulted; never a holder fault while the
// standby is down, which no failover system could serve).
func Generate(seed uint64, total time.Duration, lim Limits) []Fault {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	between := func(rg [2]time.Duration) time.Duration {
		if rg[1] <= rg[0] {
			return rg[0]
		}
		// Whole milliseconds keep printed schedules readable.
		return (rg[0] + time.Duration(r.Int64N(int64(rg[1]-rg[0])))).Truncate(time.Millisecond)
	}
	var out []Fault
	used := time.Duration(0)
	for {
		f := Fault{Gap: between(lim.Gap)}
		// Weights: service kills are the most varied fault, so they come up
		// most often; the rest share the remainder evenly.
		switch w := r.IntN(100); {
		case w < 30:
			f.Kind = KillService
		case w < 45:
			f.Kind = NATSRestart
		case w < 62:
			f.Kind = PBXFreeze
		case w < 80:
			f.Kind = LinkCut
		default:
			f.Kind = NATSPartition
		}
		if lim.ServerFaults {
			switch f.Kind {
			case NATSRestart:
				f.Kind = NATSKill
			case NATSPartition:
				f.Kind = RoutePartition
			}
		}
		f.Hold = between(lim.Hold[f.Kind])
		switch f.Kind {
		case NATSKill, RoutePartition:
			// The holder's, the standby's or the witness's server.
			f.Target = []Target{Holder, Standby, Control}[r.IntN(3)]
		case NATSRestart:
			f.Target = Control
		case KillService:
			all := len(NodeServices) + len(ControlServices)
			if i := r.IntN(all); i < len(NodeServices) {
				f.Service = NodeServices[i]
				f.Target = nodeRole(r, lim.HolderBias)
			} else {
				f.Service = ControlServices[i-len(NodeServices)]
				f.Target = Control
			}
		default:
			f.Target = nodeRole(r, lim.HolderBias)
		}
		cost := f.Gap + f.Hold + lim.Settle
		if used+cost > total {
			return out
		}
		used += cost
		out = append(out, f)
	}
}

func nodeRole(r *rand.Rand, holderBias float64) Target {
	if r.Float64() < holderBias {
		return Holder
	}
	return Standby
}

// Check reports the first way a schedule breaks the generator's rules; the
// tests use it, and the runner refuses a schedule that fails it.
func Check(s []Fault, lim Limits) error {
	for i, f := range s {
		rg, ok := lim.Hold[f.Kind]
		if !ok {
			return fmt.Errorf("fault %d: unknown kind %q", i, f.Kind)
		}
		if f.Hold < rg[0] || f.Hold > rg[1] {
			return fmt.Errorf("fault %d (%s): hold %v outside %v..%v", i, f.Kind, f.Hold, rg[0], rg[1])
		}
		if f.Gap < lim.Gap[0] {
			return fmt.Errorf("fault %d (%s): gap %v below %v: the system gets no time to settle", i, f.Kind, f.Gap, lim.Gap[0])
		}
		switch f.Kind {
		case NATSRestart:
			if f.Target != Control || f.Service != "" {
				return fmt.Errorf("fault %d: nats restart must target ctl", i)
			}
		case NATSKill, RoutePartition:
			if !lim.ServerFaults || f.Service != "" || (f.Target != Holder && f.Target != Standby && f.Target != Control) {
				return fmt.Errorf("fault %d: %s needs a three-server bus and a server's host", i, f.Kind)
			}
		case KillService:
			node := f.Target == Holder || f.Target == Standby
			if node && !slices.Contains(NodeServices, f.Service) || f.Target == Control && !slices.Contains(ControlServices, f.Service) ||
				!node && f.Target != Control {
				return fmt.Errorf("fault %d: service %q cannot be killed on %s", i, f.Service, f.Target)
			}
		default:
			if !f.AffectsNode() || f.Service != "" {
				return fmt.Errorf("fault %d: %s must target a node role", i, f.Kind)
			}
		}
	}
	return nil
}

// ParseSchedule reads a schedule written by hand, to replay one sequence of
// faults on purpose (a shape a seeded run met once, say): faults separated
// by ";", each "kind target [service] hold=D [gap=D]" as Fault.String
// prints it, gap defaulting to the limits' shortest. The runner checks it
// as it checks a generated one.
func ParseSchedule(text string, lim Limits) ([]Fault, error) {
	var out []Fault
	for i, part := range strings.Split(text, ";") {
		words := strings.Fields(part)
		if len(words) == 0 {
			continue
		}
		f := Fault{Gap: lim.Gap[0]}
		var rest []string
		for _, w := range words {
			key, val, ok := strings.Cut(w, "=")
			if !ok {
				rest = append(rest, w)
				continue
			}
			d, err := time.ParseDuration(val)
			if err != nil {
				return nil, fmt.Errorf("fault %d: %s: %w", i, key, err)
			}
			switch key {
			case "hold":
				f.Hold = d
			case "gap":
				f.Gap = d
			default:
				return nil, fmt.Errorf("fault %d: unknown setting %q (hold or gap)", i, key)
			}
		}
		if len(rest) < 2 || len(rest) > 3 {
			return nil, fmt.Errorf("fault %d: %q: want \"kind target [service] hold=D [gap=D]\"", i, strings.TrimSpace(part))
		}
		f.Kind, f.Target = Kind(rest[0]), Target(rest[1])
		if len(rest) == 3 {
			f.Service = rest[2]
		}
		out = append(out, f)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("schedule %q has no fault", text)
	}
	return out, Check(out, lim)
}
