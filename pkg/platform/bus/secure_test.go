package bus_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/nats-io/nkeys"
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
		{"embedded in-process", bus.Config{Embedded: &bus.Embedded{StoreDir: "x"}}, true},
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

func TestEmbeddedServerRefusesOpenListener(t *testing.T) {
	pki := newPKI(t)
	log := slog.New(slog.DiscardHandler)
	cases := []struct {
		name string
		conf string
	}{
		{"no config", ""},
		{"auth without TLS", pki.conf(t, false, true)},
		{"TLS without auth", pki.conf(t, true, false)},
		{"anonymous allowed", pki.conf(t, true, false) + "authorization { users: [ { user: anon, password: x } ] }\nno_auth_user: anon\n"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := bus.Embedded{StoreDir: t.TempDir(), Listen: "0.0.0.0:-1"}
			if c.conf != "" {
				e.ServerConfig = writeFile(t, "nats.conf", c.conf)
			}
			srv, err := bus.StartEmbedded(e, log)
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
		conf := pki.conf(t, true, true) + "\ncluster { name: c, listen: \"0.0.0.0:-1\" }\n"
		srv, err := bus.StartEmbedded(bus.Embedded{StoreDir: t.TempDir(), Listen: "127.0.0.1:-1",
			ServerConfig: writeFile(t, "nats.conf", conf)}, log)
		if srv != nil {
			srv.Shutdown()
		}
		if !errors.Is(err, bus.ErrInsecure) {
			t.Fatalf("want ErrInsecure, got %v", err)
		}
	})
}

// TestTLSAndNKeyAgainstRealServer runs the real nats-server with mutual TLS
// and nkey authentication from a throwaway CA: the configured client gets in
// and works; a client missing any one piece is kept out.
func TestTLSAndNKeyAgainstRealServer(t *testing.T) {
	pki := newPKI(t)
	log := slog.New(slog.DiscardHandler)
	srv, err := bus.StartEmbedded(bus.Embedded{StoreDir: t.TempDir(), Listen: "127.0.0.1:-1",
		ServerConfig: writeFile(t, "nats.conf", pki.conf(t, true, true))}, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	good := bus.Config{URL: srv.ClientURL(), NKeySeed: pki.seed,
		TLS: bus.TLSConfig{CA: pki.ca, Cert: pki.cert, Key: pki.key}}

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	b, err := bus.Connect(ctx, good, ident("prober", "n1"), log)
	if err != nil {
		t.Fatalf("configured client: %v", err)
	}
	defer b.Close()
	if err := b.Provision(ctx); err != nil {
		t.Fatalf("provision over TLS: %v", err)
	}
	if _, err := b.Emit(ctx, events.ServiceAnnounce{Service: "prober", Node: "n1", Version: "test", State: events.ServiceStarted}); err != nil {
		t.Fatalf("emit over TLS: %v", err)
	}
	if !b.NC.TLSRequired() {
		t.Fatal("connection is not TLS")
	}

	otherSeed := writeSeed(t)
	bad := map[string]func(c *bus.Config){
		"no nkey":          func(c *bus.Config) { c.NKeySeed = "" },
		"unknown nkey":     func(c *bus.Config) { c.NKeySeed = otherSeed },
		"no client cert":   func(c *bus.Config) { c.TLS.Cert, c.TLS.Key = "", "" },
		"no TLS at all":    func(c *bus.Config) { c.TLS = bus.TLSConfig{} },
		"wrong CA trusted": func(c *bus.Config) { c.TLS.CA = newPKI(t).ca },
	}
	for name, spoil := range bad {
		t.Run(name, func(t *testing.T) {
			cfg := good
			spoil(&cfg)
			cctx, cancel := context.WithTimeout(context.Background(), 700*time.Millisecond)
			defer cancel()
			b, err := bus.Connect(cctx, cfg, ident("prober", "n1"), log)
			if err == nil {
				b.Close()
				t.Fatal("connected")
			}
			t.Log(err)
		})
	}
}

type pki struct{ dir, ca, cert, key, serverCert, serverKey, seed, pub string }

// newPKI makes a throwaway CA, a server certificate for 127.0.0.1, a client
// certificate and an nkey user, all in a temp dir.
func newPKI(t *testing.T) *pki {
	t.Helper()
	p := &pki{dir: t.TempDir()}
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "fan test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true,
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	p.ca = p.write(t, "ca.pem", "CERTIFICATE", caDER)
	leaf := func(name string, serial int64, usage x509.ExtKeyUsage, ips []net.IP) (string, string) {
		k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage}, IPAddresses: ips}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &k.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		kder, _ := x509.MarshalECPrivateKey(k)
		return p.write(t, name+".pem", "CERTIFICATE", der), p.write(t, name+".key", "EC PRIVATE KEY", kder)
	}
	p.serverCert, p.serverKey = leaf("server", 2, x509.ExtKeyUsageServerAuth, []net.IP{net.ParseIP("127.0.0.1")})
	p.cert, p.key = leaf("client", 3, x509.ExtKeyUsageClientAuth, nil)
	p.seed = writeSeed(t)
	seed, _ := os.ReadFile(p.seed)
	kp, _ := nkeys.FromSeed(seed)
	p.pub, _ = kp.PublicKey()
	return p
}

func (p *pki) write(t *testing.T, name, typ string, der []byte) string {
	t.Helper()
	path := filepath.Join(p.dir, name)
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// conf is a nats-server configuration with a tls block (client certificates
// required) and/or an authorization block naming the nkey user.
func (p *pki) conf(t *testing.T, withTLS, withAuth bool) string {
	s := ""
	if withTLS {
		s += fmt.Sprintf("tls { cert_file: %q, key_file: %q, ca_file: %q, verify: true }\n", p.serverCert, p.serverKey, p.ca)
	}
	if withAuth {
		s += fmt.Sprintf("authorization { users: [ { nkey: %q } ] }\n", p.pub)
	}
	return s
}

func writeSeed(t *testing.T) string {
	t.Helper()
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	seed, _ := kp.Seed()
	return writeFile(t, "user.nk", string(seed))
}

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}
