package app

import (
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/config"
	"github.com/fanpbx/fan/pkg/platform/daemon"
)

// TestRestoreBound: a failed restore (or persist) is retried at 100 ms
// doubling to 1 s, the last attempt falls on restore_within itself, and the
// attempt at the bound gives the role up.
func TestRestoreBound(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 3, 0, 0, 0, time.UTC)
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	cases := []struct {
		name     string
		within   time.Duration
		attempts []int // failed attempts, ms after the first
		wantNext []int // next attempt after each, ms after the first
		wantOver []bool
	}{
		{"default 1s of a 3s lease", time.Second,
			[]int{0, 100, 300, 700, 1000},
			[]int{100, 300, 700, 1000, 1000},
			[]bool{false, false, false, false, true}},
		{"long bound caps the backoff at 1s", 5 * time.Second,
			[]int{0, 100, 300, 700, 1500, 2500, 3500, 4500, 5000},
			[]int{100, 300, 700, 1500, 2500, 3500, 4500, 5000, 5000},
			[]bool{false, false, false, false, false, false, false, false, true}},
		{"late attempt past the bound", 200 * time.Millisecond,
			[]int{0, 900},
			[]int{100, 200},
			[]bool{false, true}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b := bound{within: tc.within}
			if b.failing() || b.due(t0) {
				t.Fatal("a fresh bound is failing")
			}
			for i, at := range tc.attempts {
				if i > 0 && !b.due(ms(at)) {
					t.Fatalf("attempt %d at %dms: not due (next %v)", i, at, b.next.Sub(t0))
				}
				if over := b.failed(ms(at)); over != tc.wantOver[i] {
					t.Fatalf("attempt %d at %dms: over=%v, want %v", i, at, over, tc.wantOver[i])
				}
				if got := b.next.Sub(t0); got != time.Duration(tc.wantNext[i])*time.Millisecond {
					t.Fatalf("attempt %d at %dms: next at %v, want %dms", i, at, got, tc.wantNext[i])
				}
				if b.due(b.next.Add(-time.Millisecond)) {
					t.Fatalf("attempt %d: due before its time", i)
				}
			}
			b.reset()
			if b.failing() || b.due(ms(10_000)) {
				t.Fatal("a reset bound is still failing")
			}
		})
	}
}

func TestRestoreWithinValidation(t *testing.T) {
	base := func() Config {
		return Config{LeaseTTL: config.Duration(3 * time.Second),
			Groups: []GroupConfig{{Name: "pbx", Addresses: []string{"198.51.100.10/24"}, Nodes: []string{"n1", "n2"}, HealthCheck: "pbx"}}}
	}
	c := base()
	c.Common = labCommon()
	if err := c.Validate(); err != nil || c.RestoreWithin.D() != time.Second {
		t.Fatalf("default: %v, restore_within %v (want a third of lease_ttl)", err, c.RestoreWithin.D())
	}
	for _, d := range []time.Duration{100 * time.Millisecond, 3 * time.Second, 5 * time.Second} {
		c := base()
		c.Common = labCommon()
		c.RestoreWithin = config.Duration(d)
		if err := c.Validate(); err == nil {
			t.Errorf("restore_within %v accepted with lease_ttl 3s", d)
		}
	}
}

func labCommon() daemon.Common {
	return daemon.Common{Cluster: "lab", Node: "ctl", Bus: bus.Config{URL: "nats://127.0.0.1:4222"}}
}
