package bus

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// ErrExpired is returned for a command whose deadline passed before it
// could be published: sending it would only make an executor refuse it.
var ErrExpired = errors.New("command deadline already passed")

// Emit wraps p in a new envelope from this service and publishes it.
func (b *Bus) Emit(ctx context.Context, p events.Payload, opts ...events.Option) (events.Envelope, error) {
	env, err := events.New(b.Source(), b.id.Cluster, p, opts...)
	if err != nil {
		return events.Envelope{}, err
	}
	return env, b.Publish(ctx, env, p)
}

// Publish sends a built envelope on its payload's subject, with the envelope
// id as Nats-Msg-Id so a retried publish is stored once. Commands also get a
// server-side TTL that ends at their deadline, so a command for a node that is
// offline is deleted unread instead of being executed late. extra carries
// conditions such as the leader's fencing expectation.
func (b *Bus) Publish(ctx context.Context, env events.Envelope, p events.Payload, extra ...jetstream.PublishOpt) error {
	data, err := env.Encode()
	if err != nil {
		return err
	}
	subject := events.Subject(env, p)
	opts := []jetstream.PublishOpt{jetstream.WithMsgID(env.ID)}
	if c, ok := p.(events.Command); ok {
		ttl := time.Until(c.Deadline())
		if ttl <= 0 {
			return fmt.Errorf("publish %s %s: %w", env.Type, env.ID, ErrExpired)
		}
		opts = append(opts, jetstream.WithMsgTTL(ceilSecond(ttl)))
	}
	opts = append(opts, extra...)
	for {
		err := b.publishOnce(ctx, subject, data, opts)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil || !unanswered(err) {
			return fmt.Errorf("publish %s %s on %s: %w", env.Type, env.ID, subject, err)
		}
		b.log.Debug("publish unanswered; sending again", "type", env.Type, "event_id", env.ID, "err", err)
	}
}

// PublishAttempt bounds how long one publish waits for its stream's answer.
// A replicated stream whose leader is moving drops what it receives without
// a word, so an answer that has not come by then is not coming: the same
// envelope is sent again under the same Nats-Msg-Id, which the stream stores
// once (its duplicate check runs before any expected-sequence condition, so
// a fenced publish that was stored answers as a duplicate, not a conflict).
const PublishAttempt = time.Second

func (b *Bus) publishOnce(ctx context.Context, subject string, data []byte, opts []jetstream.PublishOpt) error {
	actx, cancel := context.WithTimeout(ctx, PublishAttempt)
	defer cancel()
	_, err := b.JS.Publish(actx, subject, data, opts...)
	return err
}

// unanswered reports a publish that may not have reached a stream leader:
// worth sending again. A refusal by the stream is an answer and is not.
func unanswered(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrNoResponders) ||
		errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, nats.ErrTimeout)
}

// ceilSecond rounds up to the server's TTL granularity (whole seconds, at
// least one), so the server never deletes a command before its deadline.
func ceilSecond(d time.Duration) time.Duration {
	s := (d + time.Second - 1) / time.Second * time.Second
	return max(s, time.Second)
}
