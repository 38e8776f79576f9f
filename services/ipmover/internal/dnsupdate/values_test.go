package dnsupdate

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
)

func TestSerialAfter(t *testing.T) {
	for _, tc := range []struct {
		a, b uint32
		want bool
	}{
		{2, 1, true},
		{1, 1, false},
		{1, 2, false},
		{0, 0xffffffff, true}, // wrapped
		{0xffffffff, 0, false},
		{1 << 30, 1, true},
	} {
		if got := serialAfter(tc.a, tc.b); got != tc.want {
			t.Errorf("serialAfter(%d, %d) = %t, want %t", tc.a, tc.b, got, tc.want)
		}
	}
}

func TestValuesEqual(t *testing.T) {
	a := Values{
		A:   []netip.Addr{netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.2")},
		SRV: []SRV{{Priority: 1, Port: 5060, Target: "PBX.voip.test"}},
	}
	same := Values{
		A:   []netip.Addr{netip.MustParseAddr("::ffff:192.0.2.2"), netip.MustParseAddr("192.0.2.1")},
		SRV: []SRV{{Priority: 1, Port: 5060, Target: "pbx.voip.test."}},
	}
	if !a.Equal(same) {
		t.Fatalf("%s != %s", a, same)
	}
	for _, other := range []Values{
		{A: a.A[:1], SRV: a.SRV},
		{A: a.A},
		{A: a.A, SRV: []SRV{{Priority: 2, Port: 5060, Target: "pbx.voip.test."}}},
		{A: a.A, SRV: a.SRV, AAAA: []netip.Addr{netip.MustParseAddr("2001:db8::1")}},
	} {
		if a.Equal(other) {
			t.Errorf("%s == %s", a, other)
		}
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	good := testConfig("127.0.0.1:53", "c2VjcmV0", "A", "SRV")
	if _, err := New(good, testLog(t)); err != nil {
		t.Fatalf("good config: %v", err)
	}
	for name, mut := range map[string]func(*Config){
		"no primary":        func(c *Config) { c.Primary = "" },
		"no secret":         func(c *Config) { c.Key.Secret = "" },
		"name outside zone": func(c *Config) { c.Name = "sip.example.org." },
		"no types":          func(c *Config) { c.Types = nil },
		"unknown type":      func(c *Config) { c.Types = []string{"MX"} },
		"srv without name":  func(c *Config) { c.SRVName = "" },
		"one site":          func(c *Config) { c.Sites = map[string]Values{"a": siteA} },
		"v6 in A":           func(c *Config) { c.Sites = map[string]Values{"a": siteA, "b": {A: siteB.AAAA}} },
		"fractional ttl":    func(c *Config) { c.TTL = 1500 * time.Millisecond },
	} {
		c := testConfig("127.0.0.1:53", "c2VjcmV0", "A", "SRV")
		mut(&c)
		if _, err := New(c, testLog(t)); err == nil {
			t.Errorf("%s: New accepted it", name)
		}
	}
}

// The message must carry value prerequisites with TTL 0 and inserts with the
// configured TTL; reusing one RR for both (the miekg helpers mutate their
// arguments) would insert with TTL 0.
func TestUpdateMsg(t *testing.T) {
	u := newUpdater(t, testConfig("127.0.0.1:53", "c2VjcmV0", "A", "SRV"))
	cfg := u.cfg
	cfg.Sites = map[string]Values{"a": {}, "b": siteB} // no SRV at a: must be absent
	u2 := &Updater{cfg: cfg, log: u.log}
	for _, tc := range []struct {
		u          *Updater
		from, to   Values
		wantPrereq []string
	}{
		{u, siteA, siteB, []string{"sip.voip.test.\t0\tIN\tA\t192.0.2.10", "_sip._udp.voip.test.\t0\tIN\tSRV\t10 0 5060 pbx-a.voip.test."}},
		{u2, Values{}, siteB, []string{"sip.voip.test.\t0\tNONE\tA", "_sip._udp.voip.test.\t0\tNONE\tSRV"}},
	} {
		m := tc.u.updateMsg(tc.from.only(cfg.Types), tc.to.only(cfg.Types))
		if m.Opcode != dns.OpcodeUpdate || m.IsTsig() == nil || len(m.Question) != 1 || m.Question[0].Name != "voip.test." {
			t.Fatalf("not a signed update of voip.test.: %v", m)
		}
		var pre []string
		for _, rr := range m.Answer {
			pre = append(pre, strings.TrimSpace(rr.String()))
		}
		if strings.Join(pre, "|") != strings.Join(tc.wantPrereq, "|") {
			t.Errorf("prerequisites = %q, want %q", pre, tc.wantPrereq)
		}
		var inserts int
		for _, rr := range m.Ns {
			h := rr.Header()
			switch h.Class {
			case dns.ClassANY: // delete RRset
			case dns.ClassINET:
				inserts++
				if h.Ttl != 30 {
					t.Errorf("insert %v has TTL %d, want 30", rr, h.Ttl)
				}
			default:
				t.Errorf("unexpected update RR %v", rr)
			}
		}
		if inserts != 2 {
			t.Errorf("%d inserts, want 2 (A and SRV of site b)", inserts)
		}
	}
	// Building the message must not alter the configured sites.
	if !u.cfg.Sites["a"].Equal(siteA) || u.cfg.Sites["a"].SRV[0].Target != "pbx-a.voip.test." {
		t.Fatalf("config changed: %s", u.cfg.Sites["a"])
	}
}
