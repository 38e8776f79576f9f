package bus_test

import (
	"errors"
	"testing"

	"github.com/fanpbx/fan/pkg/platform/bus"
)

func TestClientRefusesRemoteBusWithoutTLSAndIdentity(t *testing.T) {
	tls := bus.TLSConfig{CA: "ca.pem"}
	mtls := bus.TLSConfig{CA: "ca.pem", Cert: "c.pem", Key: "c.key"}
	cases := []struct {
		name string
		cfg  bus.Config
		ok   bool
	}{
		{"loopback plain", bus.Config{URL: "nats://127.0.0.1:4222"}, true},
		{"localhost plain", bus.Config{URL: "nats://localhost:4222"}, true},
		{"ipv6 loopback plain", bus.Config{URL: "nats://[::1]:4222"}, true},
		{"no scheme loopback", bus.Config{URL: "127.0.0.1:4222"}, true},
		{"remote plain", bus.Config{URL: "nats://192.0.2.1:4222"}, false},
		{"remote name plain", bus.Config{URL: "nats://nats-1.example.net:4222"}, false},
		{"one remote among loopback", bus.Config{URL: "nats://127.0.0.1:4222,nats://192.0.2.2:4222"}, false},
		{"remote tls scheme without CA", bus.Config{URL: "tls://192.0.2.1:4222", NKeySeed: "s.nk"}, false},
		{"remote TLS without identity", bus.Config{URL: "nats://192.0.2.1:4222", TLS: tls}, false},
		{"remote nkey without TLS", bus.Config{URL: "nats://192.0.2.1:4222", NKeySeed: "s.nk"}, false},
		{"remote TLS and nkey", bus.Config{URL: "nats://192.0.2.1:4222", TLS: tls, NKeySeed: "s.nk"}, true},
		{"remote TLS and creds", bus.Config{URL: "nats://192.0.2.1:4222", TLS: tls, Creds: "u.creds"}, true},
		{"remote mutual TLS", bus.Config{URL: "nats://192.0.2.1:4222", TLS: mtls}, true},
		{"remote plain, insecure lab", bus.Config{URL: "nats://192.0.2.1:4222", InsecureLab: true}, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			c.cfg.Defaults()
			err := c.cfg.Validate()
			if c.ok && err != nil {
				t.Fatalf("refused: %v", err)
			}
			if !c.ok && !errors.Is(err, bus.ErrInsecure) {
				t.Fatalf("want ErrInsecure, got %v", err)
			}
			if !c.ok {
				t.Log(err)
			}
		})
	}
}
