package bus_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/platform/bus/bustest"
	"github.com/fanpbx/fan/pkg/platform/waittest"
	"github.com/nats-io/nats.go/jetstream"
)

// TestWatchObjectsFollowsAStore: the newest record of every object first
// (an object deleted before the watch starts is reported deleted, one
// replaced is reported once), then every put and delete as it happens.
func TestWatchObjectsFollowsAStore(t *testing.T) {
	s := bustest.Server(t)
	b := bustest.Connect(t, s, ident("replicator", "n1"))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const bucket = "watched"
	obs, err := b.JS.CreateObjectStore(ctx, jetstream.ObjectStoreConfig{Bucket: bucket})
	if err != nil {
		t.Fatal(err)
	}
	put := func(name, data string) {
		t.Helper()
		if _, err := obs.PutString(ctx, name, data); err != nil {
			t.Fatalf("put %s: %v", name, err)
		}
	}
	put("a", "1")
	put("a", "2")
	put("b", "1")
	put("gone", "1")
	if err := obs.Delete(ctx, "gone"); err != nil {
		t.Fatal(err)
	}

	var mu sync.Mutex
	var seen []string
	wctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- b.WatchObjects(wctx, bucket, func(name string, deleted bool, _ uint64) {
			mu.Lock()
			defer mu.Unlock()
			seen = append(seen, fmt.Sprintf("%s:%v", name, deleted))
		})
	}()
	got := func() string {
		mu.Lock()
		defer mu.Unlock()
		return strings.Join(seen, " ")
	}
	waitSeen := func(want string) {
		t.Helper()
		waittest.Until(t, 10*time.Second, fmt.Sprintf("objects seen as %q", want), func() bool { return got() == want })
	}
	waitSeen("a:false b:false gone:true")
	put("c", "1")
	if err := obs.Delete(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	waitSeen("a:false b:false gone:true c:false b:true")
	stop()
	if err := <-done; err != nil {
		t.Fatalf("watch ended with %v", err)
	}
}
