package bus

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/nats-io/nats.go/jetstream"
)

// executorAckWait is how long a command delivered to an executor may go
// unacknowledged before the server sends it again; an executor at work on
// one says so every executorProgressEvery (ConsumeCommands). With one
// message in flight per node, a command delivered into a connection that
// died (the node cut off just then) blocks every later command for that
// node until it comes back: with 30 s here it was removed first, at its
// deadline, and the claim of a failover to that node, 3 s after its link
// came back, waited out the lost release's 10 s (2.8 s outage in the
// chaos run; every run of that shape).
const (
	executorAckWait       = 2 * time.Second
	executorProgressEvery = 500 * time.Millisecond
)

// ExecutorConsumer returns (creating it when missing) the durable consumer
// through which one node's executor reads its commands. One message in
// flight at a time keeps commands for a node in order. A command is sent
// again until acknowledged or removed at its deadline (the stream's
// per-message TTL), however often: a node cut off for longer than a few
// deliveries gets it when it is back, if it is still due, and a command
// carried out before the acknowledgement was lost comes back as a duplicate
// that the executor's record answers.
func (b *Bus) ExecutorConsumer(ctx context.Context, node string) (jetstream.Consumer, error) {
	name := events.ExecutorConsumer(b.id.Cluster, node)
	cfg := jetstream.ConsumerConfig{
		Durable:       name,
		Description:   "commands for " + node,
		FilterSubject: events.NodeCommands(b.id.Cluster, node),
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       executorAckWait,
		MaxDeliver:    -1,
		MaxAckPending: 1,
		DeliverPolicy: jetstream.DeliverAllPolicy,
	}
	var c jetstream.Consumer
	err := retry(ctx, b, "executor consumer", func(ctx context.Context) error {
		var err error
		c, err = b.JS.CreateOrUpdateConsumer(ctx, CommandsStream, cfg)
		if err != nil {
			return fmt.Errorf("consumer %s: %w", name, err)
		}
		return nil
	})
	return c, err
}

// StateKV opens the cluster state bucket.
func (b *Bus) StateKV(ctx context.Context) (jetstream.KeyValue, error) {
	kv, err := b.JS.KeyValue(ctx, StateBucket)
	if err != nil {
		return nil, fmt.Errorf("bucket %s: %w", StateBucket, err)
	}
	return kv, nil
}

// WaitStateKV opens the state bucket at a service's start, retrying (as
// provisioning does) while the cluster is busy or electing a leader: one
// lookup that timed out used to end the service. A bucket that does not
// exist is a provisioning fault and fails at once.
func (b *Bus) WaitStateKV(ctx context.Context) (jetstream.KeyValue, error) {
	var kv jetstream.KeyValue
	err := retry(ctx, b, "open bucket "+StateBucket, func(ctx context.Context) error {
		var err error
		kv, err = b.StateKV(ctx)
		if errors.Is(err, jetstream.ErrBucketNotFound) {
			return permanentError{err}
		}
		return err
	})
	return kv, err
}

// CallsKV opens the bucket of calls in progress. A bus provisioned before
// it existed lacks it (jetstream.ErrBucketNotFound) until the next
// `fanctl provision`.
func (b *Bus) CallsKV(ctx context.Context) (jetstream.KeyValue, error) {
	kv, err := b.JS.KeyValue(ctx, CallsBucket)
	if err != nil {
		return nil, fmt.Errorf("bucket %s: %w", CallsBucket, err)
	}
	return kv, nil
}
