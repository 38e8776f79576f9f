package natsconfig

import (
	"context"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/platform/natsserver"
	"github.com/nats-io/nats.go"
)

// fan-nats (natsserver.Start with server_config) runs the generated
// server configuration as it is: the admin provisions over mutual TLS with
// its nkey, a service finds the streams, a stranger is kept out.
func TestGeneratedConfigRunsInFanNATS(t *testing.T) {
	out := t.TempDir()
	c := testCluster(t, out)
	if _, err := Generate(c, Options{Out: out}); err != nil {
		t.Fatal(err)
	}
	srv, err := natsserver.Start(natsserver.Config{
		StoreDir: filepath.Join(out, "fan-nats"), ServerName: "nats-1",
		Listen:       "127.0.0.1:" + itoa(c.NATS[0].ClientPort),
		ServerConfig: filepath.Join(Bundle(out, "nats-1"), serverConf),
	}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatalf("fan-nats with the generated configuration: %v", err)
	}
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin := connectBus(t, ctx, c, out, "admin", "admin")
	if err := admin.Provision(ctx); err != nil {
		t.Fatalf("admin provisions: %v", err)
	}
	prober := connectBus(t, ctx, c, out, "n1", "prober")
	if err := prober.Provision(ctx); err != nil {
		t.Fatalf("prober finds the streams: %v", err)
	}
	if nc, err := nats.Connect(srv.ClientURL(), nats.RootCAs(filepath.Join(Bundle(out, "n1"), caCert))); err == nil {
		nc.Close()
		t.Error("a client without nkey and certificate connected")
	}
}
