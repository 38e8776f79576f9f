package dnsupdate

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/fanpbx/fan/lab/bindtest"
)

var (
	siteA = Values{
		A:    []netip.Addr{netip.MustParseAddr("192.0.2.10")},
		AAAA: []netip.Addr{netip.MustParseAddr("2001:db8::10")},
		SRV:  []SRV{{Priority: 10, Weight: 0, Port: 5060, Target: "pbx-a.voip.test."}},
	}
	siteB = Values{
		A:    []netip.Addr{netip.MustParseAddr("203.0.113.20")},
		AAAA: []netip.Addr{netip.MustParseAddr("2001:db8::20")},
		SRV:  []SRV{{Priority: 10, Weight: 0, Port: 5060, Target: "PBX-B.voip.test"}}, // case and dot do not matter
	}
)

func testLog(t testing.TB) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(t.Output(), nil))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

func testConfig(primary string, secret string, types ...string) Config {
	return Config{
		Zone:           "VOIP.test", // normalised by New
		Name:           "sip.voip.test",
		SRVName:        "_sip._udp.voip.test.",
		Types:          types,
		Sites:          map[string]Values{"a": siteA, "b": siteB},
		TTL:            30 * time.Second,
		Primary:        primary,
		Key:            Key{Name: "Failover-Key", Secret: secret}, // case: miekg/dns#572
		Timeout:        2 * time.Second,
		VerifyTimeout:  5 * time.Second,
		VerifyInterval: 10 * time.Millisecond,
	}
}

func newUpdater(t testing.TB, cfg Config) *Updater {
	t.Helper()
	u, err := New(cfg, testLog(t))
	if err != nil {
		t.Fatal(err)
	}
	return u
}

func wantRRs(t testing.TB, n *bindtest.Named, name string, qtype uint16, want ...string) uint32 {
	t.Helper()
	got, serial := n.Lookup(t, name, qtype)
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("%s %s at %s = %q, want %q", name, dns.TypeToString[qtype], n.Addr, got, want)
	}
	return serial
}

// A→B replaces A, AAAA and SRV in one update; the server then serves exactly
// B, authoritatively, at a newer serial; the same move again reports stale but
// already applied; failback returns to A.
func TestSwapAndFailback(t *testing.T) {
	n := startNamed(t)
	u := newUpdater(t, testConfig(n.Addr, n.Secret, "A", "aaaa", "SRV"))
	ctx := t.Context()

	res, err := u.Swap(ctx, Spec{From: "a", To: "b"})
	if err != nil {
		t.Fatalf("swap a->b: %v", err)
	}
	if res.SerialBefore != 1 || len(res.Servers) != 1 || !res.Servers[0].Verified ||
		!serialAfter(res.Servers[0].Serial, 1) || !res.Servers[0].Values.Equal(siteB) {
		t.Fatalf("swap a->b result: %+v", res)
	}
	t.Logf("a->b: update rtt %v, update->verified %v on %s", res.UpdateRTT, res.Servers[0].Elapsed, n.Addr)
	wantRRs(t, n, "sip.voip.test.", dns.TypeA, "30 203.0.113.20")
	wantRRs(t, n, "sip.voip.test.", dns.TypeAAAA, "30 2001:db8::20")
	serial := wantRRs(t, n, "_sip._udp.voip.test.", dns.TypeSRV, "30 10 0 5060 pbx-b.voip.test.")
	if serial != 2 {
		t.Fatalf("serial after one swap = %d, want 2 (one message, one bump)", serial)
	}

	_, err = u.Swap(ctx, Spec{From: "a", To: "b"})
	var se *StaleError
	if !errors.As(err, &se) || !errors.Is(err, ErrStale) || !se.AlreadyApplied || se.Rcode != "NXRRSET" {
		t.Fatalf("repeated swap a->b: err %v, stale %+v; want ErrStale already applied", err, se)
	}
	if site, ok := u.SiteOf(se.Current); !ok || site != "b" {
		t.Fatalf("SiteOf(%s) = %q %t, want b", se.Current, site, ok)
	}

	res, err = u.Swap(ctx, Spec{From: "a", To: "b"}.Reverse())
	if err != nil {
		t.Fatalf("failback b->a: %v", err)
	}
	t.Logf("b->a: update rtt %v, update->verified %v", res.UpdateRTT, res.Servers[0].Elapsed)
	wantRRs(t, n, "sip.voip.test.", dns.TypeA, "30 192.0.2.10")
	wantRRs(t, n, "sip.voip.test.", dns.TypeAAAA, "30 2001:db8::10")
	serial = wantRRs(t, n, "_sip._udp.voip.test.", dns.TypeSRV, "30 10 0 5060 pbx-a.voip.test.")
	if serial != 3 {
		t.Fatalf("serial after failback = %d, want 3", serial)
	}
	cur, cs, err := u.Current(ctx)
	if err != nil || cs != 3 || !cur.Equal(siteA) {
		t.Fatalf("Current = %s %d %v, want site a at 3", cur, cs, err)
	}
}

// Someone else moved the address: the swap must not overwrite it, and must
// report what is there now.
func TestSwapStale(t *testing.T) {
	n := startNamed(t)
	n.SetA(t, "sip.voip.test.", "198.51.100.7")
	u := newUpdater(t, testConfig(n.Addr, n.Secret, "A"))

	_, err := u.Swap(t.Context(), Spec{From: "a", To: "b"})
	var se *StaleError
	if !errors.As(err, &se) || !errors.Is(err, ErrStale) {
		t.Fatalf("swap over a foreign change: err %v, want ErrStale", err)
	}
	want := Values{A: []netip.Addr{netip.MustParseAddr("198.51.100.7")}}
	if se.AlreadyApplied || !se.Current.Equal(want) || se.Serial != 2 || se.ReadErr != nil {
		t.Fatalf("stale error = %+v, want current %s at serial 2", se, want)
	}
	if serial := wantRRs(t, n, "sip.voip.test.", dns.TypeA, "30 198.51.100.7"); serial != 2 {
		t.Fatalf("serial = %d, want 2 (nothing written)", serial)
	}

	// A type that must be absent but exists is stale too (YXRRSET).
	cfg := testConfig(n.Addr, n.Secret, "AAAA")
	cfg.Sites = map[string]Values{"a": {}, "b": siteB}
	_, err = newUpdater(t, cfg).Swap(t.Context(), Spec{From: "a", To: "b"})
	if !errors.As(err, &se) || se.Rcode != "YXRRSET" || !se.Current.Equal(Values{AAAA: siteA.AAAA}) {
		t.Fatalf("swap from absent AAAA: err %v, want YXRRSET with current %s", err, siteA.AAAA)
	}
}

// A wrong secret or an unknown key name is NOTAUTH, and nothing changes.
func TestSwapWrongKey(t *testing.T) {
	n := startNamed(t)
	for name, key := range map[string]Key{
		"wrong secret": {Name: bindtest.KeyName, Secret: unknownSecret},
		"unknown name": {Name: "other-key.", Secret: n.Secret},
		"wrong algo":   {Name: bindtest.KeyName, Secret: n.Secret, Algorithm: dns.HmacSHA512},
	} {
		t.Run(name, func(t *testing.T) {
			cfg := testConfig(n.Addr, n.Secret, "A")
			cfg.Key = key
			_, err := newUpdater(t, cfg).Swap(t.Context(), Spec{From: "a", To: "b"})
			if !errors.Is(err, ErrNotAuth) {
				t.Fatalf("swap with %s: err %v, want ErrNotAuth", name, err)
			}
			if serial := wantRRs(t, n, "sip.voip.test.", dns.TypeA, "30 192.0.2.10"); serial != 1 {
				t.Fatalf("serial = %d, want 1", serial)
			}
		})
	}
}

// The key is valid but the policy does not cover this name.
func TestSwapOutsidePolicy(t *testing.T) {
	n := startNamed(t)
	cfg := testConfig(n.Addr, n.Secret, "A")
	cfg.Name = "other.voip.test."
	cfg.Sites = map[string]Values{
		"a": {A: []netip.Addr{netip.MustParseAddr("192.0.2.99")}},
		"b": {A: []netip.Addr{netip.MustParseAddr("203.0.113.99")}},
	}
	_, err := newUpdater(t, cfg).Swap(t.Context(), Spec{From: "a", To: "b"})
	if !errors.Is(err, ErrRefused) {
		t.Fatalf("swap outside policy: err %v, want ErrRefused", err)
	}
	if serial := wantRRs(t, n, "other.voip.test.", dns.TypeA, "30 192.0.2.99"); serial != 1 {
		t.Fatalf("serial = %d, want 1", serial)
	}
}

// A server (or an attacker on the path) that answers NOERROR without a TSIG
// must not be believed.
func TestSwapUnsignedReply(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	updates := make(chan struct{}, 1)
	srv := &dns.Server{Listener: l, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, req *dns.Msg) {
		r := new(dns.Msg)
		r.SetReply(req)
		r.Authoritative = true
		if req.Opcode == dns.OpcodeUpdate {
			select {
			case updates <- struct{}{}:
			default:
			}
		} else if req.Question[0].Qtype == dns.TypeSOA {
			soa, _ := dns.NewRR("voip.test. 60 IN SOA ns1.voip.test. hostmaster.voip.test. 1 3600 600 86400 30")
			r.Answer = []dns.RR{soa}
		}
		_ = w.WriteMsg(r)
	})}
	// The default accept function answers NOTIMP to UPDATE; this server must
	// claim success.
	srv.MsgAcceptFunc = func(dns.Header) dns.MsgAcceptAction { return dns.MsgAccept }
	started := make(chan struct{})
	srv.NotifyStartedFunc = func() { close(started) }
	go func() { _ = srv.ActivateAndServe() }()
	t.Cleanup(func() { _ = srv.Shutdown() })
	<-started

	u := newUpdater(t, testConfig(l.Addr().String(), unknownSecret, "A"))
	res, err := u.Swap(t.Context(), Spec{From: "a", To: "b"})
	if !errors.Is(err, ErrUnsigned) {
		t.Fatalf("unsigned NOERROR: err %v, want ErrUnsigned", err)
	}
	if len(res.Servers) != 0 {
		t.Fatalf("verification ran after an unsigned reply: %+v", res)
	}
	select {
	case <-updates:
	default:
		t.Fatal("the fake server never saw the update, so the test proved nothing")
	}
}

// With a secondary fed by NOTIFY/IXFR, verification waits for both; with a
// server that never gets the change, the swap reports ErrUnverified, naming it.
func TestSwapVerifiesEveryServer(t *testing.T) {
	p, s := bindtest.StartWithSecondary(t, "voip.test", zoneFile, updatable...)
	lagging := startNamed(t) // same zone, never updated

	cfg := testConfig(p.Addr, p.Secret, "A", "AAAA")
	cfg.Servers = []string{p.Addr, s.Addr}
	res, err := newUpdater(t, cfg).Swap(t.Context(), Spec{From: "a", To: "b"})
	if err != nil {
		t.Fatalf("swap with secondary: %v", err)
	}
	for _, r := range res.Servers {
		if !r.Verified || r.Serial != 2 {
			t.Fatalf("server result %+v, want verified at serial 2", r)
		}
		t.Logf("update->verified on %s: %v", r.Server, r.Elapsed)
	}
	wantRRs(t, s, "sip.voip.test.", dns.TypeAAAA, "30 2001:db8::20")

	cfg.Servers = []string{p.Addr, lagging.Addr}
	cfg.VerifyTimeout = 300 * time.Millisecond
	res, err = newUpdater(t, cfg).Swap(t.Context(), Spec{From: "b", To: "a"})
	if !errors.Is(err, ErrUnverified) {
		t.Fatalf("swap with a lagging server: err %v, want ErrUnverified", err)
	}
	if len(res.Servers) != 2 || !res.Servers[0].Verified || res.Servers[1].Verified ||
		res.Servers[1].Serial != 1 || res.Servers[1].Err == nil {
		t.Fatalf("per-server results = %+v, want primary verified, lagging not (serial 1)", res.Servers)
	}
}

// BenchmarkSwapVerified prints the update→verified time on one loopback BIND.
func BenchmarkSwapVerified(b *testing.B) {
	n := startNamed(b)
	u := newUpdater(b, testConfig(n.Addr, n.Secret, "A", "AAAA"))
	spec := Spec{From: "a", To: "b"}
	var total time.Duration
	for b.Loop() {
		res, err := u.Swap(context.Background(), spec)
		if err != nil {
			b.Fatal(err)
		}
		total += res.Servers[0].Elapsed
		spec = spec.Reverse()
	}
	b.ReportMetric(float64(total.Microseconds())/float64(b.N), "µs-update-to-verified/op")
}
