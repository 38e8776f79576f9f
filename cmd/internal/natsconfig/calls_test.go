package natsconfig

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/nats-io/nats.go/jetstream"
)

// TestCallRecordsEnforced: on a server enforcing the generated
// permissions, n1's replicator writes, reads back and deletes n1's call
// records and reads the kept records; n1's ipmover writes its kept records and reads every record of
// the cluster; the arbiter, an operator, an auditor and the status page
// read them. Every other write is refused by the server: each role's, on
// each kind of key.
func TestCallRecordsEnforced(t *testing.T) {
	out := t.TempDir()
	c := testCluster(t, out)
	c.Viewers = []string{"noc"}
	if err := c.validate(); err != nil {
		t.Fatal(err)
	}
	if _, err := Generate(c, Options{Out: out}); err != nil {
		t.Fatal(err)
	}
	startServer(t, c, out)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	if err := connectBus(t, ctx, c, out, "admin", "admin").Provision(ctx); err != nil {
		t.Fatal(err)
	}

	const id = "6bf9994c-1e0b-41d8-ac66-babd3c7480fa"
	callN1 := events.CallKey(c.Cluster, "pbx", "n1", id)
	keptN1 := events.KeptKey(c.Cluster, "pbx", "n1", id)
	open := func(b *bus.Bus, who string) jetstream.KeyValue {
		t.Helper()
		kv, err := b.CallsKV(ctx)
		if err != nil {
			t.Fatalf("%s opens the bucket: %v", who, err)
		}
		return kv
	}
	// readAll lists the records under filter the way a reader does (a
	// watch with that one filter), ending at the current values.
	readAll := func(kv jetstream.KeyValue, filter, who string) map[string]string {
		t.Helper()
		wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
		defer wcancel()
		w, err := kv.WatchFiltered(wctx, []string{filter}, jetstream.IgnoreDeletes())
		if err != nil {
			t.Fatalf("%s watches %s: %v", who, filter, err)
		}
		defer func() { _ = w.Stop() }()
		got := map[string]string{}
		for {
			select {
			case e := <-w.Updates():
				if e == nil {
					return got
				}
				got[e.Key()] = string(e.Value())
			case <-wctx.Done():
				t.Fatalf("%s watching %s: no end of the current values", who, filter)
			}
		}
	}

	// n1's replicator: its own records, written, read back, deleted.
	repl := open(connectBus(t, ctx, c, out, "n1", "replicator"), "replicator@n1")
	if _, err := repl.Put(ctx, callN1, []byte(`{"call":1}`)); err != nil {
		t.Fatalf("replicator@n1 writes n1's record: %v", err)
	}
	if e, err := repl.Get(ctx, callN1); err != nil || string(e.Value()) != `{"call":1}` {
		t.Fatalf("replicator@n1 reads n1's record back: %v", err)
	}
	if got := readAll(repl, events.NodeCallKeys(c.Cluster, "n1"), "replicator@n1"); len(got) != 1 {
		t.Fatalf("replicator@n1 lists n1's records: %v", got)
	}
	if err := repl.Delete(ctx, callN1); err != nil {
		t.Fatalf("replicator@n1 deletes n1's record: %v", err)
	}
	if _, err := repl.Put(ctx, callN1, []byte(`{"call":2}`)); err != nil {
		t.Fatal(err)
	}

	// n1's ipmover: its kept records, and every record of the cluster.
	ipm := open(connectBus(t, ctx, c, out, "n1", "ipmover"), "ipmover@n1")
	if _, err := ipm.Put(ctx, keptN1, []byte(`{"kept":1}`)); err != nil {
		t.Fatalf("ipmover@n1 writes its kept record: %v", err)
	}
	if e, err := ipm.Get(ctx, callN1); err != nil || string(e.Value()) != `{"call":2}` {
		t.Fatalf("ipmover@n1 reads n1's call record: %v", err)
	}
	if got := readAll(ipm, events.GroupCallKeys(c.Cluster, "pbx"), "ipmover@n1"); len(got) != 1 {
		t.Fatalf("ipmover@n1 reads the group's call records: %v", got)
	}
	if got := readAll(ipm, events.GroupKeptKeys(c.Cluster, "pbx"), "ipmover@n1"); len(got) != 1 {
		t.Fatalf("ipmover@n1 reads the group's kept records: %v", got)
	}
	// n1's replicator reads the kept records of its cluster: what became of
	// a call its Asterisk still has after a planned move.
	if got := readAll(repl, events.GroupKeptKeys(c.Cluster, "pbx"), "replicator@n1"); len(got) != 1 {
		t.Fatalf("replicator@n1 reads the group's kept records: %v", got)
	}
	if e, err := repl.Get(ctx, keptN1); err != nil || string(e.Value()) != `{"kept":1}` {
		t.Fatalf("replicator@n1 reads a kept record: %v", err)
	}

	// The readers.
	for _, r := range []struct{ dir, role string }{{"ctl1", "arbiter"}, {"alice", "operator"}, {"bob", "auditor"}, {"noc", "viewer"}} {
		who := r.role + "@" + r.dir
		kv := open(connectBus(t, ctx, c, out, r.dir, r.role), who)
		if e, err := kv.Get(ctx, keptN1); err != nil || string(e.Value()) != `{"kept":1}` {
			t.Errorf("%s reads a kept record: %v", who, err)
		}
		if got := readAll(kv, events.ClusterCallKeys(c.Cluster), who); len(got) != 1 {
			t.Errorf("%s reads the cluster's call records: %v", who, got)
		}
		// A write through the library fails too (the publish is refused,
		// so no acknowledgement comes).
		pctx, pcancel := context.WithTimeout(ctx, 2*time.Second)
		if _, err := kv.Put(pctx, callN1, []byte(`{}`)); err == nil {
			t.Errorf("%s overwrote n1's record", who)
		}
		pcancel()
	}
	if e, err := repl.Get(ctx, callN1); err != nil || string(e.Value()) != `{"call":2}` {
		t.Fatalf("n1's record after the refused writes: %v", err)
	}

	// Every forbidden write, one by one, refused by the server. A KV
	// delete or purge is a publish on the key's subject too.
	callN2 := events.KVSubject(events.CallsBucket, events.CallKey(c.Cluster, "pbx", "n2", id))
	keptN2 := events.KVSubject(events.CallsBucket, events.KeptKey(c.Cluster, "pbx", "n2", id))
	call := events.KVSubject(events.CallsBucket, callN1)
	kept := events.KVSubject(events.CallsBucket, keptN1)
	forbidden := []struct{ dir, role, what, subject string }{
		{"n1", "replicator", "writes n2's call record", callN2},
		{"n1", "replicator", "writes a kept record", kept},
		{"n1", "replicator", "writes another cluster's record", events.KVSubject(events.CallsBucket, events.CallKey("c2", "pbx", "n1", id))},
		{"n1", "ipmover", "writes a call record", call},
		{"n1", "ipmover", "writes n2's kept record", keptN2},
		{"n2", "replicator", "writes n1's call record", call},
		{"n2", "ipmover", "writes n1's kept record", kept},
		{"n1", "prober", "writes a call record", call},
		{"n1", "prober", "writes a kept record", kept},
		{"ctl1", "scheduler", "writes a call record", call},
		{"ctl1", "arbiter", "writes a call record", call},
		{"ctl1", "arbiter", "writes a kept record", kept},
		{"alice", "operator", "writes a call record", call},
		{"alice", "operator", "writes a kept record", kept},
		{"bob", "auditor", "writes a call record", call},
		{"noc", "viewer", "writes a kept record", kept},
	}
	for _, f := range forbidden {
		connectRaw(t, c, out, f.dir, f.role).publish(t, f.role+"@"+f.dir+" "+f.what, f.subject)
	}
	// Reads past the filters: a prober reads nothing, a replicator only
	// its own node's records, nobody reads by sequence.
	st := events.KVStreamName(events.CallsBucket)
	pr := connectRaw(t, c, out, "n1", "prober")
	pr.publish(t, "prober@n1 reads a call record", "$JS.API.DIRECT.GET."+st+"."+call)
	rr := connectRaw(t, c, out, "n1", "replicator")
	rr.publish(t, "replicator@n1 reads n2's call record", "$JS.API.DIRECT.GET."+st+"."+callN2)
	rr.publish(t, "replicator@n1 watches every node's call records", "$JS.API.CONSUMER.CREATE."+st+".x."+events.KVSubject(events.CallsBucket, events.GroupCallKeys(c.Cluster, "pbx")))
	ir := connectRaw(t, c, out, "n1", "ipmover")
	ir.publish(t, "ipmover@n1 reads a record by sequence", "$JS.API.STREAM.MSG.GET."+st)
	ir.publish(t, "ipmover@n1 makes a consumer without a filter", "$JS.API.CONSUMER.CREATE."+st+".x")

	// The records stand as their writers left them.
	if e, err := repl.Get(ctx, callN1); err != nil || string(e.Value()) != `{"call":2}` {
		t.Errorf("n1's record: %v", err)
	}
	if _, err := ipm.Get(ctx, events.CallKey(c.Cluster, "pbx", "n2", id)); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Errorf("n2's record, which nobody may write but n2's replicator: %v", err)
	}
}
