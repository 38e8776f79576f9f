package bus

import (
	"time"

	"github.com/fanpbx/fan/pkg/platform/config"
)

// Limits bound what fan keeps on every NATS server holding a replica. Each
// stream and the state bucket has a byte limit and discards its oldest
// messages when it reaches it, so a busy or misbehaving cluster cannot fill
// a PBX host's disk; fan_stream_bytes against fan_stream_max_bytes (the
// arbiter exports both) warns well before. Sizes are in MiB.
type Limits struct {
	// EventsMiB bounds the audit stream (default 1024, 64..1048576).
	EventsMiB int64 `yaml:"events_mib"`
	// LiveMiB bounds the live stream (default 256, 16..65536).
	LiveMiB int64 `yaml:"live_mib"`
	// LiveMaxAge is how long the live stream keeps heartbeats and probe
	// results (default 6h, 10m..168h).
	LiveMaxAge config.Duration `yaml:"live_max_age"`
	// CommandsMiB bounds the command stream (default 256, 16..65536).
	CommandsMiB int64 `yaml:"commands_mib"`
	// StateMiB bounds the state bucket (default 64, 16..16384).
	StateMiB int64 `yaml:"state_mib"`
	// CallsMiB bounds the bucket of calls in progress (default 64,
	// 16..16384).
	CallsMiB int64 `yaml:"calls_mib"`
}

// Default limits: see Limits. The audit stream at the lab's check rates
// grows by well under 10 MB per node per day, so 1 GiB keeps 90 days of a
// small cluster with room for a bad week.
const (
	DefaultEventsMiB   = 512
	DefaultLiveMiB     = 128
	DefaultLiveMaxAge  = 6 * time.Hour
	DefaultCommandsMiB = 64
	DefaultStateMiB    = 32
	// DefaultCallsMiB holds the records of 4,096 calls on each of four
	// nodes (about 1 KB each, measured), with room for the markers a day
	// of 300,000 ended calls leaves (about 130 bytes each).
	DefaultCallsMiB = 64
)

const mib = 1 << 20

func (l *Limits) defaults() {
	def := func(v *int64, d int64) {
		if *v == 0 {
			*v = d
		}
	}
	def(&l.EventsMiB, DefaultEventsMiB)
	def(&l.LiveMiB, DefaultLiveMiB)
	def(&l.CommandsMiB, DefaultCommandsMiB)
	def(&l.StateMiB, DefaultStateMiB)
	def(&l.CallsMiB, DefaultCallsMiB)
	if l.LiveMaxAge == 0 {
		l.LiveMaxAge = config.Duration(DefaultLiveMaxAge)
	}
}

func (l *Limits) validate() error {
	// Zero is the default, filled by Defaults.
	orZero := func(key string, v, lo, hi int64) error {
		if v == 0 {
			return nil
		}
		return config.IntIn(key, v, lo, hi)
	}
	return config.Join(
		orZero("bus.limits.events_mib", l.EventsMiB, 64, 1<<20),
		orZero("bus.limits.live_mib", l.LiveMiB, 16, 1<<16),
		orZero("bus.limits.commands_mib", l.CommandsMiB, 16, 1<<16),
		orZero("bus.limits.state_mib", l.StateMiB, 16, 1<<14),
		orZero("bus.limits.calls_mib", l.CallsMiB, 16, 1<<14),
		config.DurationOrZero("bus.limits.live_max_age", l.LiveMaxAge.D(), 10*time.Minute, 7*24*time.Hour),
	)
}

// TotalMiB is the most fan's streams and buckets take on one server that
// holds a replica of each (the replicator's object stores apart: they hold
// the replicated trees and are sized by them).
func (l Limits) TotalMiB() int64 {
	return l.EventsMiB + l.LiveMiB + l.CommandsMiB + l.StateMiB + l.CallsMiB
}
