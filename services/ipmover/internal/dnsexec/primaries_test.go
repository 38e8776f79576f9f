package dnsexec

import (
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/fanpbx/fan/lab/bindtest"
	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/waittest"
	"github.com/fanpbx/fan/services/ipmover/internal/execute/executetest"
)

// startSitePrimaries runs site A's and site B's authoritative servers:
// two primaries of the zone, one TSIG key, no transfer between them.
func startSitePrimaries(t *testing.T) (a, b *bindtest.Named) {
	ns := bindtest.StartPrimaries(t, 2, "voip.test", siteZone, "sip.voip.test. A")
	return ns[0], ns[1]
}

// primariesConfig is siteConfig with one primary per site.
func primariesConfig(url, stateFile, secret string, primaries ...string) Config {
	cfg := siteConfig(url, stateFile, "", secret)
	cfg.DNS.Primaries = primaries
	cfg.DNS.Timeout = 300 * time.Millisecond
	cfg.DNS.Resync = 100 * time.Millisecond
	return cfg
}

func servesSite(t *testing.T, n *bindtest.Named, ip string) bool {
	t.Helper()
	got, _ := n.Lookup(t, "sip.voip.test", dns.TypeA)
	return slices.Equal(got, []string{"30 " + ip})
}

func dnsStates(r *events.CommandResult) map[string]events.DNSServerState {
	out := map[string]events.DNSServerState{}
	for _, s := range r.DNS {
		out[s.Server] = s
	}
	return out
}

// The failure two sites exist for: site A loses its uplink, which takes its
// DNS server with it. The claim on site B is applied on B's server at once,
// with A's reported unreachable (the dark server does not hold B's update
// up); when A's server answers again it still serves site A, and its keeper
// brings it in line within one resync, reported as a correction. Both
// servers dark: the claim fails and says so. A restarted executor keeps the
// servers in line from the claim it recorded.
func TestDNSPrimariesDarkSite(t *testing.T) {
	a, b := startSitePrimaries(t)
	h := newBusHarness(t)
	cfg := primariesConfig(h.URL(), filepath.Join(h.Dir, "dns1-state.json"), a.Secret, a.Addr, b.Addr)
	h.start(cfg)

	place := h.Result(h.Send(1, dnsClaim("site-a", "")))
	wantOutcome(t, place, events.OutcomeApplied, "", StepDNSServerServed+":"+a.Addr, StepDNSServerServed+":"+b.Addr)

	a.Signal(t, syscall.SIGSTOP) // site A dark: its server answers nothing
	r := h.Result(h.Send(1, dnsClaim("site-b", "site-a")))
	wantOutcome(t, r, events.OutcomeApplied, "", StepDNSServerAccepted+":"+b.Addr, StepDNSVerified+":"+b.Addr)
	st := dnsStates(r)
	if s := st[a.Addr]; s.Outcome != events.DNSUnreachable || s.Error == "" {
		t.Fatalf("site A's server in the result: %+v, want unreachable with the error", s)
	}
	if s := st[b.Addr]; s.Outcome != events.DNSUpdated || s.Site != "site-b" || s.Records != "[A "+siteBIP+"]" {
		t.Fatalf("site B's server in the result: %+v, want updated to site-b", s)
	}
	if !servesSite(t, b, siteBIP) {
		t.Fatal("site B's server does not serve site B")
	}
	t.Logf("claim site-b with site A dark: %s", executetest.FormatSteps(r))

	// A frozen named took the executor's connection in its kernel and may
	// apply the update it was sent when it thaws (a dark site's server
	// never gets it: its packets are lost). Site A's server as it went
	// dark: site A's record, put back the way another writer would.
	a.Signal(t, syscall.SIGCONT)
	a.SetA(t, "sip.voip.test", siteAIP)
	back := time.Now()
	waittest.Until(t, 5*time.Second, "site A's server brought in line", func() bool { return servesSite(t, a, siteBIP) })
	t.Logf("site A's server served site B again %v after it served site A (resync %v)", time.Since(back).Round(time.Millisecond), cfg.DNS.Resync)
	_, p := h.WaitEvent("the correction", func(_ events.Envelope, p events.Payload) bool {
		c, ok := p.(*events.AddressCorrection)
		return ok && c.Kind == events.CorrectionDNSRealigned
	})
	c := p.(*events.AddressCorrection)
	if c.Node != "site-b" || len(c.DNS) != 1 || c.DNS[0].Server != a.Addr || c.DNS[0].Site != "site-b" || !strings.Contains(c.Reason, "site-a") {
		t.Fatalf("correction %+v", c)
	}

	// Records someone else wrote on one server are reported once, and
	// left there.
	b.SetA(t, "sip.voip.test", "198.51.100.99")
	h.WaitEvent("the failed correction", func(_ events.Envelope, p events.Payload) bool {
		c, ok := p.(*events.AddressCorrection)
		return ok && c.Kind == events.CorrectionFailed && strings.Contains(c.Error, "198.51.100.99")
	})
	time.Sleep(5 * cfg.DNS.Resync)
	failed := 0
	_, pays := h.Events()
	for _, p := range pays {
		if c, ok := p.(*events.AddressCorrection); ok && c.Kind == events.CorrectionFailed {
			failed++
		}
	}
	if failed != 1 {
		t.Fatalf("%d failed corrections for one foreign record, want 1", failed)
	}
	if !servesSite(t, b, "198.51.100.99") {
		t.Fatal("the foreign record was overwritten")
	}
	b.SetA(t, "sip.voip.test", siteBIP)

	// Both dark: nothing answers, the claim fails.
	a.Signal(t, syscall.SIGSTOP)
	b.Signal(t, syscall.SIGSTOP)
	failedClaim := h.Result(h.Send(1, dnsClaim("site-a", "site-b")))
	wantOutcome(t, failedClaim, events.OutcomeFailed, "no primary answered")
	a.Signal(t, syscall.SIGCONT)
	b.Signal(t, syscall.SIGCONT)
	// The failed claim was still the arbiter's choice: both servers follow
	// it once they answer.
	waittest.Until(t, 5*time.Second, "both servers on site A", func() bool { return servesSite(t, a, siteAIP) && servesSite(t, b, siteAIP) })

	// A restart keeps them in line from the recorded claim.
	h.stop("dns1")
	b.SetA(t, "sip.voip.test", siteBIP)
	h.start(cfg)
	waittest.Until(t, 5*time.Second, "site B's server back on site A after the restart", func() bool { return servesSite(t, b, siteAIP) })
}

// The primaries' mode keeps the executor contract against two real BINDs.
// No undo by hand: the keepers put the last claim's records back, which is
// what they are for.
func TestDNSPrimariesContract(t *testing.T) {
	executetest.Run(t, func(t *testing.T) executetest.Subject {
		a, b := startSitePrimaries(t)
		claim := func(group string) func(time.Time) events.Command {
			return func(notAfter time.Time) events.Command {
				return &events.ClaimIP{Group: group, Node: "site-b", Addresses: []string{"203.0.113.20/32"}, NotAfter: notAfter,
					PreviousHolder: "site-a", PreviousHolderFenced: true}
			}
		}
		return executetest.Subject{
			Node:         "site-b",
			Admitted:     claim("web"),
			NotAllowed:   claim("mail"),
			UnknownGroup: claim("billing"),
			Start: func(t *testing.T, url, stateFile string) func() {
				cfg := primariesConfig(url, stateFile, a.Secret, a.Addr, b.Addr)
				if err := cfg.Validate(); err != nil {
					t.Fatal(err)
				}
				s := New(cfg, slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})), "test")
				return executetest.Serve(t, s.Run)
			},
			Effect: func(t *testing.T) bool { return servesSite(t, a, siteBIP) && servesSite(t, b, siteBIP) },
		}
	})
}

// dns.primaries and its keys: resync only with primaries, primary and
// primaries not together, each primary a host:port.
func TestDNSPrimariesConfig(t *testing.T) {
	dir := t.TempDir()
	base := func() Config {
		c := primariesConfig("nats://127.0.0.1:4222", filepath.Join(dir, "s.json"), "c2VjcmV0", "192.0.2.53:53", "203.0.113.53:53")
		return c
	}
	if c := base(); c.Validate() != nil {
		t.Fatalf("valid config refused: %v", c.Validate())
	}
	for name, tc := range map[string]struct {
		change func(*Config)
		key    string
	}{
		"resync without primaries": {func(c *Config) { c.DNS.Primaries, c.DNS.Primary = nil, "192.0.2.53:53" }, "dns.resync"},
		"primary beside primaries": {func(c *Config) { c.DNS.Primary = "192.0.2.53:53" }, "dns"},
		"a primary without a port": {func(c *Config) { c.DNS.Primaries[1] = "203.0.113.53" }, "dns.primaries[1]"},
		"resync too short":         {func(c *Config) { c.DNS.Resync = time.Millisecond }, "dns.resync"},
	} {
		c := base()
		tc.change(&c)
		err := c.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.key) {
			t.Errorf("%s: got %v, want a refusal naming %s", name, err, tc.key)
		}
	}
}
