// Package bindtest runs real BIND 9 (named from Debian) on loopback ports
// for tests of DNS updates: a primary for one dynamic zone, updatable with
// one TSIG key, optionally with a secondary fed by NOTIFY and zone transfer.
// Every instance lives in the test's temporary directory and is killed when
// the test ends, pass or fail.
package bindtest

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fanpbx/fan/lab/peer"
	"github.com/fanpbx/fan/lab/prereq"
	"github.com/fanpbx/fan/pkg/platform/porttest"

	"github.com/miekg/dns"
)

// KeyName is the TSIG key every instance accepts for updates.
const KeyName = "failover-key."

// Named is one running named.
type Named struct {
	Addr   string // 127.0.0.1:port, UDP and TCP
	Secret string // base64 TSIG secret of KeyName; a secondary knows it but takes no updates
	Zone   string // fully qualified

	proc *peer.Proc
}

// role is what sets one instance apart from another of the same zone.
type role struct {
	zone        string   // fully qualified
	zoneFile    string   // a primary's starting zone; empty for a secondary
	grants      []string // names KeyName may update, on a primary
	notifyPort  int      // loopback port of a secondary the primary notifies; 0 for none
	primaryAddr string   // a secondary's primary, host:port; empty for a primary
	secret      string   // the TSIG secret of KeyName; empty makes a new one
}

// Start runs a primary for zone (e.g. "voip.test") with the given zone file
// text; KeyName may update the names in grants (e.g. "sip.voip.test. A AAAA").
// It skips the test when named is missing, and fails under CI.
func Start(t testing.TB, zone, zoneFile string, grants ...string) *Named {
	t.Helper()
	return startPrimary(t, namedBinary(t), role{zone: dns.Fqdn(zone), zoneFile: zoneFile, grants: grants})
}

// StartWithSecondary is Start plus a secondary that the primary notifies of
// every change at once, so that a test can wait for an update to reach more
// than one authoritative server.
func StartWithSecondary(t testing.TB, zone, zoneFile string, grants ...string) (primary, secondary *Named) {
	t.Helper()
	bin := namedBinary(t)
	var lastErr error
	// The primary must name the secondary's port before the secondary can
	// name the primary's, so that port is probed early and may be taken by
	// the time the secondary binds it: then retry with a new pair.
	for range 3 {
		port, err := porttest.Free()
		if err != nil {
			t.Fatal(err)
		}
		primary = startPrimary(t, bin, role{zone: dns.Fqdn(zone), zoneFile: zoneFile, grants: grants, notifyPort: port})
		secondary, lastErr = launch(t, bin, port, role{zone: primary.Zone, primaryAddr: primary.Addr})
		if lastErr == nil {
			return primary, secondary
		}
	}
	t.Fatalf("starting a secondary: %v", lastErr)
	return nil, nil
}

func namedBinary(t testing.TB) string {
	t.Helper()
	prereq.Need(t, "bind9", "named")
	bin, err := exec.LookPath("named")
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

func startPrimary(t testing.TB, bin string, r role) *Named {
	t.Helper()
	var lastErr error
	for range 3 { // the port is probed, released, then bound by named: retry if taken meanwhile
		n, err := launch(t, bin, 0, r)
		if err == nil {
			return n
		}
		lastErr = err
	}
	t.Fatalf("starting named: %v", lastErr)
	return nil
}

// launch runs named on port (0 picks a free one) and waits until it serves
// the zone authoritatively, which for a secondary means after the transfer.
func launch(t testing.TB, bin string, port int, r role) (*Named, error) {
	if port == 0 {
		var err error
		if port, err = porttest.Free(); err != nil {
			return nil, err
		}
	}
	secret := r.secret
	if secret == "" {
		var err error
		if secret, err = newSecret(); err != nil {
			return nil, err
		}
	}
	n := &Named{Addr: fmt.Sprintf("127.0.0.1:%d", port), Secret: secret, Zone: r.zone}
	dir := t.TempDir()
	run := filepath.Join(dir, "run")
	if err := os.Mkdir(run, 0o755); err != nil {
		return nil, err
	}
	if r.primaryAddr == "" {
		if err := os.WriteFile(filepath.Join(run, "zone.db"), []byte(r.zoneFile), 0o644); err != nil {
			return nil, err
		}
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
zone "%s" {
%s};
`, run, port, KeyName, n.Secret, n.Zone, r.zoneStatements())
	cfg := filepath.Join(dir, "named.conf")
	if err := os.WriteFile(cfg, []byte(conf), 0o644); err != nil {
		return nil, err
	}
	p, err := peer.Start(t, nil, bin, "-4", "-g", "-c", cfg)
	if err != nil {
		return nil, fmt.Errorf("start named: %w", err)
	}
	n.proc = p
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	for {
		if n.serves(ctx) {
			return n, nil
		}
		select {
		case <-p.Done():
			return nil, fmt.Errorf("named exited early:\n%s", p.Output())
		case <-ctx.Done():
			p.Stop()
			return nil, fmt.Errorf("named did not serve %s in time:\n%s", n.Zone, p.Output())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Signal sends sig to named (peer.Proc.Signal: SIGSTOP freezes it, and
// returns once it is frozen).
func (n *Named) Signal(t testing.TB, sig syscall.Signal) { n.proc.Signal(t, sig) }

// zoneStatements fills named.conf's zone block: a secondary pulls the zone
// from its primary; a primary loads zone.db, takes signed updates for the
// granted names and notifies its secondary, if any, without delay.
func (r role) zoneStatements() string {
	if r.primaryAddr != "" {
		host, primaryPort, _ := net.SplitHostPort(r.primaryAddr)
		return fmt.Sprintf("\ttype secondary;\n\tfile \"zone.db\";\n\tprimaries { %s port %s; };\n", host, primaryPort)
	}
	notify := "notify no;"
	if r.notifyPort != 0 {
		notify = fmt.Sprintf("notify explicit; notify-delay 0; also-notify { 127.0.0.1 port %d; };", r.notifyPort)
	}
	var policy strings.Builder
	for _, g := range r.grants {
		fmt.Fprintf(&policy, "\t\tgrant %s name %s;\n", KeyName, g)
	}
	return fmt.Sprintf("\ttype primary;\n\tfile \"zone.db\";\n\t%s\n\tupdate-policy {\n%s\t};\n", notify, policy.String())
}

func newSecret() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return base64.StdEncoding.EncodeToString(b), nil
}

func (n *Named) serves(ctx context.Context) bool {
	m := new(dns.Msg)
	m.SetQuestion(n.Zone, dns.TypeSOA)
	m.RecursionDesired = false
	c := &dns.Client{Net: "tcp", Timeout: 200 * time.Millisecond}
	r, _, err := c.ExchangeContext(ctx, m, n.Addr)
	return err == nil && r.Rcode == dns.RcodeSuccess && r.Authoritative && len(r.Answer) > 0
}

// Lookup asks this server directly (no recursion, authoritative answer
// required) for name's records of qtype, each as "ttl rdata", and the zone's
// serial, independently of the code under test.
func (n *Named) Lookup(t testing.TB, name string, qtype uint16) (records []string, serial uint32) {
	t.Helper()
	c := &dns.Client{Net: "tcp", Timeout: 3 * time.Second}
	ask := func(q string, typ uint16) *dns.Msg {
		m := new(dns.Msg)
		m.SetQuestion(dns.Fqdn(q), typ)
		m.RecursionDesired = false
		r, _, err := c.Exchange(m, n.Addr)
		if err != nil {
			t.Fatalf("ask %s at %s: %v", q, n.Addr, err)
		}
		if !r.Authoritative {
			t.Fatalf("ask %s at %s: answer not authoritative", q, n.Addr)
		}
		return r
	}
	for _, rr := range ask(name, qtype).Answer {
		if rr.Header().Rrtype == qtype {
			f := strings.Fields(rr.String()) // name ttl class type rdata...
			records = append(records, f[1]+" "+strings.Join(f[4:], " "))
		}
	}
	for _, rr := range ask(n.Zone, dns.TypeSOA).Answer {
		if soa, ok := rr.(*dns.SOA); ok {
			return records, soa.Serial
		}
	}
	t.Fatalf("ask %s at %s: no SOA", n.Zone, n.Addr)
	return nil, 0
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
