package dnsupdate

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
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// skipOrFail skips when a prerequisite is missing locally but fails under CI,
// where a missing BIND means a broken image, not a reason to pass.
func skipOrFail(t testing.TB, why string) {
	t.Helper()
	if os.Getenv("CI") != "" {
		t.Fatalf("prerequisite missing under CI: %s", why)
	}
	t.Skip(why)
}

const (
	testZone = "voip.test."
	testKey  = "failover-key."
)

// zoneFile is the starting zone of every test. "other" exists but is outside
// the update-policy.
const zoneFile = `$TTL 60
@        IN SOA ns1.voip.test. hostmaster.voip.test. ( 1 3600 600 86400 30 )
         IN NS  ns1.voip.test.
ns1      IN A   127.0.0.1
sip   30 IN A    192.0.2.10
sip   30 IN AAAA 2001:db8::10
_sip._udp 30 IN SRV 10 0 5060 pbx-a.voip.test.
pbx-a    IN A   192.0.2.10
pbx-b    IN A   203.0.113.20
other 30 IN A   192.0.2.99
`

// named is one BIND instance on a loopback port, in its own temp dir.
type named struct {
	addr   string
	secret string
	stderr *syncBuffer
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func newSecret(t testing.TB) string {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return base64.StdEncoding.EncodeToString(b)
}

// namedOpts shapes one instance: a primary (optionally notifying a secondary)
// or a secondary of primaryAddr.
type namedOpts struct {
	secret      string // TSIG secret; generated if empty
	secondaryOf string // host:port of the primary; empty for a primary
	notify      string // host:port of a secondary the primary notifies
	port        int    // fixed port; 0 picks a free one
}

// startNamedAt runs named on a port chosen beforehand, for a secondary whose
// address the primary's also-notify must name before either starts.
func startNamedAt(t testing.TB, port int, o namedOpts) *named {
	t.Helper()
	o.port = port
	return startNamed(t, o)
}

func itoa(i int) string { return strconv.Itoa(i) }

// startNamed runs named -g on a free loopback port and waits until it serves
// the zone authoritatively. It retries on another port if the chosen one was
// taken in between (the port is probed, then released, then bound by named).
func startNamed(t testing.TB, o namedOpts) *named {
	t.Helper()
	bin, err := exec.LookPath("named")
	if err != nil {
		skipOrFail(t, "named is not installed (apt-get install bind9)")
	}
	if o.secret == "" {
		o.secret = newSecret(t)
	}
	var lastErr error
	for range 3 {
		n, err := tryNamed(t, bin, o)
		if err == nil {
			return n
		}
		lastErr = err
	}
	t.Fatalf("starting named: %v", lastErr)
	return nil
}

func tryNamed(t testing.TB, bin string, o namedOpts) (*named, error) {
	port := o.port
	if port == 0 {
		p, err := freePort()
		if err != nil {
			return nil, err
		}
		port = p
	}
	dir := t.TempDir()
	run := filepath.Join(dir, "run")
	if err := os.Mkdir(run, 0o755); err != nil {
		return nil, err
	}
	var zone string
	switch {
	case o.secondaryOf != "":
		host, pport, _ := net.SplitHostPort(o.secondaryOf)
		zone = fmt.Sprintf(`zone "voip.test" { type secondary; file "voip.test.sec"; primaries { %s port %s; }; };`, host, pport)
	default:
		if err := os.WriteFile(filepath.Join(run, "voip.test.zone"), []byte(zoneFile), 0o644); err != nil {
			return nil, err
		}
		notify := "notify no;"
		if o.notify != "" {
			host, nport, _ := net.SplitHostPort(o.notify)
			notify = fmt.Sprintf("notify explicit; notify-delay 0; also-notify { %s port %s; };", host, nport)
		}
		zone = fmt.Sprintf(`zone "voip.test" {
	type primary;
	file "voip.test.zone";
	%s
	update-policy {
		grant %s name sip.voip.test. A AAAA;
		grant %s name _sip._udp.voip.test. SRV;
	};
};`, notify, testKey, testKey)
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
	allow-transfer { 127.0.0.1; };
};
controls { };
key "%s" { algorithm hmac-sha256; secret "%s"; };
%s
`, run, port, testKey, o.secret, zone)
	cfg := filepath.Join(dir, "named.conf")
	if err := os.WriteFile(cfg, []byte(conf), 0o644); err != nil {
		return nil, err
	}
	n := &named{addr: fmt.Sprintf("127.0.0.1:%d", port), secret: o.secret, stderr: &syncBuffer{}}
	cmd := exec.Command(bin, "-4", "-g", "-c", cfg)
	cmd.Stderr = n.stderr
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start named: %w", err)
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
		if serves(ctx, n.addr) {
			t.Cleanup(func() {
				stop()
				if t.Failed() {
					t.Logf("named %s log:\n%s", n.addr, n.stderr.String())
				}
			})
			return n, nil
		}
		select {
		case <-exited:
			return nil, fmt.Errorf("named exited early:\n%s", n.stderr.String())
		case <-ctx.Done():
			stop()
			return nil, fmt.Errorf("named did not serve %s in time:\n%s", testZone, n.stderr.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// serves reports whether addr answers the zone's SOA authoritatively.
func serves(ctx context.Context, addr string) bool {
	m := new(dns.Msg)
	m.SetQuestion(testZone, dns.TypeSOA)
	m.RecursionDesired = false
	c := &dns.Client{Net: "tcp", Timeout: 200 * time.Millisecond}
	r, _, err := c.ExchangeContext(ctx, m, addr)
	return err == nil && r.Rcode == dns.RcodeSuccess && r.Authoritative && len(r.Answer) > 0
}

// freePort finds a loopback port free for both UDP and TCP, since named binds
// both.
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

// rawUpdate sends a hand-built, signed UPDATE: "someone else" changing the
// zone behind the Updater's back.
func rawUpdate(t testing.TB, n *named, name string, rrs ...dns.RR) {
	t.Helper()
	m := new(dns.Msg)
	m.SetUpdate(testZone)
	m.RemoveRRset([]dns.RR{&dns.ANY{Hdr: dns.RR_Header{Name: name, Rrtype: rrs[0].Header().Rrtype, Class: dns.ClassINET}}})
	m.Insert(rrs)
	m.SetTsig(testKey, dns.HmacSHA256, 300, time.Now().Unix())
	c := &dns.Client{Net: "tcp", Timeout: 3 * time.Second, TsigSecret: map[string]string{testKey: n.secret}}
	r, _, err := c.Exchange(m, n.addr)
	if err != nil || r.Rcode != dns.RcodeSuccess {
		t.Fatalf("raw update: %v %v", err, r)
	}
}

// lookup reads one RRset and the serial directly from a server, independent
// of the code under test.
func lookup(t testing.TB, addr, name string, qtype uint16) (rrs []string, serial uint32) {
	t.Helper()
	c := &dns.Client{Net: "tcp", Timeout: 3 * time.Second}
	q := func(n string, typ uint16) *dns.Msg {
		m := new(dns.Msg)
		m.SetQuestion(n, typ)
		m.RecursionDesired = false
		r, _, err := c.Exchange(m, addr)
		if err != nil {
			t.Fatalf("lookup %s: %v", n, err)
		}
		if !r.Authoritative {
			t.Fatalf("lookup %s at %s: AA not set", n, addr)
		}
		return r
	}
	for _, rr := range q(name, qtype).Answer {
		if rr.Header().Rrtype == qtype {
			f := strings.Fields(rr.String())
			rrs = append(rrs, fmt.Sprintf("%s %s", f[1], strings.Join(f[4:], " "))) // ttl + rdata
		}
	}
	soa := q(testZone, dns.TypeSOA)
	return rrs, soa.Answer[0].(*dns.SOA).Serial
}
