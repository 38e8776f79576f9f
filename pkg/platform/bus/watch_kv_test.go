package bus_test

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/bus/bustest"
	"github.com/fanpbx/fan/pkg/platform/waittest"
)

type kvSeen struct {
	key     string
	value   string
	deleted bool
}

// TestWatchKVFollowsKeys: current values first, then every put and delete
// of the watched keys in order, nothing of other keys; and after the server
// holding its consumer is killed, the changes made since, none lost.
func TestWatchKVFollowsKeys(t *testing.T) {
	if testing.Short() {
		t.Skip("three-server cluster")
	}
	c := bustest.NewCrashCluster(t, "n1", "n2", "n3")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	b, err := bus.Connect(ctx, bus.Config{URL: c.URL(), Replicas: 3}, ident("ipmover", "n1"), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	if err := b.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	kv, err := b.StateKV(ctx)
	if err != nil {
		t.Fatal(err)
	}
	put := func(key, value string) {
		t.Helper()
		// A stream electing its leader fails puts for a while.
		waittest.Succeeds(t, 30*time.Second, "put "+key, func() error {
			// One attempt is bounded: a put sent while the bucket's leader
			// moves is dropped unanswered.
			actx, cancel := context.WithTimeout(ctx, 2*time.Second)
			defer cancel()
			_, err := kv.PutString(actx, key, value)
			return err
		})
	}
	status, other := events.GroupStatusKey("lab", "pbx"), events.GroupStatusKey("lab", "other")
	put(status, "v1")
	put(other, "x")

	seen := make(chan kvSeen, 64)
	wctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- b.WatchKV(wctx, []string{status}, func(key string, value []byte, deleted bool, _ uint64) {
			seen <- kvSeen{key, string(value), deleted}
		})
	}()
	defer func() { stop(); <-done }()
	expect := func(want kvSeen) time.Time {
		t.Helper()
		select {
		case got := <-seen:
			if got != want {
				t.Fatalf("saw %+v, want %+v", got, want)
			}
			return time.Now()
		case <-ctx.Done():
			t.Fatalf("never saw %+v", want)
		}
		return time.Time{}
	}
	expect(kvSeen{status, "v1", false}) // the current value first
	put(status, "v2")
	put(other, "y")
	expect(kvSeen{status, "v2", false})
	if err := kv.Delete(ctx, status); err != nil {
		t.Fatal(err)
	}
	expect(kvSeen{key: status, deleted: true})

	st, err := b.JS.Stream(ctx, events.KVStreamName(bus.StateBucket))
	if err != nil {
		t.Fatal(err)
	}
	host := ""
	for ci := range st.ListConsumers(ctx).Info() {
		if ci.NumWaiting > 0 {
			host = ci.Cluster.Leader
		}
	}
	if host == "" {
		t.Fatal("no consumer pulled from on the state bucket")
	}
	c.Kill(host)
	killed := time.Now()
	put(status, "v3")
	stored := time.Now()
	at := expect(kvSeen{status, "v3", false})
	fmt.Printf("watch kv: its server (%s) killed; v3 stored %v later, seen %v after that\n",
		host, stored.Sub(killed).Round(10*time.Millisecond), at.Sub(stored).Round(10*time.Millisecond))
	// The next value comes next: an extra delivery of v3 would come first.
	put(status, "v4")
	expect(kvSeen{status, "v4", false})
}
