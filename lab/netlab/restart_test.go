package netlab

import (
	"log/slog"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/platform/logtest"
	"github.com/fanpbx/fan/pkg/platform/waittest"
)

// A service killed with SIGKILL, or one that exits on its own, comes back
// after its restart delay, as under systemd's Restart=always, and the lab's
// log names the service, its host and how it ended; Stop ends it for good.
func TestStartServiceRestartsAfterAnExit(t *testing.T) {
	requireRoot(t)
	l := newLab(t, nil)
	var logs logtest.Buffer
	l.log = slog.New(slog.NewTextHandler(&logs, nil))
	const delay = 200 * time.Millisecond
	// Each run writes its pid and exits 3 on SIGUSR1.
	p, err := l.StartService("n1", "svc", []string{"sh", "-c", `trap "exit 3" USR1; echo "run $$"; while :; do sleep 0.05; done`}, nil, delay)
	if err != nil {
		t.Fatal(err)
	}
	first := p.Pid()
	waittest.Until(t, 3*time.Second, "the first run's output", func() bool { return strings.Contains(p.Tail(4096), "run ") })

	killed := time.Now()
	if err := syscall.Kill(first, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waittest.Until(t, 5*time.Second, "the restart after SIGKILL", func() bool { return p.Restarts() == 1 && !p.Exited() })
	if back := time.Since(killed); back < delay {
		t.Errorf("restarted %v after the kill, before its restart delay %v", back, delay)
	}
	second := p.Pid()
	if second == first {
		t.Fatalf("pid %d after the restart, the killed run's", second)
	}
	out := logs.String()
	for _, want := range []string{"restarting it as Restart=always would", "host=n1", "name=svc", `status="signal: killed"`, "process restarted"} {
		if !strings.Contains(out, want) {
			t.Errorf("lab log lacks %q:\n%s", want, out)
		}
	}

	// An exit of its own (status 3) restarts it too.
	waittest.Until(t, 3*time.Second, "the second run's output", func() bool { return strings.Count(p.Tail(4096), "run ") == 2 })
	if err := syscall.Kill(second, syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	waittest.Until(t, 5*time.Second, "the restart after exit status 3", func() bool { return p.Restarts() == 2 && !p.Exited() })
	if !strings.Contains(logs.String(), `status="exit status 3"`) {
		t.Errorf("lab log does not give the exit status:\n%s", logs.String())
	}
	waittest.Until(t, 3*time.Second, "the third run's output", func() bool { return strings.Count(p.Tail(4096), "run ") == 3 })

	// Stop is the lab's own stop: the service stays down.
	if err := p.Stop(); err != nil {
		t.Fatal(err)
	}
	third := p.Pid()
	unsupervised(t, p) // no restart can follow
	if p.Restarts() != 2 || !p.Exited() || p.Pid() != third || alive(third) {
		t.Fatalf("after Stop: restarts %d, exited %v, pid %d (was %d)", p.Restarts(), p.Exited(), p.Pid(), third)
	}
}

// A host that crashes (KillAll) takes its service manager with it: its
// services stay down.
func TestKillAllRestartsNothing(t *testing.T) {
	requireRoot(t)
	l := newLab(t, nil)
	p, err := l.StartService("n1", "svc", []string{"sleep", "30"}, nil, 50*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	// KillAll finds processes by namespace: wait until `ip netns exec` has
	// entered it.
	waittest.Until(t, 3*time.Second, "the service in n1's namespace", func() bool {
		pids, _ := l.PIDs("n1")
		return slices.Contains(pids, p.Pid())
	})
	if _, err := l.KillAll("n1"); err != nil {
		t.Fatal(err)
	}
	unsupervised(t, p)
	if !p.Exited() || p.Restarts() != 0 {
		t.Fatalf("after KillAll: exited %v, restarts %d", p.Exited(), p.Restarts())
	}
}

// unsupervised waits until no restart of p can follow.
func unsupervised(t *testing.T, p *Proc) {
	t.Helper()
	select {
	case <-p.unsupervised:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s on %s: still supervised", p.Name, p.Host)
	}
}

// Start (no restart) leaves an exited process exited.
func TestStartDoesNotRestart(t *testing.T) {
	requireRoot(t)
	l := newLab(t, nil)
	p, err := l.Start("n1", "once", []string{"sh", "-c", "exit 2"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Wait(); err == nil || !strings.Contains(err.Error(), "exit status 2") {
		t.Fatalf("Wait = %v, want exit status 2", err)
	}
	if p.Restarts() != 0 {
		t.Fatalf("restarts %d", p.Restarts())
	}
	if _, err := l.StartService("n1", "x", []string{"true"}, nil, 0); err == nil {
		t.Fatal("StartService accepted no restart delay")
	}
}
