package app

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/platform/config"
	"github.com/fanpbx/fan/pkg/platform/waittest"
	"github.com/fanpbx/fan/services/arbiter/internal/notify"
)

// A notify hook that hangs never delays a failover: the arbiter places the
// group on n1, the hung hook sits in its first event with a five-minute
// timeout, and the failover to n2 happens regardless, told to the other
// hook (a real script recording what it is given) with n1 as the previous
// holder, while the hung one is still inside its first event.
func TestHungNotifyHookNeverDelaysAFailover(t *testing.T) {
	l := newLab(t, "n1", "n2")
	dir := t.TempDir()
	hang := filepath.Join(dir, "hang.sh")
	rec := filepath.Join(dir, "record.sh")
	for p, body := range map[string]string{
		hang: `echo $$ >> "$1/pids"; sleep 300`,
		rec:  `cat >> "$1/events"; echo >> "$1/events"`,
	} {
		if err := os.WriteFile(p, []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	l.nodesUp(ctx)
	l.arbiterWith("ctl", func(c *Config) {
		c.Notify = notify.Config{Hooks: []notify.HookConfig{
			{Name: "hangs", Command: []string{hang, dir}, Timeout: config.Duration(5 * time.Minute)},
			{Name: "records", Command: []string{rec, dir}, Events: []notify.Kind{notify.KindHolderChange}},
		}}
		if err := c.Validate(); err != nil {
			t.Fatal(err)
		}
	})
	l.waitHolder("n1", 10*time.Second)
	told := func() []notify.Event { return recorded(filepath.Join(dir, "events")) }
	waittest.Until(t, 10*time.Second, "placement told", func() bool { return len(told()) == 1 })
	pids := func() []string {
		b, _ := os.ReadFile(filepath.Join(dir, "pids"))
		return strings.Fields(string(b))
	}
	waittest.Until(t, 10*time.Second, "the hung hook inside its first event", func() bool { return len(pids()) == 1 })

	l.setPBX("n1", false)
	l.waitHolder("n2", 15*time.Second)
	waittest.Until(t, 10*time.Second, "failover told", func() bool { return len(told()) == 2 })
	ev := told()[1]
	// The decision is stored through the outbox, possibly after the
	// model executor's instant result: the change waits for its reason.
	if ev.Kind != notify.KindHolderChange || ev.Holder != "n2" || ev.Previous != "n1" || ev.Epoch == 0 ||
		ev.Action != "failover" || ev.Reason == "" || ev.Decision == "" {
		t.Errorf("failover told as %+v", ev)
	}
	if p := pids(); len(p) != 1 {
		t.Fatalf("the hung hook ran %d times: it was meant to hang in its first event", len(p))
	}
	pid, _ := strconv.Atoi(pids()[0])
	if err := syscall.Kill(pid, 0); err != nil {
		t.Fatalf("the hung hook (pid %d) is not running: the test proves nothing: %v", pid, err)
	}
}

// recorded reads the events a recording script appended, one JSON object
// per line; only whole lines (the script may be between its two writes).
func recorded(path string) []notify.Event {
	b, _ := os.ReadFile(path)
	lines := strings.Split(string(b), "\n")
	var out []notify.Event
	for _, line := range lines[:len(lines)-1] {
		var ev notify.Event
		if json.Unmarshal([]byte(line), &ev) == nil {
			out = append(out, ev)
		}
	}
	return out
}

// Two replicas with the same recording hook: only the one holding the lease
// runs it (the placement and the failover are each told once); when that
// replica dies, the successor tells again what happened in the last
// catch_up, under the same event ids, for receivers to dedupe.
func TestNotifyRunsOnTheLeaderAndTheSuccessorCatchesUp(t *testing.T) {
	l := newLab(t, "n1", "n2")
	dir := t.TempDir()
	rec := filepath.Join(dir, "record.sh")
	if err := os.WriteFile(rec, []byte("#!/bin/sh\ncat >> \"$1\"; echo >> \"$1\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	l.nodesUp(ctx)
	stop := map[string]context.CancelFunc{}
	for _, n := range []string{"ctlA", "ctlB"} {
		stop[n] = l.arbiterWith(n, func(c *Config) {
			c.Notify = notify.Config{Hooks: []notify.HookConfig{{Name: "records", Command: []string{rec, filepath.Join(dir, n)},
				Events: []notify.Kind{notify.KindHolderChange}}}}
			if err := c.Validate(); err != nil {
				t.Fatal(err)
			}
		})
	}
	l.waitHolder("n1", 10*time.Second)
	l.setPBX("n1", false)
	l.waitHolder("n2", 15*time.Second)
	all := func() (map[string][]notify.Event, int) {
		by, n := map[string][]notify.Event{}, 0
		for _, r := range []string{"ctlA", "ctlB"} {
			by[r] = recorded(filepath.Join(dir, r))
			n += len(by[r])
		}
		return by, n
	}
	waittest.Until(t, 10*time.Second, "placement and failover told", func() bool { _, n := all(); return n >= 2 })
	by, n := all()
	leader, follower := "ctlA", "ctlB"
	if len(by["ctlB"]) > 0 {
		leader, follower = follower, leader
	}
	if n != 2 || len(by[leader]) != 2 || by[leader][0].Holder != "n1" || by[leader][1].Holder != "n2" {
		t.Fatalf("told %+v: want the placement and the failover, each once, by one replica", by)
	}
	stop[leader]()
	waittest.Until(t, 20*time.Second, "the successor catching up", func() bool { return len(recorded(filepath.Join(dir, follower))) >= 2 })
	again := recorded(filepath.Join(dir, follower))
	for i, ev := range by[leader] {
		if again[i].ID != ev.ID || again[i].Holder != ev.Holder {
			t.Errorf("successor told %+v as event %d, want %+v again (same id)", again[i], i, ev)
		}
	}
}
