package app

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"github.com/fanpbx/fan/pkg/platform/logtest"
	"github.com/fanpbx/fan/pkg/platform/porttest"
	"github.com/fanpbx/fan/pkg/platform/waittest"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// writeCert writes a self-signed certificate for 127.0.0.1 with this
// serial to cert and key (as a renewal would: key first, then cert).
func writeCert(t *testing.T, certFile, keyFile string, serial int64) *x509.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: "fan-arbiter"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// The HTTP heartbeat endpoint attacked as it would be at the internet edge,
// on a running arbiter: plaintext to the TLS port, wrong tokens, the scheme
// in other cases, a flood from one source (429) while another source still
// passes, and a certificate renewed on disk that the next handshake serves.
// Every refusal is in the log with its source and in the metric.
func TestHTTPHeartbeatEdge(t *testing.T) {
	l := newLab(t, "n1", "n2")
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "hb.crt"), filepath.Join(dir, "hb.key")
	first := writeCert(t, certFile, keyFile, 1)
	addr, metricsAddr := porttest.Addr(t), porttest.Addr(t)
	cfg := l.cfg("ctlA")
	cfg.HTTPListen = metricsAddr
	cfg.HTTPHeartbeat = HTTPHeartbeatConfig{Listen: addr, Token: testToken, Nodes: []string{"legacy1"},
		TLS: HTTPHeartbeatTLS{Cert: certFile, Key: keyFile}, RateLimit: HTTPHeartbeatRateLimit{PerSecond: 1, Burst: 20},
		ConnsPerSource: 3}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	var logs logtest.Buffer
	svc, err := New(cfg, slog.New(slog.NewJSONHandler(&logs, nil)), "test")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = svc.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })

	// A client from a chosen loopback source address (127.0.0.x), trusting
	// the given certificate; no connection reuse, so every request
	// handshakes.
	client := func(src string, trust *x509.Certificate) *http.Client {
		pool := x509.NewCertPool()
		pool.AddCert(trust)
		d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 2 * time.Second}
		return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DialContext: d.DialContext,
			TLSClientConfig: &tls.Config{RootCAs: pool}, DisableKeepAlives: true}}
	}
	good := `{"node":"legacy1","cpu_percent":12.5,"mem_available_bytes":700,"mem_total_bytes":1000}`
	post := func(c *http.Client, auth string) (int, error) {
		req, _ := http.NewRequest("POST", "https://"+addr+"/api/servers/heartbeat", strings.NewReader(good))
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := c.Do(req)
		if err != nil {
			return 0, err
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode, nil
	}
	a := client("127.0.0.1", first)
	waittest.Until(t, 10*time.Second, "the endpoint to answer", func() bool {
		code, err := post(a, "Bearer "+testToken)
		return err == nil && code == http.StatusAccepted
	})

	// Plaintext to the TLS port: refused, nothing served in the clear.
	resp, err := http.Post("http://"+addr+"/api/servers/heartbeat", "application/json", strings.NewReader(good))
	if err == nil {
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), "HTTPS") {
			t.Errorf("plaintext to the TLS port: %d %s, want 400", resp.StatusCode, body)
		}
	}

	// Tokens: wrong ones refused, the scheme in any case accepted.
	for auth, want := range map[string]int{
		"Bearer wrong-token-wrong-token": http.StatusUnauthorized,
		"Basic " + testToken:             http.StatusUnauthorized,
		testToken:                        http.StatusUnauthorized,
		"bearer " + testToken:            http.StatusAccepted,
		"BEARER  " + testToken:           http.StatusAccepted,
	} {
		if code, err := post(a, auth); err != nil || code != want {
			t.Errorf("Authorization %q: %d %v, want %d", auth, code, err, want)
		}
	}

	// A flood from 127.0.0.3 (wrong tokens, as a guesser would send) runs
	// into 429 once its burst is spent...
	flood := client("127.0.0.3", first)
	limited := 0
	for i := 0; i < 60 && limited < 10; i++ {
		code, err := post(flood, "Bearer guess-"+strconv.Itoa(i)+"-xxxxxxxxxxxx")
		if err != nil {
			t.Fatal(err)
		}
		if code == http.StatusTooManyRequests {
			limited++
		} else if code != http.StatusUnauthorized {
			t.Fatalf("flood request %d: %d", i, code)
		}
	}
	if limited < 10 {
		t.Fatalf("a flood of 60 requests met %d refusals for rate, want at least 10 (burst 20)", limited)
	}
	// ...while another source still passes, and so does the right token
	// from the flooder's neighbour.
	if code, err := post(client("127.0.0.2", first), "Bearer "+testToken); err != nil || code != http.StatusAccepted {
		t.Errorf("another source during the flood: %d %v, want 202", code, err)
	}

	// Connections held open (a slowloris) from 127.0.0.6: those beyond
	// conns_per_source are closed at once; another source still connects.
	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	for i := 0; i < 4; i++ {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.6")}}
		c, err := d.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	waittest.Until(t, 5*time.Second, "the fourth held connection closed by the server", func() bool {
		_ = held[3].SetReadDeadline(time.Now().Add(50 * time.Millisecond))
		_, err := held[3].Read(make([]byte, 1))
		return errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET)
	})
	if code, err := post(client("127.0.0.7", first), "Bearer "+testToken); err != nil || code != http.StatusAccepted {
		t.Errorf("another source while 127.0.0.6 holds its connections: %d %v, want 202", code, err)
	}

	// The certificate renewed on disk is served by the next handshake
	// (checked at most once a second).
	second := writeCert(t, certFile, keyFile, 2)
	b := client("127.0.0.4", second)
	waittest.Until(t, 10*time.Second, "the renewed certificate", func() bool {
		code, err := post(b, "Bearer "+testToken)
		return err == nil && code == http.StatusAccepted
	})
	if _, err := post(client("127.0.0.5", first), "Bearer "+testToken); err == nil {
		t.Error("the replaced certificate is still served")
	}

	// Every refusal is counted by reason and logged with its source.
	mresp, err := http.Get("http://" + metricsAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(mresp.Body)
	mresp.Body.Close()
	for reason, atLeast := range map[string]float64{"unauthorized": 3 + 20, "rate_limited": 10, "plaintext": 1, "too_many_connections": 1} {
		m := regexp.MustCompile(`fan_httphb_refused_total\{reason="` + reason + `"\} (\S+)`).FindSubmatch(metrics)
		if m == nil {
			t.Errorf("no fan_httphb_refused_total for %s", reason)
			continue
		}
		if v, _ := strconv.ParseFloat(string(m[1]), 64); v < atLeast {
			t.Errorf("fan_httphb_refused_total{reason=%q} = %v, want at least %v", reason, v, atLeast)
		}
	}
	for _, want := range []string{`"reason":"unauthorized"`, `"source":"127.0.0.3:`, `"reason":"rate_limited"`, `"reason":"plaintext"`} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("log lacks %s", want)
		}
	}
	if n := strings.Count(logs.String(), `"reason":"rate_limited"`); n != 1 {
		t.Errorf("rate-limited refusals logged %d times, want once per run of refusals", n)
	}
	t.Logf("refusals:\n%s", bytes.Join(regexp.MustCompile(`(?m)^fan_httphb_refused_total.*$`).FindAll(metrics, -1), []byte("\n")))
}
