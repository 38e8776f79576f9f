package bus

import (
	"context"
	"errors"
	"fmt"
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
type EventHandler func(env events.Envelope, p events.Payload, seq uint64)

// Watch reads the audit stream with an ordered consumer (it survives
// reconnects and notices gaps) and calls fn for every event that decodes,
// until ctx ends. Events that do not decode, or do not match the subject
// they arrived on (events.DecodeFrom), are refused (logged, counted in
// fan_events_refused_total) and skipped: one bad producer must not stop a
// consumer, and no handler ever sees a node name its subject does not vouch for.
func (b *Bus) Watch(ctx context.Context, o WatchOptions, fn EventHandler) error {
	cfg := jetstream.OrderedConsumerConfig{FilterSubjects: o.Subjects, DeliverPolicy: jetstream.DeliverNewPolicy}
	switch {
	case o.All:
		cfg.DeliverPolicy = jetstream.DeliverAllPolicy
	case o.LastPerSubject:
		cfg.DeliverPolicy = jetstream.DeliverLastPerSubjectPolicy
	case !o.Since.IsZero():
		cfg.DeliverPolicy = jetstream.DeliverByStartTimePolicy
		since := o.Since
		cfg.OptStartTime = &since
	}
	var cons jetstream.Consumer
	err := retry(ctx, b, "watch events", func(ctx context.Context) error {
		var err error
		cons, err = b.JS.OrderedConsumer(ctx, EventsStream, cfg)
		return err
	})
	if err != nil {
		return err
	}
	var g gate
	cc, err := cons.Consume(func(m jetstream.Msg) {
		g.run(func() {
			env, p, ok := b.DecodeFrom(m.Subject(), m.Data())
			if !ok {
				return
			}
			var seq uint64
			if md, err := m.Metadata(); err == nil {
				seq = md.Sequence.Stream
			}
			fn(env, p, seq)
		})
	}, b.consumeOpts("watch events")...)
	if err != nil {
		return fmt.Errorf("watch events: %w", err)
	}
	<-ctx.Done()
	stopAndWait(cc)
	g.close()
	return nil
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
	h(ctx, env, cmd, seq)
	b.ack(ctx, m, env.ID)
}

// ackTries bounds the retries of a command's acknowledgement. While the
// consumer's leader is being elected an ack gets no answer; the retries
// span a leader election that the steward did not avoid (4 to 9 s), so the
// command is not redelivered after it was carried out. If they all fail the
// command comes back after the consumer's AckWait and the executor's
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
