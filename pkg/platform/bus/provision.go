package bus

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/nats-io/nats.go/jetstream"
)

// Names of what fan keeps on JetStream (defined with the permissions in
// pkg/events).
const (
	EventsStream   = events.EventsStream
	LiveStream     = events.LiveStream
	CommandsStream = events.CommandsStream
	StateBucket    = events.StateBucket
	CallsBucket    = events.CallsBucket
)

// CallsMaxAge is how long the bucket of calls keeps a record nobody wrote
// again: a recorder rewrites each of its records well within it while the
// call lasts, so only what a dead node left behind (and the markers of
// ended calls) ages out.
const CallsMaxAge = 24 * time.Hour

// Streams lists every stream fan provisions, the buckets' and the
// replicator's object stores included: the raft groups (with their durable
// consumers) whose leaders the arbiter keeps on bus.leader_servers. A
// stream added to Provision belongs in events.LedStreams.
func Streams() []string { return events.LedStreams() }

// CommandDedupeWindow is how long the command stream remembers message ids.
// It exceeds any command deadline, so a re-published command inside its
// validity is always recognised (executors also dedupe, because the server
// forgets ids of acknowledged messages after a restart).
const CommandDedupeWindow = 10 * time.Minute

func (b *Bus) eventsConfig() jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:        EventsStream,
		Description: "fan audit trail: what explains every move (transitions, decisions, commands, results, permits, operator actions)",
		Subjects:    events.AuditStreamSubjects(),
		Retention:   jetstream.LimitsPolicy,
		Discard:     jetstream.DiscardOld,
		MaxAge:      b.cfg.EventsMaxAge.D(),
		// Discard-old is the server's own limit enforcement, which
		// DenyDelete and DenyPurge do not prevent: the trail never fills
		// a disk, and fan_stream_bytes warns well before it forgets.
		MaxBytes:   b.cfg.Limits.EventsMiB * mib,
		Storage:    jetstream.FileStorage,
		Replicas:   b.cfg.Replicas,
		Duplicates: 2 * time.Minute,
		// Nobody removes anything from the trail: neither a message nor,
		// by a purge, all of them.
		DenyDelete: true,
		DenyPurge:  true,
		// Streams cannot share subjects, so the audit stream sources the
		// command stream to keep every command after it has been consumed.
		Sources: []*jetstream.StreamSource{{Name: CommandsStream, FilterSubject: events.AllCommands()}},
	}
}

// liveConfig is the stream of live state: heartbeats and raw probe results,
// restated every second or so. It is kept for hours (what `fanctl explain`
// and the status page want of it), not months.
func (b *Bus) liveConfig() jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:        LiveStream,
		Description: "fan live state: heartbeats and probe results, kept for hours",
		Subjects:    events.LiveStreamSubjects(),
		Retention:   jetstream.LimitsPolicy,
		Discard:     jetstream.DiscardOld,
		MaxAge:      b.cfg.Limits.LiveMaxAge.D(),
		MaxBytes:    b.cfg.Limits.LiveMiB * mib,
		Storage:     jetstream.FileStorage,
		Replicas:    b.cfg.Replicas,
		Duplicates:  2 * time.Minute,
	}
}

func (b *Bus) commandsConfig() jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:        CommandsStream,
		Description: "fan commands to node executors, and the leases that fence them",
		// Leases share the stream with commands so a command can be made
		// conditional on the lease's last sequence (server-side fencing).
		Subjects: []string{events.AllCommands(), events.AllLeases()},
		// Limits, not work-queue, retention: the audit stream's source is a
		// consumer too, and on a work-queue stream it acknowledges (deletes)
		// commands before their executor sees them (seen on nats-server
		// 2.15.2). Each executor's durable consumer tracks its own position,
		// and the per-message TTL removes a command at its deadline.
		Retention:   jetstream.LimitsPolicy,
		Discard:     jetstream.DiscardOld,
		MaxBytes:    b.cfg.Limits.CommandsMiB * mib,
		Storage:     jetstream.FileStorage,
		Replicas:    b.cfg.Replicas,
		MaxAge:      time.Hour,
		Duplicates:  CommandDedupeWindow,
		AllowMsgTTL: true,
		// Executors read lease records by sequence to check that a
		// command's epoch is a term that exists; direct gets are answered
		// by any replica and cost the stream leader nothing.
		AllowDirect: true,
	}
}

func (b *Bus) stateConfig() jetstream.KeyValueConfig {
	return jetstream.KeyValueConfig{
		Bucket:      StateBucket,
		Description: "fan cluster state: holders per group, registry",
		History:     5,
		MaxBytes:    b.cfg.Limits.StateMiB * mib,
		Storage:     jetstream.FileStorage,
		Replicas:    b.cfg.Replicas,
	}
}

// callsConfig is the bucket of calls in progress (pkg/events calls.go):
// one revision per key (a record is rewritten whole), a byte limit at
// which the oldest go first, and a day's age.
func (b *Bus) callsConfig() jetstream.KeyValueConfig {
	return jetstream.KeyValueConfig{
		Bucket:      CallsBucket,
		Description: "fan calls in progress: the records of each holder's calls, and of the calls a node keeps after a failover",
		History:     1,
		TTL:         CallsMaxAge,
		MaxBytes:    b.cfg.Limits.CallsMiB * mib,
		Storage:     jetstream.FileStorage,
		Replicas:    b.cfg.Replicas,
	}
}

// Provision creates fan's streams and buckets when they are missing. It never
// changes an existing one: two services with slightly different settings
// must not overwrite each other on every start. A difference is logged, and
// an operator applies it deliberately. It retries until ctx ends, because
// JetStream may still be electing leaders when a service starts.
func (b *Bus) Provision(ctx context.Context) error {
	return retry(ctx, b, "provision", func(ctx context.Context) error {
		if err := b.ensureStream(ctx, b.commandsConfig()); err != nil {
			return err
		}
		if err := b.ensureStream(ctx, b.eventsConfig()); err != nil {
			return err
		}
		if err := b.ensureStream(ctx, b.liveConfig()); err != nil {
			return err
		}
		if err := b.ensureBucket(ctx, b.stateConfig()); err != nil {
			return err
		}
		return b.ensureBucket(ctx, b.callsConfig())
	})
}

// ensureBucket creates a bucket that is missing (discarding its oldest
// revisions at its byte limit) and leaves one that exists as it is.
func (b *Bus) ensureBucket(ctx context.Context, cfg jetstream.KeyValueConfig) error {
	_, err := b.JS.KeyValue(ctx, cfg.Bucket)
	if err == nil {
		return nil
	}
	if !errors.Is(err, jetstream.ErrBucketNotFound) {
		return fmt.Errorf("bucket %s: %w", cfg.Bucket, err)
	}
	if _, err := b.JS.CreateKeyValue(ctx, cfg); err != nil {
		if errors.Is(err, jetstream.ErrBucketExists) {
			return nil
		}
		return fmt.Errorf("create bucket %s (on a bus with permissions, run fanctl provision as the admin): %w", cfg.Bucket, err)
	}
	return b.discardOld(ctx, events.KVStreamName(cfg.Bucket))
}

// AwaitProvisioned waits until fan's streams and the state bucket exist,
// creating nothing: what a service does on a bus with permissions, where
// only the admin may create them (`fanctl provision`). It looks every
// 250 ms while they are missing, so a service started before the admin
// provisioned is ready within a moment of it, and says once in a while
// what it waits for.
func (b *Bus) AwaitProvisioned(ctx context.Context) error {
	backoff, said := 250*time.Millisecond, time.Time{}
	for {
		attempt, cancel := context.WithTimeout(ctx, 5*time.Second)
		missing, err := b.missingStreams(attempt)
		cancel()
		switch {
		case err == nil && len(missing) == 0:
			return nil
		case err == nil:
			backoff = 250 * time.Millisecond
			if time.Since(said) > 10*time.Second {
				b.log.Warn("the bus is not provisioned yet: waiting for fanctl provision (the admin's bundle)", "missing", missing)
				said = time.Now()
			}
		default:
			b.log.Warn("looking up fan's streams failed, retrying", "err", err, "retry_in", backoff)
			backoff = min(backoff*2, 2*time.Second)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for fan's streams: %w (last: missing %v, %v)", ctx.Err(), missing, err)
		case <-time.After(backoff):
		}
	}
}

// missingStreams names the streams and the bucket that do not exist.
func (b *Bus) missingStreams(ctx context.Context) ([]string, error) {
	var missing []string
	for _, name := range []string{CommandsStream, EventsStream, LiveStream} {
		if _, err := b.JS.Stream(ctx, name); errors.Is(err, jetstream.ErrStreamNotFound) {
			missing = append(missing, name)
		} else if err != nil {
			return nil, fmt.Errorf("stream %s: %w", name, err)
		}
	}
	if _, err := b.JS.KeyValue(ctx, StateBucket); errors.Is(err, jetstream.ErrBucketNotFound) {
		missing = append(missing, StateBucket)
	} else if err != nil {
		return nil, fmt.Errorf("bucket %s: %w", StateBucket, err)
	}
	return missing, nil
}

func (b *Bus) ensureStream(ctx context.Context, want jetstream.StreamConfig) error {
	// Look before creating: on a bus with permissions only the admin
	// identity may create (`fanctl provision`), and a service finding the
	// stream in place must not need that right.
	s, err := b.JS.Stream(ctx, want.Name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		_, err = b.JS.CreateStream(ctx, want)
		if err == nil {
			return nil
		}
		if !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			return fmt.Errorf("create stream %s (on a bus with permissions, run fanctl provision as the admin): %w", want.Name, err)
		}
		s, err = b.JS.Stream(ctx, want.Name)
	}
	if err != nil {
		return fmt.Errorf("stream %s: %w", want.Name, err)
	}
	have := s.CachedInfo().Config
	if diff := streamDiff(have, want); diff != "" {
		b.log.Warn("existing stream differs from this service's settings; leaving it as it is",
			"stream", want.Name, "difference", diff)
	}
	return nil
}

// discardOld turns a bucket's stream to discard its oldest revisions at its
// byte limit: the library creates buckets that refuse new writes instead,
// and a state bucket refusing the holder's record would stop failover.
func (b *Bus) discardOld(ctx context.Context, stream string) error {
	s, err := b.JS.Stream(ctx, stream)
	if err != nil {
		return fmt.Errorf("stream %s: %w", stream, err)
	}
	cfg := s.CachedInfo().Config
	if cfg.Discard == jetstream.DiscardOld {
		return nil
	}
	cfg.Discard = jetstream.DiscardOld
	if _, err := b.JS.UpdateStream(ctx, cfg); err != nil {
		return fmt.Errorf("stream %s: discard old at the byte limit: %w", stream, err)
	}
	return nil
}

// streamDiff names the settings that matter for fan's guarantees.
func streamDiff(have, want jetstream.StreamConfig) string {
	switch {
	case !slices.Equal(have.Subjects, want.Subjects):
		return fmt.Sprintf("subjects %v, want %v", have.Subjects, want.Subjects)
	case have.Retention != want.Retention:
		return fmt.Sprintf("retention %v, want %v", have.Retention, want.Retention)
	case have.MaxAge != want.MaxAge:
		return fmt.Sprintf("max age %v, want %v", have.MaxAge, want.MaxAge)
	case have.MaxBytes != want.MaxBytes || have.Discard != want.Discard:
		return fmt.Sprintf("max bytes %d discarding %v, want %d discarding %v", have.MaxBytes, have.Discard, want.MaxBytes, want.Discard)
	case have.Replicas != want.Replicas:
		return fmt.Sprintf("replicas %d, want %d", have.Replicas, want.Replicas)
	case have.DenyDelete != want.DenyDelete || have.DenyPurge != want.DenyPurge:
		return fmt.Sprintf("deny delete %v and purge %v, want %v and %v", have.DenyDelete, have.DenyPurge, want.DenyDelete, want.DenyPurge)
	case have.AllowMsgTTL != want.AllowMsgTTL:
		return fmt.Sprintf("allow msg ttl %v, want %v", have.AllowMsgTTL, want.AllowMsgTTL)
	case have.AllowDirect != want.AllowDirect:
		return fmt.Sprintf("allow direct %v, want %v", have.AllowDirect, want.AllowDirect)
	}
	return ""
}

// permanentError ends a retry at once: waiting cannot repair it.
type permanentError struct{ error }

func (e permanentError) Unwrap() error { return e.error }

// retry runs op until it succeeds, returns a permanentError or ctx ends,
// backing off between tries.
func retry(ctx context.Context, b *Bus, what string, op func(context.Context) error) error {
	backoff := 100 * time.Millisecond
	for {
		attempt, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := op(attempt)
		cancel()
		if err == nil {
			return nil
		}
		if p := (permanentError{}); errors.As(err, &p) {
			return fmt.Errorf("%s: %w", what, p.error)
		}
		b.log.Warn(what+" failed, retrying", "err", err, "retry_in", backoff)
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: %w (last error: %v)", what, ctx.Err(), err)
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 2*time.Second)
	}
}

// ProvisionObjectStores creates the replicator's object stores when they are
// missing (the settings the replicator would create them with). A bus with
// permissions gives no service create rights, so `fanctl provision` makes
// them at install together with the streams and the bucket.
func (b *Bus) ProvisionObjectStores(ctx context.Context) error {
	return retry(ctx, b, "provision object stores", func(ctx context.Context) error {
		for _, cfg := range []jetstream.ObjectStoreConfig{
			{Bucket: events.ReplBlobBucket, Description: "fan replicator: file contents by SHA-256"},
			{Bucket: events.ReplManifestBucket, Description: "fan replicator: each holder's manifest of each tree"},
		} {
			if _, err := b.JS.ObjectStore(ctx, cfg.Bucket); err == nil {
				continue
			} else if !errors.Is(err, jetstream.ErrBucketNotFound) && !errors.Is(err, jetstream.ErrStreamNotFound) {
				return fmt.Errorf("object store %s: %w", cfg.Bucket, err)
			}
			cfg.Storage, cfg.Replicas = jetstream.FileStorage, b.cfg.Replicas
			if _, err := b.JS.CreateObjectStore(ctx, cfg); err != nil && !errors.Is(err, jetstream.ErrBucketExists) {
				return fmt.Errorf("create object store %s: %w", cfg.Bucket, err)
			}
		}
		return nil
	})
}
