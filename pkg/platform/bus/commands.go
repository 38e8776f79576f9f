package bus

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/nats-io/nats.go/jetstream"
)

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
