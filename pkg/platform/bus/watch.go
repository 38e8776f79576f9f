package bus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/nats-io/nats.go/jetstream"
)

// WatchOptions selects which events to read and from where.
type WatchOptions struct {
	Subjects []string
	// Since starts at the first event at or after this time; zero means
	// only events published from now on. All starts at the beginning.
	Since time.Time
	All   bool
	// LastPerSubject starts with the newest stored event of each subject
	// (what is in force now, for state restated periodically), then new ones.
	LastPerSubject bool
	// ToEnd ends the watch once every stream it reads has delivered what
	// it held when the watch began (a message with none pending after it,
	// refused ones included), or once nothing has arrived for a second
	// (nothing matched): reading a trail rather than following it.
	ToEnd bool
}

// endQuiet is how long a ToEnd watch waits for a first or next message.
const endQuiet = time.Second

// watchEnd ends a ToEnd watch. The quiet second counts from when every
// stream's consumer exists, so a slow create does not end a read early.
type watchEnd struct {
	mu       sync.Mutex
	left     map[string]bool // streams not yet read to their end
	unready  map[string]bool // streams whose consumer is not made yet
	allReady chan struct{}
	arrived  chan struct{}
	stop     context.CancelFunc
}

func newWatchEnd(ctx context.Context, streams []string, stop context.CancelFunc) *watchEnd {
	e := &watchEnd{left: map[string]bool{}, unready: map[string]bool{}, allReady: make(chan struct{}),
		arrived: make(chan struct{}, 1), stop: stop}
	for _, s := range streams {
		e.left[s], e.unready[s] = true, true
	}
	go func() {
		select {
		case <-e.allReady:
		case <-ctx.Done():
			return
		}
		for {
			select {
			case <-e.arrived:
			case <-time.After(endQuiet):
				stop()
				return
			case <-ctx.Done():
				return
			}
		}
	}()
	return e
}

// ready notes that stream's consumer is made.
func (e *watchEnd) ready(stream string) {
	if e == nil {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.unready[stream] {
		delete(e.unready, stream)
		if len(e.unready) == 0 {
			close(e.allReady)
		}
	}
}

// seen notes a message of stream with pending more after it.
func (e *watchEnd) seen(stream string, pending uint64) {
	if e == nil {
		return
	}
	select {
	case e.arrived <- struct{}{}:
	default:
	}
	if pending > 0 {
		return
	}
	e.mu.Lock()
	delete(e.left, stream)
	done := len(e.left) == 0
	e.mu.Unlock()
	if done {
		e.stop()
	}
}

// EventHandler receives decoded events one at a time, in stream order.
// seq is the event's sequence in the stream it was read from (WatchOptions
// may span the audit and the live stream: see Watch).
type EventHandler func(env events.Envelope, p events.Decoded, seq uint64)

// Watch reads the audit stream and calls fn for every event that decodes,
// in stream order, each once, until ctx ends. Events that do not decode, or
// do not match the subject they arrived on (events.DecodeFrom), are refused
// (logged, counted in fan_events_refused_total) and skipped: one bad
// producer must not stop a consumer, and no handler ever sees a node name
// its subject does not vouch for.
//
// It reads through an ephemeral consumer of one replica, which lives on one
// server and dies with it. Watch recreates it itself, from the event after
// the last one delivered, rather than through the library's ordered
// consumer: that one retries its re-creation with 10 s request timeouts and
// a backoff growing to 10 s, and after a server's crash (not a clean
// shutdown) the survivors keep placing new consumers on the dead server for
// a while, so a watcher stayed deaf for 10 to 40 s, an arbiter blind
// through the very failover it was there for. See watcher.
//
// Each subject filter is read from the stream that stores it
// (events.StreamOf): audited events and commands from the audit stream,
// heartbeats and probe results from the live stream, each stream through a
// consumer of its own. Calls are one at a time, in each stream's order, but
// in no common order across the two: a handler that mixes them orders by
// the events' own times (a heartbeat's check states carry theirs).
func (b *Bus) Watch(ctx context.Context, o WatchOptions, fn EventHandler) error {
	return b.watch(ctx, o, func(env events.Envelope, p events.Decoded, seq uint64, _ time.Time) { fn(env, p, seq) })
}

// watch is Watch whose handler also gets the time the stream stored each
// event (its own clock, which WatchOptions.Since is compared with).
func (b *Bus) watch(ctx context.Context, o WatchOptions, fn func(env events.Envelope, p events.Decoded, seq uint64, stored time.Time)) error {
	byStream := map[string][]string{}
	var order []string
	for _, s := range o.Subjects {
		st, err := events.StreamOf(s)
		if err != nil {
			return fmt.Errorf("watch events: %w", err)
		}
		if _, ok := byStream[st]; !ok {
			order = append(order, st)
		}
		byStream[st] = append(byStream[st], s)
	}
	if len(order) == 0 {
		order = []string{EventsStream}
	}
	var end *watchEnd
	parent := ctx
	if o.ToEnd {
		var cancel context.CancelFunc
		ctx, cancel = context.WithCancel(ctx)
		defer cancel()
		end = newWatchEnd(ctx, order, cancel)
	}
	// One call at a time across the streams (taken under each watcher's
	// own lock, never the other way round).
	var fnMu sync.Mutex
	errs := make([]error, len(order))
	var wg sync.WaitGroup
	for i, st := range order {
		so := o
		so.Subjects = byStream[st]
		w := &watcher{b: b, stream: st, what: "watch " + st, opts: so, end: end, restart: make(chan int, 1),
			deliver: func(m jetstream.Msg, seq uint64, stored time.Time) {
				if env, p, ok := b.DecodeFrom(m.Subject(), m.Data()); ok {
					fnMu.Lock()
					fn(env, p, seq, stored)
					fnMu.Unlock()
				}
			}}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = w.run(ctx)
		}()
	}
	wg.Wait()
	if o.ToEnd && parent.Err() == nil {
		// Ended by reaching the end, not by the caller.
		for i, err := range errs {
			if errors.Is(err, context.Canceled) {
				errs[i] = nil
			}
		}
	}
	return errors.Join(errs...)
}

// KVHandler receives one key of the state bucket: its value and revision,
// or deleted (a delete or purge, value nil).
type KVHandler func(key string, value []byte, deleted bool, revision uint64)

// kvOperationHeader is the header NATS's key-value layer marks a delete or
// purge with (its name on the wire, not fan's).
const kvOperationHeader = "KV-Operation"

// WatchKV follows keys of the state bucket (events' key functions; NATS
// wildcards allowed), first their current values, then every change, in
// order, until ctx ends. It reads as Watch does, so it survives the loss of
// the server its consumer lives on where the NATS library's key watcher
// stays deaf for 10 s and more.
func (b *Bus) WatchKV(ctx context.Context, keys []string, fn KVHandler) error {
	prefix := events.KVSubject(StateBucket, "")
	subjects := make([]string, len(keys))
	for i, k := range keys {
		subjects[i] = events.KVSubject(StateBucket, k)
	}
	w := &watcher{b: b, stream: events.KVStreamName(StateBucket), what: "watch " + StateBucket,
		opts: WatchOptions{Subjects: subjects, LastPerSubject: true}, restart: make(chan int, 1),
		deliver: func(m jetstream.Msg, seq uint64, _ time.Time) {
			op := m.Headers().Get(kvOperationHeader)
			if op != "" {
				fn(strings.TrimPrefix(m.Subject(), prefix), nil, true, seq)
				return
			}
			fn(strings.TrimPrefix(m.Subject(), prefix), m.Data(), false, seq)
		}}
	return w.run(ctx)
}

// ObjectHandler receives an object store's record of one object: its name,
// whether it was deleted, and the record's stream sequence.
type ObjectHandler func(name string, deleted bool, seq uint64)

// WatchObjects calls fn for the newest record of every object in bucket,
// then for every put and delete as it is stored, until ctx ends, with the
// same recovery as Watch (the NATS library's object watcher goes deaf after
// a server's crash just as its ordered consumer does). A record that is not
// an object description is logged and skipped.
func (b *Bus) WatchObjects(ctx context.Context, bucket string, fn ObjectHandler) error {
	w := &watcher{b: b, stream: events.ObjectStreamName(bucket), what: "watch objects " + bucket,
		opts: WatchOptions{Subjects: []string{events.ObjectMetaSubjects(bucket)}, LastPerSubject: true}, restart: make(chan int, 1),
		deliver: func(m jetstream.Msg, seq uint64, _ time.Time) {
			var info struct {
				Name    string `json:"name"`
				Deleted bool   `json:"deleted"`
			}
			if err := json.Unmarshal(m.Data(), &info); err != nil || info.Name == "" {
				b.log.Warn("watch objects: undecodable object record; skipped", "bucket", bucket, "seq", seq, "err", err)
				return
			}
			fn(info.Name, info.Deleted, seq)
		}}
	return w.run(ctx)
}
