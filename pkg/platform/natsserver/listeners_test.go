package natsserver_test

import (
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/config/configtest"
	"github.com/fanpbx/fan/pkg/platform/natsserver"
)

// A listener reachable from other machines needs both authentication and
// TLS; each missing piece is refused with the client's own sentinel.
func TestStartRefusesOpenListener(t *testing.T) {
	dir := t.TempDir()
	cert, key := configtest.WriteCert(t, dir, "server", time.Now().Add(-time.Hour), time.Now().Add(time.Hour))
	tlsBlock := fmt.Sprintf("tls { cert_file: %q, key_file: %q, ca_file: %q, verify: true }\n", cert, key, cert)
	auth := "authorization { users: [ { user: fan, password: secret } ] }\n"
	log := slog.New(slog.DiscardHandler)
	cases := []struct {
		name string
		conf string
	}{
		{"no config", ""},
		{"auth without TLS", auth},
		{"TLS without auth", tlsBlock},
		{"anonymous allowed", tlsBlock + "authorization { users: [ { user: anon, password: x } ] }\nno_auth_user: anon\n"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := natsserver.Config{StoreDir: t.TempDir(), Listen: "0.0.0.0:-1"}
			if c.conf != "" {
				cfg.ServerConfig = configtest.WriteFile(t, t.TempDir(), "nats.conf", []byte(c.conf))
			}
			srv, err := natsserver.Start(cfg, log)
			if srv != nil {
				srv.Shutdown()
			}
			if !errors.Is(err, bus.ErrInsecure) {
				t.Fatalf("want ErrInsecure, got %v", err)
			}
			t.Log(err)
		})
	}
	t.Run("route without TLS", func(t *testing.T) {
		conf := tlsBlock + auth + "\ncluster { name: c, listen: \"0.0.0.0:-1\" }\n"
		srv, err := natsserver.Start(natsserver.Config{StoreDir: t.TempDir(), Listen: "127.0.0.1:-1",
			ServerConfig: configtest.WriteFile(t, t.TempDir(), "nats.conf", []byte(conf))}, log)
		if srv != nil {
			srv.Shutdown()
		}
		if !errors.Is(err, bus.ErrInsecure) {
			t.Fatalf("want ErrInsecure, got %v", err)
		}
	})
}
