package notify

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/waittest"
)

// script writes an executable shell script into a test directory.
func script(t testing.TB, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "hook.sh")
	writeScript(t, p, body)
	return p
}

func writeScript(t testing.TB, path, body string) {
	t.Helper()
	if err := os.WriteFile(path, []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
}

func sampleEvent() Event {
	return Event{ID: "0192b6a0-0000-7000-8000-000000000001", Kind: KindHolderChange, Time: time.Date(2026, 12, 1, 21, 0, 0, 0, time.UTC),
		Cluster: "lab", Group: "pbx", Node: "n2", Holder: "n2", Previous: "n1", Epoch: 7,
		Reason: "n1's pbx check is down; n2 is the highest-priority eligible node", Action: events.ActionFailover,
		Decision: "0192b6a0-0000-7000-8000-000000000000"}
}

// A hook's command reads the event as JSON on stdin and as FAN_*
// variables, and inherits nothing else of the arbiter's environment.
func TestCommandGetsTheEventOnStdinAndInItsEnvironment(t *testing.T) {
	t.Setenv("FAN_TEST_INHERITED", "must not reach the hook")
	out := filepath.Join(t.TempDir(), "out")
	sh := script(t, `cat > "$1.stdin"; env > "$1.env"; echo "$2"`)
	ev := sampleEvent()
	output, err := runCommand(context.Background(), []string{sh, out, "second argument, not split"}, ev, 10*time.Second)
	if err != nil {
		t.Fatalf("run: %v (output %q)", err, output)
	}
	if output != "second argument, not split" {
		t.Errorf("output %q: the argv was not passed as given", output)
	}
	b, err := os.ReadFile(out + ".stdin")
	if err != nil {
		t.Fatal(err)
	}
	var got Event
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatalf("stdin %q: %v", b, err)
	}
	if got != ev {
		t.Errorf("stdin event\n got %+v\nwant %+v", got, ev)
	}
	envb, err := os.ReadFile(out + ".env")
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{}
	for line := range strings.SplitSeq(strings.TrimSpace(string(envb)), "\n") {
		k, v, _ := strings.Cut(line, "=")
		env[k] = v
	}
	for k, want := range map[string]string{
		"FAN_EVENT": "holder_change", "FAN_EVENT_ID": ev.ID, "FAN_GROUP": "pbx", "FAN_HOLDER": "n2", "FAN_PREVIOUS": "n1",
		"FAN_NODE": "n2", "FAN_EPOCH": "7", "FAN_REASON": ev.Reason, "FAN_ACTION": "failover", "FAN_DECISION": ev.Decision,
		"FAN_CLUSTER": "lab", "FAN_TIME": "2026-12-01T21:00:00Z", "FAN_CHECK": "",
	} {
		if got, ok := env[k]; !ok || got != want {
			t.Errorf("%s = %q (set %v), want %q", k, got, ok, want)
		}
	}
	if _, ok := env["FAN_TEST_INHERITED"]; ok {
		t.Error("the hook inherited the arbiter's environment")
	}
	if !strings.HasPrefix(env["PATH"], "/usr/local/sbin:") {
		t.Errorf("PATH = %q", env["PATH"])
	}
}

func TestCommandFailureIsReported(t *testing.T) {
	sh := script(t, `echo "cannot page: $FAN_GROUP" >&2; exit 3`)
	output, err := runCommand(context.Background(), []string{sh}, sampleEvent(), 10*time.Second)
	if err == nil || errors.Is(err, errTimedOut) || !strings.Contains(err.Error(), "exit status 3") {
		t.Fatalf("err = %v, want exit status 3", err)
	}
	if output != "cannot page: pbx" {
		t.Errorf("output %q", output)
	}
}

// groupAlive reports whether any process of process group pgid is still
// running (a zombie waiting for its reaper does not count: it runs nothing).
func groupAlive(t *testing.T, pgid int) []int {
	t.Helper()
	dirs, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var alive []int
	for _, d := range dirs {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", d.Name(), "stat"))
		if err != nil {
			continue // gone meanwhile
		}
		// pid (comm) state ppid pgrp ...: comm may hold spaces, so split after ')'.
		s := string(b)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(f) < 3 {
			continue
		}
		if g, _ := strconv.Atoi(f[2]); g == pgid && f[0] != "Z" && f[0] != "X" {
			alive = append(alive, pid)
		}
	}
	return alive
}

// A hook that hangs is killed at its timeout, with every process it
// started in its group: nothing of it is left running.
func TestHungCommandIsKilledWithItsProcessGroup(t *testing.T) {
	dir := t.TempDir()
	sh := script(t, `sleep 300 & echo $! > "$1/child"; echo $$ > "$1/pid"; wait`)
	start := time.Now()
	_, err := runCommand(context.Background(), []string{sh, dir}, sampleEvent(), 500*time.Millisecond)
	if !errors.Is(err, errTimedOut) {
		t.Fatalf("err = %v, want a timeout", err)
	}
	t.Logf("killed after %v", time.Since(start))
	pid := readPid(t, filepath.Join(dir, "pid"))
	child := readPid(t, filepath.Join(dir, "child"))
	if child == pid {
		t.Fatal("the child is the script")
	}
	waittest.Until(t, 10*time.Second, "process group gone", func() bool { return len(groupAlive(t, pid)) == 0 })
}

func readPid(t *testing.T, path string) int {
	t.Helper()
	var pid int
	waittest.Until(t, 5*time.Second, "pid file "+path, func() bool {
		b, err := os.ReadFile(path)
		if err != nil {
			return false
		}
		pid, err = strconv.Atoi(strings.TrimSpace(string(b)))
		return err == nil
	})
	return pid
}
