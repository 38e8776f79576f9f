package bus

import (
	"context"
	"fmt"
	"time"

	"github.com/fanpbx/fan/pkg/events"
)

// Stored is one event read back from a stream.
type Stored struct {
	Env     events.Envelope
	Payload events.Decoded
	Stream  string
	Seq     uint64
	// At is when the stream stored it, by the stream's clock: what
	// WatchOptions.Since is compared with.
	At time.Time
}

// ReadAll reads o's subjects to their end (o.ToEnd is implied) and returns
// the events in one order: each stream's own, and between the audit and the
// live stream the order of their producers' stamps (events.Envelope.Time),
// which is the order the arbiter read them in up to the clock differences
// between hosts. A replay of the arbiter's decisions needs that order.
func (b *Bus) ReadAll(ctx context.Context, o WatchOptions) ([]Stored, error) {
	per := map[string][]Stored{}
	var order []string
	for _, s := range o.Subjects {
		st, err := events.StreamOf(s)
		if err != nil {
			return nil, fmt.Errorf("read events: %w", err)
		}
		if _, ok := per[st]; !ok {
			order = append(order, st)
			per[st] = nil
		}
	}
	for _, st := range order {
		so := o
		so.ToEnd, so.Subjects = true, nil
		for _, s := range o.Subjects {
			if in, _ := events.StreamOf(s); in == st {
				so.Subjects = append(so.Subjects, s)
			}
		}
		var out []Stored
		err := b.watch(ctx, so, func(env events.Envelope, p events.Decoded, seq uint64, at time.Time) {
			out = append(out, Stored{Env: env, Payload: p, Stream: st, Seq: seq, At: at})
		})
		if err != nil {
			return nil, err
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("read %s: %w", st, ctx.Err())
		}
		per[st] = out
	}
	var all []Stored
	for _, st := range order {
		all = mergeByTime(all, per[st])
	}
	return all, nil
}

// mergeByTime merges two lists, each in its own stream order, keeping both
// orders and taking the earlier stamp first (a on a tie).
func mergeByTime(a, b []Stored) []Stored {
	out := make([]Stored, 0, len(a)+len(b))
	for len(a) > 0 && len(b) > 0 {
		if b[0].Env.Time.Before(a[0].Env.Time) {
			out, b = append(out, b[0]), b[1:]
		} else {
			out, a = append(out, a[0]), a[1:]
		}
	}
	return append(append(out, a...), b...)
}
