package bus_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
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
	"github.com/fanpbx/fan/pkg/platform/natsserver"
	"github.com/nats-io/nkeys"
)

func ident(svc, node string) bus.Identity {
	return bus.Identity{Cluster: "lab", Service: svc, Node: node, Version: "test"}
}

// TestTLSAndNKeyAgainstRealServer runs the real nats-server with mutual TLS
// and nkey authentication from a throwaway CA: the configured client gets in
// and works; a client missing any one piece is kept out.
func TestTLSAndNKeyAgainstRealServer(t *testing.T) {
	pki := newPKI(t)
	log := slog.New(slog.DiscardHandler)
	srv, err := natsserver.Start(natsserver.Config{StoreDir: t.TempDir(), Listen: "127.0.0.1:-1",
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
