// Package bustest starts a real, embedded nats-server with JetStream for
// tests, one per test, on a random loopback port.
package bustest

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/nats-io/nats-server/v2/server"
)

// Server starts a JetStream server listening on 127.0.0.1 (so separate
// processes can reach it too) and stops it when the test ends.
func Server(t testing.TB) *server.Server {
	t.Helper()
	s, err := server.NewServer(&server.Options{
		Host: "127.0.0.1", Port: server.RANDOM_PORT, JetStream: true,
		StoreDir: t.TempDir(), NoLog: true, NoSigs: true,
	})
	if err != nil {
		t.Fatalf("nats server: %v", err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats server not ready")
	}
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	return s
}

// Connect connects a provisioned bus client for id to s; closed at cleanup.
func Connect(t testing.TB, s *server.Server, id bus.Identity) *bus.Bus {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	b, err := bus.Connect(ctx, bus.Config{URL: s.ClientURL()}, id, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatalf("bus connect: %v", err)
	}
	t.Cleanup(b.Close)
	if err := b.Provision(ctx); err != nil {
		t.Fatalf("provision: %v", err)
	}
	return b
}
