package store

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/logtest"
	"github.com/fanpbx/fan/pkg/platform/waittest"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// A replicator that starts before its buckets exist, on a bus that gives it
// no right to create them, waits for them instead of exiting, and opens
// them once provisioning has made them.
func TestWaitOutlastsMissingBuckets(t *testing.T) {
	prevAttempt := waitAttempt
	waitAttempt = 500 * time.Millisecond // a refused create is never answered
	t.Cleanup(func() { waitAttempt = prevAttempt })

	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, JetStream: true,
		StoreDir: t.TempDir(), NoLog: true, NoSigs: true,
		Users: []*server.User{
			{Username: "admin", Password: "admin"},
			{Username: "repl", Password: "repl", Permissions: &server.Permissions{
				Publish: &server.SubjectPermission{Allow: []string{">"}, Deny: []string{"$JS.API.STREAM.CREATE.>"}}}},
		}})
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server not ready")
	}
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	connect := func(user string) jetstream.JetStream {
		nc, err := nats.Connect(s.ClientURL(), nats.UserInfo(user, user), nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		return js
	}
	admin, repl := connect("admin"), connect("repl")

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var logs logtest.Buffer
	type opened struct {
		s   *Store
		err error
	}
	done := make(chan opened, 1)
	go func() {
		st, err := Wait(ctx, repl, 1, slog.New(slog.NewTextHandler(&logs, nil)))
		done <- opened{st, err}
	}()
	// Two failed tries logged, and Wait still waiting.
	waittest.Succeeds(t, 15*time.Second, "a second try logged", func() error {
		select {
		case o := <-done:
			t.Fatalf("Wait returned while the buckets were missing: %v", o.err)
		default:
		}
		if strings.Count(logs.String(), "open object stores failed, retrying") < 2 {
			return fmt.Errorf("logged:\n%s", logs.String())
		}
		return nil
	})
	for _, b := range []string{events.ReplBlobBucket, events.ReplManifestBucket} {
		if _, err := admin.CreateObjectStore(ctx, jetstream.ObjectStoreConfig{Bucket: b}); err != nil {
			t.Fatalf("provision %s: %v", b, err)
		}
	}
	var o opened
	select {
	case o = <-done:
	case <-ctx.Done():
		t.Fatalf("Wait did not return after the buckets were made:\n%s", logs.String())
	}
	if o.err != nil {
		t.Fatalf("Wait: %v", o.err)
	}
	data := []byte("voicemail greeting")
	h := HashOf(data)
	if stored, err := o.s.Put(ctx, h, strings.NewReader(string(data))); err != nil || !stored {
		t.Fatalf("put through the waited-for store: stored %v, %v", stored, err)
	}
	if !strings.Contains(logs.String(), "retry_in=") {
		t.Fatalf("a failed try does not say when the next comes:\n%s", logs.String())
	}
}

// Wait gives up when ctx ends, naming the last error.
func TestWaitEndsWithItsContext(t *testing.T) {
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server not ready")
	}
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	nc, err := nats.Connect(s.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 700*time.Millisecond)
	defer cancel()
	_, err = Wait(ctx, js, 1, slog.New(slog.DiscardHandler))
	if err == nil || !strings.Contains(err.Error(), context.DeadlineExceeded.Error()) {
		t.Fatalf("Wait without JetStream: %v, want the context's end", err)
	}
}
