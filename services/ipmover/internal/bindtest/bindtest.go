// Package bindtest runs a real BIND 9 (named from Debian) on a loopback
// port for tests of the DNS executor: one primary for one dynamic zone,
// updatable with one TSIG key, in the test's temporary directory.
package bindtest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// KeyName is the TSIG key every instance accepts for updates.
const KeyName = "failover-key."

// Named is one running named.
type Named struct {
	Addr   string // 127.0.0.1:port, UDP and TCP
	Secret string // base64 TSIG secret of KeyName
	Zone   string // fully qualified
}

type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Start runs named for zone (e.g. "voip.test") with the given zone file
// text; KeyName may update the names in grants (e.g. "sip.voip.test. A AAAA").
// It skips the test when named is missing, and fails under CI=true.
func Start(t testing.TB, zone, zoneFile string, grants ...string) *Named {
	t.Helper()
	bin, err := exec.LookPath("named")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("named is not installed under CI (apt-get install bind9)")
		}
		t.Skip("named is not installed (apt-get install bind9)")
	}
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	n := &Named{Secret: base64.StdEncoding.EncodeToString(b), Zone: dns.Fqdn(zone)}
	var lastErr error
	for range 3 { // the port is probed, released, then bound by named: retry if taken meanwhile
		if lastErr = n.try(t, bin, zoneFile, grants); lastErr == nil {
			return n
		}
	}
	t.Fatalf("starting named: %v", lastErr)
	return nil
}

func (n *Named) try(t testing.TB, bin, zoneFile string, grants []string) error {
	port, err := freePort()
	if err != nil {
		return err
	}
	dir := t.TempDir()
	run := filepath.Join(dir, "run")
	if err := os.Mkdir(run, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(run, "zone.db"), []byte(zoneFile), 0o644); err != nil {
		return err
	}
	var policy string
	for _, g := range grants {
		policy += fmt.Sprintf("\t\tgrant %s name %s;\n", KeyName, g)
	}
	conf := fmt.Sprintf(`options {
	directory "%s";
	pid-file "named.pid";
	session-keyfile "session.key";
	listen-on port %d { 127.0.0.1; };
	listen-on-v6 { none; };
	recursion no;
	dnssec-validation no;
	notify no;
	allow-transfer { none; };
};
controls { };
key "%s" { algorithm hmac-sha256; secret "%s"; };
zone "%s" {
	type primary;
	file "zone.db";
	update-policy {
%s	};
};
`, run, port, KeyName, n.Secret, n.Zone, policy)
	cfg := filepath.Join(dir, "named.conf")
	if err := os.WriteFile(cfg, []byte(conf), 0o644); err != nil {
		return err
	}
	n.Addr = fmt.Sprintf("127.0.0.1:%d", port)
	logs := &logBuffer{}
	cmd := exec.Command(bin, "-4", "-g", "-c", cfg)
	cmd.Stderr = logs
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start named: %w", err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	stop := func() {
		_ = cmd.Process.Kill()
		<-exited
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	for {
		if n.serves(ctx) {
			t.Cleanup(func() {
				stop()
				if t.Failed() {
					t.Logf("named %s log:\n%s", n.Addr, logs.String())
				}
			})
			return nil
		}
		select {
		case <-exited:
			return fmt.Errorf("named exited early:\n%s", logs.String())
		case <-ctx.Done():
			stop()
			return fmt.Errorf("named did not serve %s in time:\n%s", n.Zone, logs.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func (n *Named) serves(ctx context.Context) bool {
	m := new(dns.Msg)
	m.SetQuestion(n.Zone, dns.TypeSOA)
	m.RecursionDesired = false
	c := &dns.Client{Net: "tcp", Timeout: 200 * time.Millisecond}
	r, _, err := c.ExchangeContext(ctx, m, n.Addr)
	return err == nil && r.Rcode == dns.RcodeSuccess && r.Authoritative && len(r.Answer) > 0
}

// A asks named directly (no recursion, authoritative answer required) for
// name's A records and the zone's serial, independently of the code under
// test.
func (n *Named) A(t testing.TB, name string) (addrs []string, serial uint32) {
	t.Helper()
	c := &dns.Client{Net: "tcp", Timeout: 3 * time.Second}
	ask := func(q string, typ uint16) *dns.Msg {
		m := new(dns.Msg)
		m.SetQuestion(dns.Fqdn(q), typ)
		m.RecursionDesired = false
		r, _, err := c.Exchange(m, n.Addr)
		if err != nil {
			t.Fatalf("ask %s: %v", q, err)
		}
		if !r.Authoritative {
			t.Fatalf("ask %s: answer not authoritative", q)
		}
		return r
	}
	for _, rr := range ask(name, dns.TypeA).Answer {
		if a, ok := rr.(*dns.A); ok {
			addrs = append(addrs, a.A.String())
		}
	}
	for _, rr := range ask(n.Zone, dns.TypeSOA).Answer {
		if soa, ok := rr.(*dns.SOA); ok {
			serial = soa.Serial
		}
	}
	return addrs, serial
}

// SetA replaces name's A records behind everyone's back (signed), as
// another writer would.
func (n *Named) SetA(t testing.TB, name, ip string) {
	t.Helper()
	m := new(dns.Msg)
	m.SetUpdate(n.Zone)
	m.RemoveRRset([]dns.RR{&dns.ANY{Hdr: dns.RR_Header{Name: dns.Fqdn(name), Rrtype: dns.TypeA, Class: dns.ClassINET}}})
	m.Insert([]dns.RR{&dns.A{Hdr: dns.RR_Header{Name: dns.Fqdn(name), Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 30}, A: net.ParseIP(ip)}})
	m.SetTsig(KeyName, dns.HmacSHA256, 300, time.Now().Unix())
	c := &dns.Client{Net: "tcp", Timeout: 3 * time.Second, TsigSecret: map[string]string{KeyName: n.Secret}}
	r, _, err := c.Exchange(m, n.Addr)
	if err != nil || r.Rcode != dns.RcodeSuccess {
		t.Fatalf("update %s A %s: %v %v", name, ip, err, r)
	}
}

// freePort finds a loopback port free for both UDP and TCP.
func freePort() (int, error) {
	for range 20 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, err
		}
		port := l.Addr().(*net.TCPAddr).Port
		u, err := net.ListenPacket("udp", fmt.Sprintf("127.0.0.1:%d", port))
		l.Close()
		if err == nil {
			u.Close()
			return port, nil
		}
	}
	return 0, fmt.Errorf("no free loopback port for udp+tcp")
}
