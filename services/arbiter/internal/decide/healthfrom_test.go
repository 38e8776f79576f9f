package decide

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/events"
)

// siteConfig is a DNS site failover as a group: two DNS sites that run no prober; a
// monitor host "mon" runs a quorum group per site ("at least N of the
// site's HTTP, DNS and ICMP checks up", role peer, target_node the site),
// which the fixture names peer-<site>.
func siteConfig() Config {
	return testConfig(Group{Name: "web", Addresses: []string{"192.0.2.10/32"}, Nodes: []string{"site-a", "site-b"},
		HealthCheck: "site", Failback: FailbackPolicy{StableFor: 2 * time.Second},
		HealthFrom: map[string]HealthSource{
			"site-a": {Observer: "mon", Check: "peer-site-a"},
			"site-b": {Observer: "mon", Check: "peer-site-b"},
		}})
}

func monHB(f *fx) Output { return f.hb("mon") }

// runMon lets d pass in one-second steps with only the monitor heartbeating
// (the sites never do), ticking after each.
func runMon(d time.Duration, monSilent bool) func(f *fx) Output {
	return func(f *fx) Output {
		var all Output
		for range int(d / time.Second) {
			f.now = f.now.Add(time.Second)
			if !monSilent {
				all.Emits = append(all.Emits, f.hb("mon").Emits...)
			}
			all.Emits = append(all.Emits, f.tick(0).Emits...)
		}
		return all
	}
}

// A site's eligibility comes from the monitor's quorum group about it, and
// its presence from the monitor's: the group is placed on site A, fails
// over to B when A's quorum drops, waits for a permit while A is back, fails
// back inside the window (a site has no calls to drain), and is held, not
// moved, when the monitor itself falls silent.
func TestHealthFromSites(t *testing.T) {
	cases := []struct {
		name  string
		steps []step
	}{
		{
			name: "failover and failback between sites",
			steps: []step{
				{name: "monitor reports both sites up", do: monHB, want: []string{"place ->site-a", "claim site-a"},
					reason: "site-a is the highest-priority eligible node"},
				{name: "confirmed", do: res("web", "site-a", events.OutcomeApplied)},
				{name: "steady", do: runMon(5*time.Second, false)},
				{name: "site A quorum lost", do: peerSees("mon", "site-a", down),
					want:   []string{"failover site-a->site-b", "release site-a", "claim site-b prev=site-a fenced"},
					reason: "holder site-a reports mon/peer-site-a down"},
				{name: "B confirmed", do: res("web", "site-b", events.OutcomeApplied)},
				{name: "A back: no permit", do: peerSees("mon", "site-a", up), want: []string{"hold site-b"}, reason: "needs a permit"},
				{name: "window opens", do: func(f *fx) Output { return f.permit("web", f.now, f.now.Add(time.Hour)) },
					want: []string{"hold site-b"}, reason: "hold-down"},
				{name: "stable and past hold-down", do: runMon(12*time.Second, false),
					want: []string{"failback site-b->site-a", "release site-b", "claim site-a prev=site-b fenced"}, reason: "failback to preferred site-a"},
			},
		},
		{
			name: "a silent monitor moves nothing",
			steps: []step{
				{name: "placed", do: monHB, want: []string{"place ->site-a", "claim site-a"}},
				{name: "confirmed", do: res("web", "site-a", events.OutcomeApplied)},
				{name: "monitor silent", do: runMon(5*time.Second, true), want: []string{"hold site-a"},
					reason: "holder site-a is silent on the bus and no peer reports on it: not replaced"},
				{name: "monitor back", do: runMon(2*time.Second, false)},
				{name: "then A down moves", do: peerSees("mon", "site-a", down),
					want: []string{"failover site-a->site-b", "release site-a", "claim site-b prev=site-a fenced"}},
			},
		},
		{
			name: "nothing placed before the monitor speaks; a down site is never the target",
			steps: []step{
				{name: "A down first", do: func(f *fx) Output {
					f.peer["mon"]["site-a"] = events.CheckState{TargetNode: "site-a", Role: events.RolePeer, Health: down, Since: f.now}
					return f.tick(time.Second)
				}},
				{name: "monitor heartbeats: B placed", do: runMon(4*time.Second, false), want: []string{"place ->site-b", "claim site-b"}},
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFx(t, siteConfig())
			f.lead(1)
			f.peer["mon"] = map[string]events.CheckState{
				"site-a": {TargetNode: "site-a", Role: events.RolePeer, Health: up, Since: f.now},
				"site-b": {TargetNode: "site-b", Role: events.RolePeer, Health: up, Since: f.now},
			}
			f.play(tc.steps)
			// The status shows a site heard through its observer.
			for _, g := range f.c.Snapshot().Groups {
				for _, n := range g.Nodes {
					if n.LastHeartbeat.IsZero() {
						t.Fatalf("status of %s has no heartbeat although mon heartbeats for it", n.Node)
					}
				}
			}
		})
	}
}

func TestHealthFromConfig(t *testing.T) {
	hf := func(m map[string]HealthSource) Config {
		c := siteConfig()
		c.Groups[0].HealthFrom = m
		return c
	}
	cases := []struct {
		name string
		cfg  Config
		want string
	}{
		{"not a member", hf(map[string]HealthSource{"site-c": {Observer: "mon", Check: "x"}}), "not a member"},
		{"itself", hf(map[string]HealthSource{"site-a": {Observer: "site-a", Check: "x"}}), "names itself"},
		{"bad check", hf(map[string]HealthSource{"site-a": {Observer: "mon", Check: "a.b"}}), "health_from check"},
		{"chain", hf(map[string]HealthSource{"site-a": {Observer: "site-b", Check: "x"}, "site-b": {Observer: "mon", Check: "y"}}),
			"takes its own from another node"},
		{"two observers", func() Config {
			c := siteConfig()
			c.Groups = append(c.Groups, Group{Name: "web2", Addresses: []string{addr}, Nodes: []string{"site-a"}, HealthCheck: "x",
				HealthFrom: map[string]HealthSource{"site-a": {Observer: "mon2", Check: "x"}}})
			return c
		}(), "one observer per node"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New(tc.cfg)
			if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want ErrConfig containing %q", err, tc.want)
			}
		})
	}
	if _, err := New(siteConfig()); err != nil {
		t.Fatal(err)
	}
}
