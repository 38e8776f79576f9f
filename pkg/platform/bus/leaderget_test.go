package bus_test

import (
	"context"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus/bustest"
)

// LeaderGetKV reads what the state bucket holds: a value, its newest
// revision, and nothing for a key never written, deleted or purged.
func TestLeaderGetKV(t *testing.T) {
	b := bustest.Connect(t, bustest.Server(t), ident("ipmover", "n1"))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	kv, err := b.StateKV(ctx)
	if err != nil {
		t.Fatal(err)
	}
	read := func(key string) string {
		t.Helper()
		v, err := b.LeaderGetKV(ctx, events.StateBucket, key)
		if err != nil {
			t.Fatalf("read %s: %v", key, err)
		}
		if v == nil {
			return "<none>"
		}
		return string(v)
	}
	key := events.GroupStatusKey("lab", "pbx")
	if got := read(key); got != "<none>" {
		t.Fatalf("never written: %s", got)
	}
	for _, v := range []string{`{"holder":"n1"}`, `{"holder":"n2"}`} {
		if _, err := kv.Put(ctx, key, []byte(v)); err != nil {
			t.Fatal(err)
		}
	}
	if got := read(key); got != `{"holder":"n2"}` {
		t.Fatalf("read %s, want the newest revision", got)
	}
	if err := kv.Delete(ctx, key); err != nil {
		t.Fatal(err)
	}
	if got := read(key); got != "<none>" {
		t.Fatalf("deleted: %s", got)
	}
	other := events.GroupStatusKey("lab", "web")
	if _, err := kv.Put(ctx, other, []byte("x")); err != nil {
		t.Fatal(err)
	}
	if err := kv.Purge(ctx, other); err != nil {
		t.Fatal(err)
	}
	if got := read(other); got != "<none>" {
		t.Fatalf("purged: %s", got)
	}
}
