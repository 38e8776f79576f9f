package bus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
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

// Pull timing of every consumer. The server sends an idle heartbeat every
// consumeHeartbeat while a pull is open; two missed ones (2 s) tell the
// client that the server holding its consumer is gone. An ordered consumer
// then recreates itself, from the sequence after the last one delivered,
// on a server that is up; a durable consumer pulls again, which reaches its
// newly elected leader. The library's defaults (5 s heartbeats for an
// ordered consumer, 15 s for a durable one) would leave a consumer silent
// for 10 to 30 s after a server crash. A pull expires and is renewed every
// consumeExpiry, which must be at least twice the heartbeat.
const (
	consumeHeartbeat = time.Second
	consumeExpiry    = 5 * time.Second
)

func (b *Bus) consumeOpts(what string) []jetstream.PullConsumeOpt {
	return []jetstream.PullConsumeOpt{
		jetstream.PullHeartbeat(consumeHeartbeat),
		jetstream.PullExpiry(consumeExpiry),
		jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
			b.log.Debug(what+": consumer error; it recovers by itself", "err", err)
		}),
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

// Watch's recovery timing. A create request is not abandoned when it is
// slow: after watchHedgeAfter without an answer another one is sent under a
// new name, placed anew (up to watchHedgeMax at once), and the first consumer
// made wins; the others are deleted. A request placed on a server that just
// died never gets an answer, and a slow but working JetStream API still
// answers the first. A round that makes nothing within watchCreateMax is
// retried after a pause.
const (
	watchHedgeAfter = 500 * time.Millisecond
	watchHedgeMax   = 4
	watchCreateMax  = 10 * time.Second
	watchRetryMax   = time.Second
	watchInactive   = time.Minute
	// watchDeleteTimeout bounds the deletion of a replaced consumer.
	watchDeleteTimeout = 2 * time.Second
	// watchPlaceTries bounds how often a consumer that landed on a server
	// outside bus.leader_servers is made again in the hope of landing on
	// one: a watch then loses its consumer only when a leader server dies,
	// never with a PBX host. Placement among a stream's current servers is
	// random: with one listed server of three, each try lands elsewhere two
	// times in three, and 24 tries (a few milliseconds each) leave about one
	// chance in 17,000 of staying there. No try is repeated while no listed
	// server is a current peer of the stream (the witness is down).
	watchPlaceTries = 24
)

// watcher is one Watch: its current consumer, where delivery stands, and
// the gate that keeps fn to one call at a time and none after Watch returns.
type watcher struct {
	b       *Bus
	stream  string
	what    string // for logs: "watch events"
	opts    WatchOptions
	deliver func(m jetstream.Msg, streamSeq uint64, stored time.Time)
	end     *watchEnd // nil unless ToEnd
	restart chan int  // the serial of a consumer that must be replaced

	prefix string
	// under mu: the live consumer's serial; the last consumer and stream
	// sequences delivered from it; the stream sequence the watch started
	// after (known once a consumer was made, for DeliverNew and Since).
	mu        sync.Mutex
	made      int // consumers asked for, which names them
	serial    int
	closed    bool
	consSeq   uint64
	streamSeq uint64
	floor     uint64
	hasFloor  bool
}

func (w *watcher) run(ctx context.Context) error {
	w.prefix = nuid.Next()
	// After a reconnect the consumer may have been on the server that went
	// away; a new one costs a request, a dead one the heartbeat timeout.
	defer w.b.onReconnect(func() {
		w.mu.Lock()
		serial := w.serial
		w.mu.Unlock()
		w.replace(serial)
	})()
	made := false
	for failures := 0; ; {
		cons, serial, err := w.create(ctx)
		if err != nil {
			if ctx.Err() != nil {
				w.close()
				if !made {
					return fmt.Errorf("%s: %w (last error: %v)", w.what, ctx.Err(), err)
				}
				return nil
			}
			failures++
			logf := w.b.log.Debug
			if failures%10 == 0 {
				logf = w.b.log.Warn
			}
			logf(w.what+": cannot create consumer, retrying", "err", err, "failures", failures)
			select {
			case <-ctx.Done():
			case <-time.After(min(100*time.Millisecond<<min(failures, 4), watchRetryMax)):
			}
			continue
		}
		if made {
			w.b.log.Info(w.what+": consumer replaced", "consumer", cons.CachedInfo().Name, "failures", failures)
		}
		made, failures = true, 0
		w.end.ready(w.stream)
		cc, err := cons.Consume(w.handle(serial), w.consumeOpts(serial)...)
		if err != nil {
			w.b.log.Debug(w.what+": consume failed, replacing the consumer", "err", err)
			w.discard(cons)
			continue
		}
		if stop := w.wait(ctx, serial); stop {
			stopAndWait(cc)
			w.close()
			w.discard(cons)
			return nil
		}
		stopAndWait(cc)
		w.discard(cons)
	}
}

// wait blocks until ctx ends (true) or the consumer of serial must be
// replaced (false). Requests for an older consumer are stale.
func (w *watcher) wait(ctx context.Context, serial int) bool {
	for {
		select {
		case <-ctx.Done():
			return true
		case s := <-w.restart:
			if s == serial {
				return false
			}
		}
	}
}

// create makes the next consumer, starting after the last event delivered:
// hedged (see watchHedgeAfter), and made again while it lands off
// bus.leader_servers (see watchPlaceTries).
func (w *watcher) create(ctx context.Context) (jetstream.Consumer, int, error) {
	tries := 1
	if w.preferredUp(ctx) {
		tries = watchPlaceTries
	}
	for try := 1; ; try++ {
		cons, serial, err := w.createHedged(ctx)
		if err != nil {
			return nil, 0, err
		}
		host := ""
		if ci := cons.CachedInfo().Cluster; ci != nil {
			host = ci.Leader
		}
		if try >= tries || w.placedWell(host) {
			w.mu.Lock()
			w.serial, w.consSeq = serial, 0
			// Where a start by time or "new only" landed is known only
			// now; a replacement made before anything was delivered starts
			// there, so that what was published in between is not
			// skipped. Last-per-subject starts again as it did: it
			// restates what is in force.
			if !w.hasFloor && w.streamSeq == 0 && !w.opts.LastPerSubject {
				w.floor, w.hasFloor = cons.CachedInfo().Delivered.Stream, true
			}
			w.mu.Unlock()
			return cons, serial, nil
		}
		w.discard(cons)
	}
}

// preferredUp says whether one of bus.leader_servers is a current peer of
// the stream, where a consumer could land; false when none are listed or
// the stream's state cannot be read.
func (w *watcher) preferredUp(ctx context.Context) bool {
	prefer := w.b.cfg.LeaderServers
	if len(prefer) == 0 {
		return false
	}
	ictx, cancel := context.WithTimeout(ctx, watchHedgeAfter)
	defer cancel()
	st, err := w.b.JS.Stream(ictx, w.stream)
	if err != nil {
		return false
	}
	ci := st.CachedInfo().Cluster
	if ci == nil {
		return false
	}
	if slices.Contains(prefer, ci.Leader) {
		return true
	}
	for _, r := range ci.Replicas {
		if r.Current && !r.Offline && slices.Contains(prefer, r.Name) {
			return true
		}
	}
	return false
}

// placedWell says whether a consumer on server host is where this bus wants
// its consumers: anywhere without bus.leader_servers, else on one of them.
func (w *watcher) placedWell(host string) bool {
	prefer := w.b.cfg.LeaderServers
	return len(prefer) == 0 || host == "" || slices.Contains(prefer, host)
}

type created struct {
	cons   jetstream.Consumer
	serial int
	err    error
}

// createHedged sends create requests, one more every watchHedgeAfter while
// none has answered, and returns the first consumer made.
func (w *watcher) createHedged(ctx context.Context) (jetstream.Consumer, int, error) {
	rctx, cancel := context.WithTimeout(ctx, watchCreateMax)
	results := make(chan created, watchHedgeMax)
	launched, answered := 0, 0
	launch := func() {
		cfg, serial := w.nextConfig()
		launched++
		go func() {
			cons, err := w.b.JS.CreateConsumer(rctx, w.stream, cfg)
			results <- created{cons, serial, err}
		}()
	}
	// The losers of a round are deleted as their answers come in.
	finish := func() {
		go func() {
			for ; answered < launched; answered++ {
				if r := <-results; r.err == nil {
					w.discard(r.cons)
				}
			}
			cancel()
		}()
	}
	launch()
	hedge := time.NewTicker(watchHedgeAfter)
	defer hedge.Stop()
	var last error
	for {
		select {
		case r := <-results:
			answered++
			if r.err == nil {
				finish()
				return r.cons, r.serial, nil
			}
			last = r.err
			if answered == launched && launched == watchHedgeMax {
				finish()
				return nil, 0, last
			}
			if answered == launched {
				launch()
			}
		case <-hedge.C:
			if launched < watchHedgeMax {
				launch()
			}
		case <-rctx.Done():
			finish()
			if last == nil {
				last = rctx.Err()
			}
			return nil, 0, last
		}
	}
}

// nextConfig is the configuration of the next consumer to make, under a
// name of its own: a retried name would be answered by the consumer it
// already names, wherever that was placed.
func (w *watcher) nextConfig() (jetstream.ConsumerConfig, int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.made++
	cfg := jetstream.ConsumerConfig{
		Name:              fmt.Sprintf("%s_%d", w.prefix, w.made),
		FilterSubjects:    w.opts.Subjects,
		AckPolicy:         jetstream.AckNonePolicy,
		Replicas:          1,
		MemoryStorage:     true,
		InactiveThreshold: watchInactive,
	}
	switch {
	case w.streamSeq > 0:
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, w.streamSeq+1
	case w.hasFloor:
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, w.floor+1
	case w.opts.All:
		cfg.DeliverPolicy = jetstream.DeliverAllPolicy
	case w.opts.LastPerSubject:
		cfg.DeliverPolicy = jetstream.DeliverLastPerSubjectPolicy
	case !w.opts.Since.IsZero():
		since := w.opts.Since
		cfg.DeliverPolicy, cfg.OptStartTime = jetstream.DeliverByStartTimePolicy, &since
	default:
		cfg.DeliverPolicy = jetstream.DeliverNewPolicy
	}
	return cfg, w.made
}

func (w *watcher) handle(serial int) jetstream.MessageHandler {
	return func(m jetstream.Msg) {
		md, err := m.Metadata()
		w.mu.Lock()
		defer w.mu.Unlock()
		if w.closed || serial != w.serial {
			return
		}
		// A gap in the consumer's own sequence is a lost delivery: start
		// again after the last event handed over.
		if err != nil || md.Sequence.Consumer != w.consSeq+1 {
			w.replace(serial)
			return
		}
		w.consSeq, w.streamSeq = md.Sequence.Consumer, md.Sequence.Stream
		w.deliver(m, md.Sequence.Stream, md.Timestamp)
		w.end.seen(w.stream, md.NumPending)
	}
}

// consumeOpts are consumeOpts plus a replacement of the consumer when the
// server holding it has gone quiet or lost it.
func (w *watcher) consumeOpts(serial int) []jetstream.PullConsumeOpt {
	return []jetstream.PullConsumeOpt{
		jetstream.PullHeartbeat(consumeHeartbeat),
		jetstream.PullExpiry(consumeExpiry),
		jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
			switch {
			case errors.Is(err, jetstream.ErrNoHeartbeat), errors.Is(err, jetstream.ErrConsumerDeleted),
				errors.Is(err, jetstream.ErrConsumerNotFound), errors.Is(err, jetstream.ErrServerShutdown),
				errors.Is(err, jetstream.ErrConsumerLeadershipChanged), errors.Is(err, nats.ErrNoResponders):
				w.b.log.Info(w.what+": consumer lost, replacing it", "err", err)
				w.replace(serial)
			default:
				w.b.log.Debug(w.what+": consumer error", "err", err)
			}
		}),
	}
}

// replace asks run to replace the consumer of serial. Only the newest ask
// is kept: a stale one (for a consumer already replaced) must not crowd out
// the ask for the live one.
func (w *watcher) replace(serial int) {
	for {
		select {
		case w.restart <- serial:
			return
		default:
		}
		select {
		case pending := <-w.restart:
			serial = max(serial, pending)
		default:
		}
	}
}

// close ends delivery: once it returns no fn call is running and none will
// start, which a consumer's own Stop does not promise.
func (w *watcher) close() {
	w.mu.Lock()
	w.closed = true
	w.mu.Unlock()
}

// discard deletes a replaced consumer in the background: on a dead server
// the request goes unanswered, and the consumer expires there instead.
func (w *watcher) discard(cons jetstream.Consumer) {
	name := cons.CachedInfo().Name
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), watchDeleteTimeout)
		defer cancel()
		_ = w.b.JS.DeleteConsumer(ctx, w.stream, name)
	}()
}

// gate lets handler calls run, one at a time, until close; once close
// returns no call is running and none will start. A consumer's own Stop
// does not promise that (an ordered consumer can still be inside its
// callback), and callers read what their handler wrote as soon as Watch or
// ConsumeCommands returns.
type gate struct {
	mu     sync.Mutex
	closed bool
}

func (g *gate) run(f func()) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.closed {
		f()
	}
}

func (g *gate) close() {
	g.mu.Lock()
	g.closed = true
	g.mu.Unlock()
}

// stopAndWait stops a consumer and waits, bounded, for it to report that
// consuming has ended.
func stopAndWait(cc jetstream.ConsumeContext) {
	cc.Stop()
	select {
	case <-cc.Closed():
	case <-time.After(5 * time.Second):
	}
}

// CommandHandler carries out one command and publishes its result. It is
// called one command at a time per node, in stream order. seq is the
// command's sequence in the command stream: the lease records that start
// terms live in the same stream, so a command's epoch is always below it
// (an executor refuses an epoch that is not).
type CommandHandler func(ctx context.Context, env events.Envelope, cmd events.Command, seq uint64)

// ConsumeCommands feeds this node's commands to h until ctx ends. A command
// that does not decode, does not match its subject or targets another node
// is refused (logged, counted, terminated) and never reaches h. A command
// is acknowledged only after h returns, so a crash mid-command redelivers it
// (and the executor's own at-most-once record turns it into a duplicate).
func (b *Bus) ConsumeCommands(ctx context.Context, node string, h CommandHandler) error {
	c, err := b.ExecutorConsumer(ctx, node)
	if err != nil {
		return err
	}
	var g gate
	cc, err := c.Consume(func(m jetstream.Msg) {
		g.run(func() { b.handleCommand(ctx, node, m, h) })
	}, b.consumeOpts("consume commands")...)
	if err != nil {
		return fmt.Errorf("consume commands for %s: %w", node, err)
	}
	<-ctx.Done()
	stopAndWait(cc)
	g.close()
	return nil
}

func (b *Bus) handleCommand(ctx context.Context, node string, m jetstream.Msg, h CommandHandler) {
	env, p, ok := b.DecodeFrom(m.Subject(), m.Data())
	if !ok {
		// Terminated, not acknowledged: the server keeps a note of it (an
		// advisory) and never redelivers it.
		_ = m.TermWithReason("refused: does not decode or does not match its subject")
		return
	}
	cmd, ok := p.(events.Command)
	if !ok {
		b.Refuse(events.RefusedNotCommand, m.Subject(), fmt.Errorf("%s is not a command", env.Type), "event_id", env.ID, "type", env.Type)
		_ = m.TermWithReason("not a command")
		return
	}
	// The consumer's filter delivers only this node's subjects, and the
	// subject matched the command's target: check the target anyway, so a
	// mis-filtered consumer can never make an executor act for another node.
	if _, target := cmd.Target(); target != node {
		b.Refuse(events.RefusedSubject, m.Subject(), fmt.Errorf("%w: command for node %s delivered to node %s's executor", events.ErrSubjectMismatch, target, node), "event_id", env.ID, "type", env.Type)
		_ = m.TermWithReason("command for another node")
		return
	}
	var seq uint64
	if md, err := m.Metadata(); err == nil {
		seq = md.Sequence.Stream
	}
	// A command can take longer than executorAckWait (a claim waits for a
	// release, probes, announces): say it is being worked on, so it is not
	// sent again meanwhile.
	working := make(chan struct{})
	go func() {
		t := time.NewTicker(executorProgressEvery)
		defer t.Stop()
		for {
			select {
			case <-working:
				return
			case <-t.C:
				_ = m.InProgress()
			}
		}
	}()
	h(ctx, env, cmd, seq)
	close(working)
	b.ack(ctx, m, env.ID)
}

// ackTries bounds the retries of a command's acknowledgement. While the
// consumer's leader is being elected an ack gets no answer; the retries
// span a leader election that the steward did not avoid (4 to 9 s). The
// command may be sent again meanwhile (executorAckWait); the executor's
// at-most-once record answers it as a duplicate.
const ackTries = 6

func (b *Bus) ack(ctx context.Context, m jetstream.Msg, id string) {
	err := b.ackOnce(ctx, m)
	for try := 1; err != nil && try < ackTries; try++ {
		select {
		case <-ctx.Done():
			// Stopping: a redelivery after the restart is answered as a
			// duplicate; do not hold the shutdown up.
			b.log.Warn("command ack failed while stopping; it may be redelivered", "event_id", id, "err", err)
			return
		case <-time.After(time.Duration(try) * 250 * time.Millisecond):
		}
		err = b.ackOnce(ctx, m)
	}
	if err != nil {
		b.log.Warn("command ack failed; it may be redelivered", "event_id", id, "err", err)
	}
}

func (b *Bus) ackOnce(ctx context.Context, m jetstream.Msg) error {
	ackCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	if err := m.DoubleAck(ackCtx); err != nil && !errors.Is(err, jetstream.ErrMsgAlreadyAckd) {
		return err
	}
	return nil
}
