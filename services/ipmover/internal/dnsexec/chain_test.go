package dnsexec

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fanpbx/fan/lab/stack"
	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/waittest"
)

// TestDNSSiteFailoverChain is a DNS site failover end to end with every part real: the
// fan-prober binary judges two web sites ("up while at least 2 of its HTTP,
// TCP and DNS checks are up"), the fan-arbiter binary decides from that
// prober's quorum (health_from), the fan-scheduler binary opens a failback
// window, and this package's DNS executor rewrites the name on a real BIND.
// Site A's web server stops: the name moves to site B. It comes back: the
// name moves back inside the window.
func TestDNSSiteFailoverChain(t *testing.T) {
	bin := stack.BinDirForTest(t)
	n := startSiteNamed(t)
	h := newBusHarness(t)
	siteA, siteB := startSite(t), startSite(t)

	h.start(h.dnsConfig(n.Addr, n.Secret))
	h.runBinary(bin, "fan-prober", fmt.Sprintf(`cluster: lab
node: mon1
bus: {url: %q}
heartbeat_interval: 1s
checks:
%s%s
groups:
  - {name: site_a_up, role: peer, target_node: site-a, min_up: 2, checks: [http-site-a, tcp-site-a, dns-site-a]}
  - {name: site_b_up, role: peer, target_node: site-b, min_up: 2, checks: [http-site-b, tcp-site-b, dns-site-b]}
`, h.Srv.ClientURL(), siteChecks("site-a", siteA.addr, n.Addr), siteChecks("site-b", siteB.addr, n.Addr)))
	// The window is open before the arbiter starts: its permit is on the
	// bus already and is restated only a minute later (tick_every), so the
	// arbiter must read the one in force when it starts.
	h.runBinary(bin, "fan-scheduler", fmt.Sprintf(`cluster: lab
node: ctl1
bus: {url: %q}
groups:
  - name: web
    windows:
      - name: all-day
        once: [{from: %q, to: %q}]
`, h.Srv.ClientURL(), time.Now().Add(-time.Hour).Format(time.RFC3339), time.Now().Add(time.Hour).Format(time.RFC3339)))
	h.WaitEvent("the window's permit", func(_ events.Envelope, p events.Payload) bool {
		_, ok := p.(*events.FailbackPermit)
		return ok
	})
	h.runBinary(bin, "fan-arbiter", fmt.Sprintf(`cluster: lab
node: ctl1
bus: {url: %q}
lease_ttl: 1s
groups:
  - name: web
    addresses: [192.0.2.10/32]
    nodes: [site-a, site-b]
    health_check: site
    health_from:
      site-a: {observer: mon1, check: site_a_up}
      site-b: {observer: mon1, check: site_b_up}
    failback: {stable_for: 1s}
policy: {hold_down: 2s}
`, h.Srv.ClientURL()))
	// The zone already serves site A, so the first placement changes nothing.
	h.moveApplied(events.ActionPlace, "site-a", 30*time.Second)
	wantServed(t, n, siteAIP)

	siteA.stop(t)
	failover := h.moveApplied(events.ActionFailover, "site-b", 15*time.Second)
	wantServed(t, n, siteBIP)
	if !strings.Contains(failover.Reason, "site_a_up") {
		t.Fatalf("failover reason %q does not name site A's quorum", failover.Reason)
	}

	siteA.restart(t)
	failback := h.moveApplied(events.ActionFailback, "site-a", 30*time.Second)
	wantServed(t, n, siteAIP)
	if !h.citesPermit(failback) {
		t.Fatalf("failback %+v cites no failback permit", failback)
	}
}

// siteChecks is a site's three checks as the monitor node mon1 runs them.
func siteChecks(site, web, dnsServer string) string {
	var b strings.Builder
	for _, c := range []struct{ kind, address, extra string }{
		{"http", "http://" + web + "/", ""},
		{"tcp", web, ""},
		{"dns", dnsServer, "query: voip.test, "},
	} {
		fmt.Fprintf(&b, "  - {name: %s-%s, kind: %s, role: peer, target_node: %s, address: %q, %sinterval: 200ms, timeout: 150ms, rise: 2, fall: 2}\n",
			c.kind, site, c.kind, site, c.address, c.extra)
	}
	return b.String()
}

// site is a web server that can be stopped and started again on its port.
type site struct {
	addr string
	srv  *http.Server
	done chan struct{}
}

func startSite(t *testing.T) *site {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &site{addr: ln.Addr().String()}
	s.serve(ln)
	t.Cleanup(func() { s.stop(t) })
	return s
}

func (s *site) serve(ln net.Listener) {
	s.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) }),
		ReadHeaderTimeout: time.Second}
	s.done = make(chan struct{})
	go func() { _ = s.srv.Serve(ln); close(s.done) }()
}

func (s *site) stop(t *testing.T) {
	if s.srv == nil {
		return
	}
	if err := s.srv.Close(); err != nil {
		t.Errorf("stop site %s: %v", s.addr, err)
	}
	<-s.done
	s.srv = nil
}

func (s *site) restart(t *testing.T) {
	t.Helper()
	ln, err := net.Listen("tcp", s.addr)
	if err != nil {
		t.Fatalf("site %s back on its port: %v", s.addr, err)
	}
	s.serve(ln)
}

// runBinary starts one of fan's binaries with cfg as its configuration,
// its output in a file that is printed if the test fails, and kills it at
// the end of the test.
func (h *harness) runBinary(binDir, name, cfg string) {
	t := h.T
	t.Helper()
	cfgPath := filepath.Join(h.Dir, name+".yaml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(h.Dir, name+".log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(binDir, name), "-config", cfgPath)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-exited
		}
		_ = logFile.Close()
		if t.Failed() {
			out, _ := os.ReadFile(logPath)
			t.Logf("%s output (last lines):\n%s", name, lastLines(string(out), 30))
		}
	})
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// moveApplied waits for the arbiter's decision to move group web to the
// site, then for the DNS executor's "applied" to that decision's claim.
func (h *harness) moveApplied(action events.Action, to string, within time.Duration) *events.ArbiterDecision {
	h.T.Helper()
	var d *events.ArbiterDecision
	waittest.Until(h.T, within, fmt.Sprintf("%s to %s, applied", action, to), func() bool {
		_, pays := h.Events()
		for _, p := range pays {
			if dec, ok := p.(*events.ArbiterDecision); ok && dec.Group == "web" && dec.Action == action && dec.To == to && len(dec.Commands) > 0 {
				d = dec
			}
		}
		if d == nil {
			return false
		}
		claim := d.Commands[len(d.Commands)-1]
		return slices.ContainsFunc(pays, func(p events.Payload) bool {
			r, ok := p.(*events.CommandResult)
			return ok && r.CommandID == claim && r.Outcome == events.OutcomeApplied
		})
	})
	return d
}

// citesPermit reports whether the decision names a failback permit among its causes.
func (h *harness) citesPermit(d *events.ArbiterDecision) bool {
	evs, pays := h.Events()
	for i, env := range evs {
		if _, ok := pays[i].(*events.FailbackPermit); ok && slices.Contains(d.CausedBy, env.ID) {
			return true
		}
	}
	return false
}
