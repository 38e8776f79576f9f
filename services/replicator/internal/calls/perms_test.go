package calls_test

import (
	"context"
	"testing"
	"time"

	"github.com/fanpbx/fan/lab/amipeer"
	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/bus/bustest"
	"github.com/fanpbx/fan/pkg/platform/waittest"
	"github.com/fanpbx/fan/services/replicator/internal/calls"
)

// TestRecorderUnderItsPermissions: the recorder does all it does (reads
// its node's records, writes and deletes them, follows the group's status,
// publishes its summary, follows the kept records of its group after a
// planned move) as replicator@n1 on a server that enforces the
// permissions pkg/events derives, and nothing it does is refused.
func TestRecorderUnderItsPermissions(t *testing.T) {
	admin, repl := bustest.NewUser(t, cluster, events.RoleAdmin, "admin"), bustest.NewUser(t, cluster, events.RoleReplicator, "n1")
	s := bustest.EnforcingServer(t, admin, repl)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	connect := func(u bustest.User, service string) *bus.Bus { return bustest.ConnectAs(ctx, t, s, u, service) }
	ab := connect(admin, "admin")
	if err := ab.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	rb := connect(repl, "replicator")
	if err := rb.AwaitProvisioned(ctx); err != nil {
		t.Fatal(err)
	}
	p, err := amipeer.Start(amipeer.Config{Username: "fan", Secret: "s", SystemName: "pbx"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	kv, err := ab.CallsKV(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// The admin plays the arbiter (the state bucket's writer) and reads
	// the records as a reader would.
	l := &lab{t: t, peer: p, bus: ab, kv: kv, node: "n1", ctx: ctx}
	l.hold("n1", 1)
	published := make(chan error, 64)
	writeErrors := 0.0
	var recorders []*recorder
	run := func() func() {
		r := l.startWith(rb, func(c *calls.Config) {
			c.Publish = func(s events.CallsSummary) {
				_, err := rb.Emit(ctx, s)
				select {
				case published <- err:
				default:
				}
			}
		})
		recorders = append(recorders, r)
		return func() {
			r.stop()
			writeErrors += metricWith(t, r.reg, "fan_replicator_call_writes_total", "outcome", "error")
		}
	}
	stop := run()
	c := l.answer(1, true)
	waittest.Until(t, 10*time.Second, "the call recorded as replicator@n1", func() bool {
		_, ok := l.record(c.BridgeID())
		return ok
	})
	if err := <-published; err != nil {
		t.Fatalf("replicator@n1 publishes its summary: %v", err)
	}
	stop()
	ended := l.answer(2, true)
	waittest.Until(t, 10*time.Second, "the second call bridged", func() bool { return ended.BridgeID() != "" })
	stop = run()
	waittest.Until(t, 10*time.Second, "the second call recorded after a restart", func() bool {
		_, ok := l.record(ended.BridgeID())
		return ok
	})
	ended.HungUp(true)
	waittest.Until(t, 10*time.Second, "its record deleted", func() bool {
		_, ok := l.record(ended.BridgeID())
		return !ok
	})
	// A planned move: n2 keeps the first call; replicator@n1 follows the
	// kept records (a watch of the group's kept keys, a read of n2's
	// record) and hangs its channels up when n2 lets the call go.
	rec, ok := l.record(c.BridgeID())
	if !ok {
		t.Fatal("the first call's record is gone")
	}
	l.hold("n2", 2)
	kept := l.keep("n2", rec)
	waittest.Until(t, 10*time.Second, "replicator@n1 sees the call kept by n2", func() bool {
		return metricWith(t, recorders[len(recorders)-1].reg, "fan_replicator_moved_calls", "state", "kept") == 1
	})
	l.unkeep(kept)
	caller, _ := c.Channels()
	waittest.Until(t, 10*time.Second, "the call's channels hung up", func() bool { return !l.up(caller) })
	stop()
	// The server does enforce them: n2's key is not n1's to write.
	rkv, err := rb.CallsKV(ctx)
	if err != nil {
		t.Fatal(err)
	}
	pctx, pcancel := context.WithTimeout(ctx, 2*time.Second)
	defer pcancel()
	if _, err := rkv.Put(pctx, events.CallKey(cluster, group, "n2", "x"), []byte(`{}`)); err == nil {
		t.Error("replicator@n1 wrote n2's record: the permissions are not enforced")
	}
	if writeErrors != 0 {
		t.Errorf("%v writes of records failed", writeErrors)
	}
}
