package e2e

import (
	"syscall"
	"testing"
	"time"

	"github.com/fanpbx/fan/lab/stack"
	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/waittest"
)

// A service killed with SIGKILL comes back a second later (its unit's
// RestartSec), as under systemd's Restart=always: the lab is the production
// a crash meets, not a cluster missing a service for the rest of the test.
// A stop of the lab's own (KillService) stays a stop.
func TestKilledServiceIsRestarted(t *testing.T) {
	ctx, _, st, _ := startLab(t, time.Minute, stack.Options{})
	p := st.Proc("n2", "fan-replicator")
	if p == nil {
		t.Fatal("no replicator on n2")
	}
	killed, killedAt := p.Pid(), time.Now()
	if err := syscall.Kill(killed, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waittest.Until(t, 10*time.Second, "the killed replicator to run again", func() bool {
		return p.Restarts() == 1 && !p.Exited()
	})
	if p.Pid() == killed {
		t.Fatalf("still pid %d", killed)
	}
	// Up, not merely started: the new run joins the bus and announces
	// itself after the kill (the killed run may not have got that far).
	waittest.Until(t, 20*time.Second, "the restarted replicator's start announcement", func() bool {
		evs, err := st.Events(ctx)
		if err != nil {
			t.Logf("events: %v", err)
			return false
		}
		for _, e := range evs {
			if a, ok := e.Payload.(*events.ServiceAnnounce); ok && a.Service == "replicator" && a.Node == "n2" &&
				a.State == events.ServiceStarted && e.Env.Time.After(killedAt) {
				return true
			}
		}
		return false
	})
	if p.Restarts() != 1 {
		t.Fatalf("restarted %d times:\n%s", p.Restarts(), p.Tail(3000))
	}
	if err := st.KillService("n2", "fan-replicator"); err != nil {
		t.Fatal(err)
	}
	if !p.Exited() || p.Restarts() != 1 {
		t.Fatalf("after KillService: exited %v, restarts %d", p.Exited(), p.Restarts())
	}
}
