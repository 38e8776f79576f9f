package bus_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/bus/bustest"
	"github.com/fanpbx/fan/pkg/platform/logtest"
	"github.com/fanpbx/fan/pkg/platform/waittest"
	"github.com/nats-io/nats.go/jetstream"
)

// A service that starts while the cluster does not answer waits for the
// state bucket instead of exiting: on a loaded machine one lookup that timed
// out under load ended a standby arbiter that the test then relied on.
func TestWaitStateKVOutlastsTheClustersAbsence(t *testing.T) {
	if testing.Short() {
		t.Skip("three-server cluster")
	}
	c := bustest.Cluster(t, "n1", "n2", "n3")
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	b, logs := provisioned(ctx, t, c.URL("n1"), ident("arbiter", "a1"))
	for _, n := range c.Names {
		c.Stop(n)
	}
	type opened struct {
		kv  jetstream.KeyValue
		err error
	}
	done := make(chan opened, 1)
	go func() {
		kv, err := b.WaitStateKV(ctx)
		done <- opened{kv, err}
	}()
	// An attempt ends at once or after its 5 s bound, depending on whether
	// the client has noticed the servers are gone: wait for the second
	// attempt's log line, and WaitStateKV must not return meanwhile.
	waittest.Succeeds(t, 15*time.Second, "a second attempt logged while the servers were down", func() error {
		select {
		case o := <-done:
			t.Fatalf("WaitStateKV returned with every server down: %v", o.err)
		default:
		}
		if strings.Count(logs.String(), "open bucket fan_state failed, retrying") < 2 {
			return fmt.Errorf("logged so far:\n%s", logs.String())
		}
		return nil
	})
	for _, n := range c.Names {
		c.Restart(n)
	}
	select {
	case o := <-done:
		if o.err != nil {
			t.Fatalf("WaitStateKV after the servers returned: %v", o.err)
		}
		if o.kv.Bucket() != bus.StateBucket {
			t.Errorf("opened %q", o.kv.Bucket())
		}
	case <-ctx.Done():
		t.Fatal("WaitStateKV never returned after the servers came back")
	}
}

// A bucket nobody provisioned is not waited for: that is an installation
// fault, and the service says so at once.
func TestWaitStateKVMissingBucketFailsAtOnce(t *testing.T) {
	s := bustest.Server(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	b, err := bus.Connect(ctx, bus.Config{URL: s.ClientURL()}, ident("arbiter", "a1"), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	start := time.Now()
	_, err = b.WaitStateKV(ctx)
	if !errors.Is(err, jetstream.ErrBucketNotFound) {
		t.Fatalf("err = %v, want ErrBucketNotFound", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("took %v, want at once", d)
	}
}

// provisioned connects id to url (replicas 3), logging into the returned
// buffer, and provisions the streams and the bucket.
func provisioned(ctx context.Context, t *testing.T, url string, id bus.Identity) (*bus.Bus, *logtest.Buffer) {
	t.Helper()
	logs := &logtest.Buffer{}
	b, err := bus.Connect(ctx, bus.Config{URL: url, Replicas: 3}, id, slog.New(slog.NewTextHandler(logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	if err := b.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	return b, logs
}
