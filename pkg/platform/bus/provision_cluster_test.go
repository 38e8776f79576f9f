package bus_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/bus/bustest"
	"github.com/fanpbx/fan/pkg/platform/waittest"
)

// Three embedded servers (what fan-nats runs) form a cluster with a
// JetStream meta quorum, fan provisions its streams at replicas 3 on it,
// and the streams keep working after any one member goes away.
func TestEmbeddedClusterRunsReplicatedStreams(t *testing.T) {
	c := bustest.Cluster(t, "nats-n1", "nats-n2", "nats-ctl")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	b, err := bus.Connect(ctx, bus.Config{URL: c.URL("nats-n1", "nats-ctl", "nats-n2"), Replicas: 3}, ident("arbiter", "n1"), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if err := b.Provision(ctx); err != nil {
		t.Fatalf("provision at replicas 3: %v", err)
	}
	for _, name := range []string{bus.EventsStream, bus.CommandsStream} {
		st, err := b.JS.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		info, err := st.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.Config.Replicas != 3 || info.Cluster == nil || info.Cluster.Leader == "" || len(info.Cluster.Replicas) != 2 {
			t.Fatalf("stream %s: replicas %d, cluster %+v", name, info.Config.Replicas, info.Cluster)
		}
	}
	emit := func() {
		t.Helper()
		// A new stream leader is being elected: emits fail for a while.
		deadline, _ := ctx.Deadline()
		waittest.Succeeds(t, time.Until(deadline), "emit", func() error {
			_, err := b.Emit(ctx, events.ServiceAnnounce{Service: "prober", Node: "n1", Version: "test", State: events.ServiceStarted})
			return err
		})
	}
	emit()
	// The stream's leader leaves: the other two still hold a quorum.
	st, _ := b.JS.Stream(ctx, bus.EventsStream)
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c.Stop(info.Cluster.Leader)
	emit()
	n, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n.State.Msgs < 2 {
		t.Fatalf("events stream holds %d messages after a member left, want 2", n.State.Msgs)
	}
	if n.Cluster.Leader == info.Cluster.Leader {
		t.Fatalf("leader still %s after it stopped", n.Cluster.Leader)
	}
}
