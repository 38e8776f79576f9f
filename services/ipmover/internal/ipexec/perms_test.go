package ipexec

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/bus/bustest"
	"github.com/fanpbx/fan/pkg/platform/daemon"
)

// Everything the ipmover does with calls, as ipmover@n2 on a server that
// enforces the permissions pkg/events derives: read the group's records
// (one watch per key filter), write and delete its own kept record, delete
// one handed over on its revision, report an adoption; and what it must
// not do is refused: writing another node's kept record or any calls record.
func TestCallsUnderItsPermissions(t *testing.T) {
	admin, mover := bustest.NewUser(t, "lab", events.RoleAdmin, "admin"), bustest.NewUser(t, "lab", events.RoleIPMover, "n2")
	s := bustest.EnforcingServer(t, admin, mover)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	connect := func(u bustest.User, service string) *bus.Bus { return bustest.ConnectAs(ctx, t, s, u, service) }
	ab := connect(admin, "admin")
	if err := ab.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	mb := connect(mover, "ipmover")
	akv, err := ab.CallsKV(ctx)
	if err != nil {
		t.Fatal(err)
	}
	put := func(key string, rec events.CallRecord) {
		b, err := rec.Encode()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := akv.Put(ctx, key, b); err != nil {
			t.Fatal(err)
		}
	}
	origin := callOf("c1", events.MediaDirect)
	put(events.CallKey("lab", "pbx", "n1", "c1"), origin)
	other := callOf("c2", events.MediaDirect) // kept by n3 after an earlier move
	other.Node, other.Kept, other.KeptSince, other.AdoptedFrom = "n3", true, time.Now(), "n1"
	put(events.KeptKey("lab", "pbx", "n3", "c2"), other)

	svc := New(Config{Common: daemon.Common{Cluster: "lab", Node: "n2"}}, slog.New(slog.DiscardHandler), "test")
	svc.openCalls = mb.CallsKV
	recs, err := svc.readCallRecordsOnce(ctx, "pbx")
	if err != nil || len(recs) != 2 {
		t.Fatalf("ipmover@n2 reads the group's records: %d, %v", len(recs), err)
	}
	mine := origin
	mine.Node, mine.Kept, mine.KeptSince, mine.AdoptedFrom = "n2", true, time.Now(), "n1"
	value, err := mine.Encode()
	if err != nil {
		t.Fatal(err)
	}
	store := callsStore{svc}
	key := events.KeptKey("lab", "pbx", "n2", "c1")
	if err := store.Put(ctx, key, value); err != nil {
		t.Fatalf("ipmover@n2 writes its kept record: %v", err)
	}
	if err := store.Delete(ctx, key); err != nil {
		t.Fatalf("ipmover@n2 deletes its kept record: %v", err)
	}
	// Handed over: n3 keeps c1 now, adopted from n2; n2's own record goes,
	// on its revision.
	if err := store.Put(ctx, key, value); err != nil {
		t.Fatal(err)
	}
	next := mine
	next.Node, next.AdoptedFrom, next.UpdatedAt = "n3", "n2", time.Now().Add(time.Second)
	put(events.KeptKey("lab", "pbx", "n3", "c1"), next)
	if !svc.handover(ctx, "pbx") {
		t.Fatal("ipmover@n2 did not hand its record over")
	}
	if _, err := akv.Get(ctx, key); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("n2's kept record after the handover: %v", err)
	}
	if _, err := mb.Emit(ctx, events.CallsAdopted{Group: "pbx", Node: "n2", Calls: events.CallsAdoption{Adopted: 1}, At: time.Now()}); err != nil {
		t.Fatalf("ipmover@n2 reports an adoption: %v", err)
	}

	mkv, err := mb.CallsKV(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{events.KeptKey("lab", "pbx", "n3", "c9"), events.CallKey("lab", "pbx", "n2", "c9"), events.KeptKey("other", "pbx", "n2", "c9")} {
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := mkv.Put(pctx, k, value)
		cancel()
		if err == nil {
			t.Errorf("ipmover@n2 wrote %s", k)
		}
	}
	ectx, ecancel := context.WithTimeout(ctx, 2*time.Second)
	defer ecancel()
	if _, err := mb.Emit(ectx, events.CallsAdopted{Group: "pbx", Node: "n1", Calls: events.CallsAdoption{Adopted: 1}, At: time.Now()}); err == nil {
		t.Error("ipmover@n2 reported an adoption of n1's")
	}
}
