package e2e

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fanpbx/fan/lab/prereq"
	"github.com/fanpbx/fan/lab/stack"
	"github.com/fanpbx/fan/pkg/events"
)

// testReporter logs a scenario's timeline, counted from the fault. The
// scenario reports lines from the goroutine following the bus while it
// marks the fault from its own.
type testReporter struct {
	t     *testing.T
	start time.Time
	mu    sync.Mutex
	fault time.Time
}

func (r *testReporter) Fault(at time.Time) {
	r.mu.Lock()
	r.fault = at
	r.mu.Unlock()
}

func (r *testReporter) Line(at time.Time, who, text string) {
	r.mu.Lock()
	fault := r.fault
	r.mu.Unlock()
	stamp := fmt.Sprintf("%9.3fs", at.Sub(r.start).Seconds())
	if !fault.IsZero() {
		stamp = fmt.Sprintf("fault%+8.3fs", at.Sub(fault).Seconds())
	}
	r.t.Logf("%s  %-14s %s", stamp, who, text)
}

// TestDNSTwoSites moves a DNS name between two sites the way its users
// run it (stack.StartSites: two sites each with a web server and its own
// BIND primary of the zone, the witness with fan, a client behind a BIND
// resolver, WAN links with delay). Site A loses its uplink, which takes its
// DNS server with it: the name moves to site B with A's server reported
// unreachable and B's updated, and the client's resolver answers site B
// once its cache expires (the figure is printed beside its bound, the
// checks' budget plus the TTL). Site A comes back: its DNS server, which
// still serves site A, is brought in line before anything else happens,
// and the name goes back only once a failback window opens.
func TestDNSTwoSites(t *testing.T) {
	if os.Geteuid() != 0 {
		prereq.SkipOrFail(t, "needs root for network namespaces")
	}
	prereq.Need(t, "bind9", "named")
	bin := stack.BinDirForTest(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	s, err := stack.StartSites(ctx, stack.SitesOptions{BinDir: bin,
		Log: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if s != nil {
		t.Cleanup(func() {
			if t.Failed() {
				t.Log(s.Logs(4000))
			}
			if err := s.Close(); err != nil {
				t.Errorf("close: %v", err)
			}
		})
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("WAN delay: %s", s.WAN.DelayMode())
	rep, err := stack.RunSitesScenario(ctx, s, &testReporter{t: t, start: time.Now()})
	if err != nil {
		t.Fatal(err)
	}

	// The failover: decided on the observer's quorum for site A, carried
	// out on the one DNS server that answers.
	if !strings.Contains(rep.Failover.Reason, "site_a_up") || rep.Failover.From != stack.SiteA {
		t.Errorf("failover %s->%s: %q, want from site-a on its quorum", rep.Failover.From, rep.Failover.To, rep.Failover.Reason)
	}
	res := rep.FailoverResult
	if res.Outcome != events.OutcomeApplied {
		t.Fatalf("failover claim %s: %s", res.Outcome, res.Error)
	}
	byServer := map[string]events.DNSServerState{}
	for _, d := range res.DNS {
		byServer[strings.Split(d.Server, ":")[0]] = d
	}
	if a := byServer["192.0.2.53"]; a.Outcome != events.DNSUnreachable || a.Error == "" {
		t.Errorf("site A's server in the failover's result: %+v, want unreachable", a)
	}
	b := byServer["203.0.113.53"]
	if b.Outcome != events.DNSUpdated || b.Site != stack.SiteB || b.Records != "[A 203.0.113.20]" {
		t.Errorf("site B's server in the failover's result: %+v, want updated to site-b", b)
	}
	accepted := stepAt(res, "dns_update_accepted:203.0.113.53:53")
	if accepted.IsZero() || rep.ClientOnB.Before(accepted) {
		t.Errorf("the client answered site B at %v, site B's server took the update at %v", rep.ClientOnB, accepted)
	}
	took := rep.FaultToClient()
	// The figure is the lab's to print; the test only catches a client
	// that waited well past the bound (a second TTL, a claim held up by
	// the dark server), with room for a loaded machine.
	if limit := rep.CheckBudget + rep.TTL + 5*time.Second; took > limit {
		t.Errorf("the client answered site B %v after the fault, beyond the checks' budget + the TTL + 5 s (%v)", took, limit)
	}
	t.Logf("fault to the client's first answer from site B: %v (the checks' budget %v + the TTL %v = %v); decision %v after the fault, site B's server updated %v after it",
		took.Round(time.Millisecond), rep.CheckBudget, rep.TTL, rep.CheckBudget+rep.TTL,
		rep.FailoverAt.Sub(rep.FaultAt).Round(time.Millisecond), accepted.Sub(rep.FailoverAt).Round(time.Millisecond))

	// Site A back: its server corrected at once, before anything else.
	c := rep.Realigned
	if len(c.DNS) != 1 || c.DNS[0].Outcome != events.DNSUpdated || c.DNS[0].Site != stack.SiteB || c.Node != stack.SiteB {
		t.Errorf("site A's correction: %+v", c)
	}
	if rep.AServesB.IsZero() || rep.RealignedAt.Before(rep.RestoreAt) || !rep.RealignedAt.Before(rep.WindowAt) {
		t.Errorf("site A's server: back at %v, corrected at %v, seen serving site B at %v, window at %v",
			rep.RestoreAt, rep.RealignedAt, rep.AServesB, rep.WindowAt)
	}
	t.Logf("site A's DNS server brought in line %v after its uplink came back (dns.resync %v)",
		rep.RealignedAt.Sub(rep.RestoreAt).Round(time.Millisecond), rep.Resync)

	// Back only inside a window: nothing before it, the failback after it,
	// citing its permit, carried out on both servers.
	if rep.EarlyFailback != nil {
		t.Fatalf("failback before any window: %+v", rep.EarlyFailback)
	}
	if !rep.FailbackAt.After(rep.WindowAt) || !citesPermit(rep.Trail, rep.Failback) {
		t.Errorf("failback at %v (window at %v) cites no permit: %+v", rep.FailbackAt, rep.WindowAt, rep.Failback)
	}
	if r := rep.FailbackResult; r.Outcome != events.OutcomeApplied || len(r.DNS) != 2 ||
		slices.ContainsFunc(r.DNS, func(d events.DNSServerState) bool { return d.Site != stack.SiteA }) {
		t.Errorf("failback result: %+v", r)
	}
	if rep.ClientOnA.Before(rep.FailbackAt) {
		t.Errorf("the client answered site A at %v, before the failback at %v", rep.ClientOnA, rep.FailbackAt)
	}
}

func stepAt(r *events.CommandResult, name string) time.Time {
	for _, s := range r.Steps {
		if s.Name == name {
			return s.At
		}
	}
	return time.Time{}
}

func citesPermit(trail []stack.Event, d *events.ArbiterDecision) bool {
	for _, e := range trail {
		if _, ok := e.Payload.(*events.FailbackPermit); ok && slices.Contains(d.CausedBy, e.Env.ID) {
			return true
		}
	}
	return false
}
