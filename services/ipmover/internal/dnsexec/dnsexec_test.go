package dnsexec

import (
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/fanpbx/fan/lab/bindtest"
	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/config"
	"github.com/fanpbx/fan/pkg/platform/daemon"
	"github.com/fanpbx/fan/services/ipmover/internal/dnsupdate"
	"github.com/fanpbx/fan/services/ipmover/internal/execute/executetest"
)

const siteZone = `$TTL 60
@     IN SOA ns1.voip.test. hostmaster.voip.test. ( 1 3600 600 86400 30 )
      IN NS  ns1.voip.test.
ns1   IN A   127.0.0.1
sip 30 IN A  192.0.2.10
`

const (
	siteAIP = "192.0.2.10"
	siteBIP = "203.0.113.20"
)

func startSiteNamed(t *testing.T) *bindtest.Named {
	return bindtest.Start(t, "voip.test", siteZone, "sip.voip.test. A")
}

// harness is the test arbiter with DNS executors on its bus.
type harness struct {
	*executetest.Arbiter
	stops map[string]func()
}

func newBusHarness(t *testing.T) *harness {
	return &harness{Arbiter: executetest.NewArbiter(t), stops: map[string]func(){}}
}

// start runs a DNS executor until the test ends.
func (h *harness) start(cfg Config) {
	t := h.T
	t.Helper()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	s := New(cfg, slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})), "test")
	h.stops[cfg.Node] = h.Start("ipmover", cfg.Node, s.Run)
}

func (h *harness) stop(node string) { h.stops[node]() }

func (h *harness) dnsConfig(primary, secret string, servers ...string) Config {
	return siteConfig(h.URL(), filepath.Join(h.Dir, "dns1-state.json"), primary, secret, servers...)
}

// siteConfig is a DNS executor moving sip.voip.test between site-a and
// site-b on the BIND at primary.
func siteConfig(url, stateFile, primary, secret string, servers ...string) Config {
	return Config{
		Common:    daemon.Common{Cluster: "lab", Node: "dns1", Bus: bus.Config{URL: url}, ShutdownTimeout: config.Duration(5 * time.Second)},
		StateFile: stateFile,
		DNS: DNSConfig{Group: "web", Config: dnsupdate.Config{
			Zone: "voip.test", Name: "sip.voip.test", Types: []string{"A"}, TTL: 30 * time.Second,
			Sites: map[string]dnsupdate.Values{
				"site-a": {A: []netip.Addr{netip.MustParseAddr(siteAIP)}},
				"site-b": {A: []netip.Addr{netip.MustParseAddr(siteBIP)}},
			},
			Primary: primary, Servers: servers, Key: dnsupdate.Key{Name: bindtest.KeyName, Secret: secret},
			Timeout: 2 * time.Second, VerifyTimeout: 3 * time.Second, VerifyInterval: 10 * time.Millisecond,
		}},
	}
}

func dnsClaim(site, prev string) *events.ClaimIP {
	return &events.ClaimIP{Group: "web", Node: site, Addresses: []string{"192.0.2.10/32"}, NotAfter: time.Now().Add(10 * time.Second),
		PreviousHolder: prev, PreviousHolderFenced: prev != ""}
}

func dnsRelease(site string) *events.ReleaseIP {
	return &events.ReleaseIP{Group: "web", Node: site, Addresses: []string{"192.0.2.10/32"}, NotAfter: time.Now().Add(10 * time.Second)}
}

func wantServed(t *testing.T, n *bindtest.Named, ip string) uint32 {
	t.Helper()
	got, serial := n.Lookup(t, "sip.voip.test", dns.TypeA)
	if want := []string{"30 " + ip}; !slices.Equal(got, want) {
		t.Fatalf("sip.voip.test A = %q, want %q (ttl rdata)", got, want)
	}
	return serial
}

func wantOutcome(t *testing.T, r *events.CommandResult, o events.Outcome, errPart string, steps ...string) {
	t.Helper()
	if r.Outcome != o || !strings.Contains(r.Error, errPart) {
		t.Fatalf("result %s (%q), want %s containing %q", r.Outcome, r.Error, o, errPart)
	}
	got := executetest.StepNames(r)
	for _, s := range steps {
		if !slices.ContainsFunc(got, func(g string) bool { return strings.HasPrefix(g, s) }) {
			t.Fatalf("steps %v lack %s", got, s)
		}
	}
}

// The DNS executor, driven over the bus like the arbiter drives it, against
// a real BIND: a claim on site B swaps the A record in one signed UPDATE
// (verified at a newer serial on the authoritative server); the release of
// site A touches nothing; the same move again is "already served"; a record
// someone else wrote is reported, never overwritten; an older epoch is
// refused; failback puts site A's record back the same way.
func TestDNSExecutorMovesName(t *testing.T) {
	n := startSiteNamed(t)
	h := newBusHarness(t)
	h.start(h.dnsConfig(n.Addr, n.Secret))
	serial0 := wantServed(t, n, siteAIP)

	claim := h.Send(1, dnsClaim("site-b", "site-a"))
	r := h.Result(claim)
	wantOutcome(t, r, events.OutcomeApplied, "", StepDNSAccepted, StepDNSVerified+":"+n.Addr)
	if r.Node != "site-b" || r.Group != "web" {
		t.Fatalf("result names %s/%s, want site-b/web", r.Node, r.Group)
	}
	if s := wantServed(t, n, siteBIP); s <= serial0 {
		t.Fatalf("serial %d after the swap, was %d", s, serial0)
	}
	t.Logf("claim site-b: %s", executetest.FormatSteps(r))

	rel := h.Result(h.Send(1, dnsRelease("site-a")))
	wantOutcome(t, rel, events.OutcomeApplied, "", StepDNSReleaseNoop)
	wantServed(t, n, siteBIP)

	again := h.Result(h.Send(1, dnsClaim("site-b", "site-a")))
	wantOutcome(t, again, events.OutcomeApplied, "", StepDNSAlreadyServed)

	// Someone else points the name elsewhere: the failback's prerequisite
	// (site B's record) fails, and the executor reports what it found.
	n.SetA(t, "sip.voip.test", "198.51.100.99")
	stale := h.Result(h.Send(1, dnsClaim("site-a", "site-b")))
	wantOutcome(t, stale, events.OutcomeFailed, "198.51.100.99")
	wantServed(t, n, "198.51.100.99")
	// A placement (no previous holder) does not overwrite it either.
	place := h.Result(h.Send(1, dnsClaim("site-a", "")))
	wantOutcome(t, place, events.OutcomeFailed, "no configured site")
	wantServed(t, n, "198.51.100.99")

	n.SetA(t, "sip.voip.test", siteBIP)
	back := h.Result(h.Send(2, dnsClaim("site-a", "site-b")))
	wantOutcome(t, back, events.OutcomeApplied, "", StepDNSAccepted, StepDNSVerified)
	wantServed(t, n, siteAIP)

	old := h.Result(h.Send(1, dnsClaim("site-b", "site-a")))
	wantOutcome(t, old, events.OutcomeStaleEpoch, "older than epoch 2")
	wantServed(t, n, siteAIP)
}

// A wrong TSIG secret changes nothing and says so; a second authoritative
// server that never gets the change makes the claim fail as unverified,
// naming that server, although the primary serves the new record.
func TestDNSExecutorWrongKeyAndUnverified(t *testing.T) {
	n := startSiteNamed(t)
	lagging := startSiteNamed(t) // authoritative for the zone, never updated
	h := newBusHarness(t)

	bad := h.dnsConfig(n.Addr, "c2VjcmV0LXRoYXQtbmFtZWQtZG9lcy1ub3Qta25vdw==")
	bad.Node = "dns-bad"
	h.start(bad)
	r := h.Result(h.Send(1, dnsClaim("site-b", "site-a")))
	wantOutcome(t, r, events.OutcomeFailed, "key not accepted")
	wantServed(t, n, siteAIP)
	h.stop("dns-bad")

	cfg := h.dnsConfig(n.Addr, n.Secret, n.Addr, lagging.Addr)
	cfg.StateFile = filepath.Join(h.Dir, "dns2-state.json")
	cfg.DNS.VerifyTimeout = 500 * time.Millisecond
	h.start(cfg)
	r = h.Result(h.Send(1, dnsClaim("site-b", "site-a")))
	wantOutcome(t, r, events.OutcomeFailed, "not served by every authoritative server", StepDNSVerified+":"+n.Addr)
	if !strings.Contains(r.Error, lagging.Addr) {
		t.Fatalf("error %q does not name the lagging server %s", r.Error, lagging.Addr)
	}
	wantServed(t, n, siteBIP)
}

func TestDNSConfigValidation(t *testing.T) {
	dir := t.TempDir()
	base := func() Config {
		c := Config{Common: daemon.Common{Cluster: "lab", Node: "dns1", Bus: bus.Config{URL: "nats://127.0.0.1:4222"}},
			StateFile: filepath.Join(dir, "s.json"),
			DNS: DNSConfig{Group: "web", Config: dnsupdate.Config{Zone: "voip.test", Name: "sip.voip.test", Types: []string{"A"},
				Sites: map[string]dnsupdate.Values{
					"site-a": {A: []netip.Addr{netip.MustParseAddr(siteAIP)}},
					"site-b": {A: []netip.Addr{netip.MustParseAddr(siteBIP)}},
				}, Primary: "127.0.0.1:53", Key: dnsupdate.Key{Name: "k", Secret: "c2VjcmV0"}}}}
		return c
	}
	if c := base(); c.Validate() != nil {
		t.Fatalf("valid config refused: %v", c.Validate())
	}
	for name, mod := range map[string]func(*Config){
		"no state file":   func(c *Config) { c.StateFile = "" },
		"no group":        func(c *Config) { c.DNS.Group = "" },
		"site not a node": func(c *Config) { c.DNS.Sites["site.c"] = dnsupdate.Values{} },
		"one site":        func(c *Config) { delete(c.DNS.Sites, "site-b") },
		"no primary":      func(c *Config) { c.DNS.Primary = "" },
	} {
		c := base()
		mod(&c)
		if err := c.Validate(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}
