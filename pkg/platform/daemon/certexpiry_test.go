package daemon_test

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

	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/daemon"
	"github.com/fanpbx/fan/pkg/platform/daemon/metricstest"
	"github.com/nats-io/nats-server/v2/server"
)

// testCA issues certificates for one test.
type testCA struct {
	dir  string
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	path string
}

func newTestCA(t *testing.T, notAfter time.Time) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "fan test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: notAfter, IsCA: true,
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	ca := &testCA{dir: t.TempDir(), cert: cert, key: key}
	ca.path = ca.write(t, "ca.pem", "CERTIFICATE", der)
	return ca
}

func (ca *testCA) write(t *testing.T, name, typ string, der []byte) string {
	t.Helper()
	p := filepath.Join(ca.dir, name)
	if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// issue writes name.pem and name.key, valid until notAfter.
func (ca *testCA) issue(t *testing.T, name string, serial int64, notAfter time.Time, usage x509.ExtKeyUsage, ips []net.IP) (cert, key string) {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: notAfter,
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage}, IPAddresses: ips}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &k.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, _ := x509.MarshalECPrivateKey(k)
	return ca.write(t, name+".pem", "CERTIFICATE", der), ca.write(t, name+".key", "EC PRIVATE KEY", kder)
}

// TestCertExpiryOnMetrics: a service on a bus with mutual TLS exports when
// its CA and its client certificate expire, reads the files again at every
// scrape (a renewal shows at once), and reports 0 for a file it cannot read.
func TestCertExpiryOnMetrics(t *testing.T) {
	caUntil := time.Now().Add(3650 * 24 * time.Hour).Truncate(time.Second)
	clientUntil := time.Now().Add(20 * 24 * time.Hour).Truncate(time.Second)
	ca := newTestCA(t, caUntil)
	srvCert, srvKey := ca.issue(t, "server", 2, caUntil, x509.ExtKeyUsageServerAuth, []net.IP{net.ParseIP("127.0.0.1")})
	cliCert, cliKey := ca.issue(t, "client", 3, clientUntil, x509.ExtKeyUsageClientAuth, nil)

	tc, err := server.GenTLSConfig(&server.TLSConfigOpts{CertFile: srvCert, KeyFile: srvKey, CaFile: ca.path, Verify: true})
	if err != nil {
		t.Fatal(err)
	}
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(),
		TLSConfig: tc, TLS: true, TLSVerify: true, NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server not ready")
	}
	t.Cleanup(s.Shutdown)

	addr := metricstest.Listen(t)
	c := daemon.Common{Cluster: "lab", Node: "n1", HTTPListen: addr,
		Bus: bus.Config{URL: s.ClientURL(), TLS: bus.TLSConfig{CA: ca.path, Cert: cliCert, Key: cliKey}}}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// A service with an identity waits for the admin to create the
	// streams, as on a production bus: provision them first.
	admin, err := bus.Connect(ctx, c.Bus, bus.Identity{Cluster: "lab", Service: "fanctl", Node: "admin"}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if err := admin.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	admin.Close()
	rt, err := daemon.Start(ctx, c, "prober", "t", slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close(ctx)
	series := func(role, file string) string {
		return fmt.Sprintf("fan_cert_not_after_timestamp_seconds{file=%q,role=%q}", file, role)
	}
	metricstest.WaitFor(t, addr, series(daemon.CertRoleBusCA, ca.path), metricstest.Is(float64(caUntil.Unix())), 5*time.Second)
	metricstest.WaitFor(t, addr, series(daemon.CertRoleBusClient, cliCert), metricstest.Is(float64(clientUntil.Unix())), 5*time.Second)

	// Renewed on disk: the next scrape reads the new one.
	renewed := time.Now().Add(800 * 24 * time.Hour).Truncate(time.Second)
	newCert, _ := ca.issue(t, "client-renewed", 4, renewed, x509.ExtKeyUsageClientAuth, nil)
	if err := os.Rename(newCert, cliCert); err != nil {
		t.Fatal(err)
	}
	metricstest.WaitFor(t, addr, series(daemon.CertRoleBusClient, cliCert), metricstest.Is(float64(renewed.Unix())), 5*time.Second)

	// A service's own certificate, added later; one that is gone reads 0.
	own, _ := ca.issue(t, "own", 5, clientUntil, x509.ExtKeyUsageServerAuth, nil)
	rt.Certs.Add(daemon.CertFile{Role: "http_heartbeat", Path: own})
	metricstest.WaitFor(t, addr, series("http_heartbeat", own), metricstest.Is(float64(clientUntil.Unix())), 5*time.Second)
	if err := os.Remove(own); err != nil {
		t.Fatal(err)
	}
	metricstest.WaitFor(t, addr, series("http_heartbeat", own), metricstest.Is(0), 5*time.Second)
}

// TestNotAfterTakesTheEarliest: a file with a chain reports the certificate
// that expires first, and one that holds no certificate reports none.
func TestNotAfterTakesTheEarliest(t *testing.T) {
	early, late := time.Now().Add(48*time.Hour).Truncate(time.Second), time.Now().Add(9000*time.Hour).Truncate(time.Second)
	ca := newTestCA(t, late)
	leaf, key := ca.issue(t, "leaf", 2, early, x509.ExtKeyUsageClientAuth, nil)
	b1, _ := os.ReadFile(ca.path)
	b2, _ := os.ReadFile(leaf)
	chain := filepath.Join(t.TempDir(), "chain.pem")
	if err := os.WriteFile(chain, append(b1, b2...), 0o600); err != nil {
		t.Fatal(err)
	}
	if na, ok := daemon.NotAfter(chain); !ok || !na.Equal(early) {
		t.Fatalf("NotAfter(chain) = %v %v, want %v", na, ok, early)
	}
	if _, ok := daemon.NotAfter(key); ok {
		t.Fatal("a key file was read as a certificate")
	}
	if _, ok := daemon.NotAfter(filepath.Join(t.TempDir(), "missing.pem")); ok {
		t.Fatal("a missing file was read as a certificate")
	}
}
