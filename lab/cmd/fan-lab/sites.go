package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/fanpbx/fan/lab/stack"
	"github.com/fanpbx/fan/pkg/events"
)

// Fault and Line make the timeline a stack.Reporter.
func (t *timeline) Fault(at time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.fault = at
}

func (t *timeline) Line(at time.Time, who, text string) { t.line(at, who, text) }

// runSites is -scenario sites: a DNS name between two sites, site A's
// uplink cut and restored (stack.RunSitesScenario, as TestDNSTwoSites).
func runSites(ctx context.Context, bin string, keep bool, log *slog.Logger) error {
	tl := &timeline{start: time.Now(), w: os.Stdout}
	o := stack.SitesOptions{BinDir: bin, Log: log}
	tl.say("building the sites lab: site A (192.0.2.0/24) and site B (203.0.113.0/24), each a web server and a BIND 9 primary of voip.test;")
	tl.say("the witness (198.51.100.0/25): fan-nats, arbiter, scheduler, the observer's prober, the DNS executor (one primary per site);")
	tl.say("the client's place (198.51.100.128/25): a BIND resolver and the client; WAN uplinks delayed 20, 25, 20 and 30 ms each way")
	s, err := stack.StartSites(ctx, o)
	if s != nil {
		defer func() {
			tl.say("tearing the lab down")
			if err := s.Close(); err != nil {
				fmt.Fprintln(os.Stderr, "fan-lab: close:", err)
			}
		}()
	}
	if err != nil {
		return err
	}
	o = s.Opts
	tl.say(fmt.Sprintf("WAN delay: %s; the observer checks each site's HTTP, TCP and DNS every %v (timeout %v, fall %d), a site is up while 2 of 3 are; TTL %v; dns.resync %v",
		s.WAN.DelayMode(), o.Interval, o.Timeout, o.Fall, o.TTL, o.Resync))
	rep, err := stack.RunSitesScenario(ctx, s, tl)
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s\n", s.Logs(3000))
		return err
	}
	fmt.Printf("\nfault to the client's first answer from site B: %v (bound: the checks' budget %v + the TTL %v = %v)\n",
		rep.FaultToClient().Round(time.Millisecond), rep.CheckBudget, rep.TTL, rep.CheckBudget+rep.TTL)
	fmt.Printf("  detection and decision %v, the DNS update on site B's server %v later, then the resolver's cache\n",
		rep.FailoverAt.Sub(rep.FaultAt).Round(time.Millisecond), dnsUpdated(rep).Round(time.Millisecond))
	fmt.Printf("site A's DNS server brought in line %v after its uplink came back (dns.resync %v)\n",
		rep.RealignedAt.Sub(rep.RestoreAt).Round(time.Millisecond), rep.Resync)
	if out, err := s.Fanctl(ctx, "status"); err == nil {
		fmt.Printf("\n%s\n", out)
	}
	if keep {
		tl.say("lab kept running; Ctrl-C to tear it down")
		<-ctx.Done()
	}
	return nil
}

// dnsUpdated is the decision to site B's server's update in the result.
func dnsUpdated(rep stack.SitesReport) time.Duration {
	if rep.FailoverResult == nil {
		return 0
	}
	for _, st := range rep.FailoverResult.Steps {
		if _, ok := events.StepServer(st.Name, events.StepDNSVerified); ok {
			return st.At.Sub(rep.FailoverAt)
		}
	}
	return 0
}
