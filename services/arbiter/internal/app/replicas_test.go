package app

import (
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/platform/daemon/metricstest"
)

// TestReplicaPresenceOnMetrics: a replica configured with the cluster's
// replicas reports each as up while it hears it (itself included, through
// the server), a configured one that never ran as down, and one that stops
// as down within a second or so.
func TestReplicaPresenceOnMetrics(t *testing.T) {
	l := newLab(t, "n1")
	addr := metricstest.Listen(t)
	l.arbiterWith("ctlA", func(c *Config) {
		c.HTTPListen = addr
		c.Replicas = []string{"ctlA", "ctlB", "ctlC"}
	})
	stopB := l.arbiter("ctlB")
	const within = 10 * time.Second
	up := func(node string) string { return `fan_arbiter_replica_up{node="` + node + `"}` }
	metricstest.WaitFor(t, addr, "fan_arbiter_replicas_expected", metricstest.Is(3), within)
	metricstest.WaitFor(t, addr, up("ctlA"), metricstest.Is(1), within)
	metricstest.WaitFor(t, addr, up("ctlB"), metricstest.Is(1), within)
	metricstest.WaitFor(t, addr, up("ctlC"), metricstest.Is(0), within)
	stopB()
	metricstest.WaitFor(t, addr, up("ctlB"), metricstest.Is(0), within)
	metricstest.WaitFor(t, addr, up("ctlA"), metricstest.Is(1), time.Second)
}

// A replica heard once and silent past the presence deadline is down; one
// never configured appears once heard.
func TestReplicaPresenceDeadline(t *testing.T) {
	now := time.Unix(1000, 0)
	r := newReplicaPresence([]string{"a"}, func() time.Time { return now })
	if got := r.alive(); len(got) != 1 || got["a"] {
		t.Fatalf("before anything is heard: %v", got)
	}
	r.heard("a")
	r.heard("x")
	if got := r.alive(); !got["a"] || !got["x"] {
		t.Fatalf("just heard: %v", got)
	}
	now = now.Add(presenceDeadAfter)
	if got := r.alive(); !got["a"] {
		t.Fatalf("at the deadline: %v", got)
	}
	now = now.Add(time.Millisecond)
	if got := r.alive(); got["a"] || got["x"] {
		t.Fatalf("past the deadline: %v", got)
	}
}
