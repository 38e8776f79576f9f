package bus

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
)

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
