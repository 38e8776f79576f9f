package bus_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/bus/bustest"
	"github.com/nats-io/nats.go/jetstream"
)

// TestCallsBucketProvisioned: provisioning makes the bucket of calls in
// progress with one revision per key, a day's age and a byte limit at
// which the oldest records go (never a refused write), and a second
// provisioning leaves it as it is; its stream is one the arbiter keeps the
// leader of.
func TestCallsBucketProvisioned(t *testing.T) {
	s := bustest.Server(t)
	b := bustest.Connect(t, s, ident("replicator", "n1"))
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	kv, err := b.CallsKV(ctx)
	if err != nil {
		t.Fatal(err)
	}
	st, err := b.JS.Stream(ctx, events.KVStreamName(bus.CallsBucket))
	if err != nil {
		t.Fatal(err)
	}
	c := st.CachedInfo().Config
	if c.MaxBytes != bus.DefaultCallsMiB<<20 || c.Discard != jetstream.DiscardOld || c.MaxAge != bus.CallsMaxAge || c.MaxMsgsPerSubject != 1 {
		t.Errorf("calls bucket: max bytes %d discard %v max age %v history %d", c.MaxBytes, c.Discard, c.MaxAge, c.MaxMsgsPerSubject)
	}
	key := events.CallKey("lab", "pbx", "n1", "6bf9994c-1e0b-41d8-ac66-babd3c7480fa")
	if _, err := kv.Put(ctx, key, []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	if err := b.Provision(ctx); err != nil {
		t.Fatalf("provisioning again: %v", err)
	}
	if e, err := kv.Get(ctx, key); err != nil || string(e.Value()) != `{}` {
		t.Fatalf("a record after provisioning again: %v", err)
	}
	found := false
	for _, name := range bus.Streams() {
		found = found || name == events.KVStreamName(bus.CallsBucket)
	}
	if !found {
		t.Errorf("%s is not among the led streams %v", events.KVStreamName(bus.CallsBucket), bus.Streams())
	}

	// A bus provisioned before the bucket existed: the opener says so.
	if err := b.JS.DeleteKeyValue(ctx, bus.CallsBucket); err != nil {
		t.Fatal(err)
	}
	if _, err := b.CallsKV(ctx); !errors.Is(err, jetstream.ErrBucketNotFound) {
		t.Errorf("missing bucket: %v, want ErrBucketNotFound", err)
	}
}
