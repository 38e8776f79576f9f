package natsserver_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/natsserver"
)

// The server fan-nats runs serves fan's bus: a service connects to it,
// provisions and publishes.
func TestStartServesTheBus(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	srv, err := natsserver.Start(natsserver.Config{StoreDir: t.TempDir(), Listen: "127.0.0.1:-1"}, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	b, err := bus.Connect(ctx, bus.Config{URL: srv.ClientURL()},
		bus.Identity{Cluster: "lab", Service: "lab", Node: "one", Version: "test"}, log)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if err := b.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Emit(ctx, events.ServiceAnnounce{Service: "lab", Node: "one", Version: "t", State: events.ServiceStarted}); err != nil {
		t.Fatal(err)
	}
}
