// Package kamailiotest runs real Kamailio proxies and UASes (configurations
// from package kamailio) and SIPp on loopback for tests: the UAS logs a
// marker line per INVITE, which is what "calls reach node X" counts.
package kamailiotest

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fanpbx/fan/lab/peer"
	"github.com/fanpbx/fan/lab/prereq"
	"github.com/fanpbx/fan/pkg/platform/porttest"
	"github.com/fanpbx/fan/pkg/platform/waittest"
)

// Need skips (fails under CI) unless every program is installed.
func Need(t testing.TB, programs ...string) {
	t.Helper()
	prereq.Need(t, "kamailio sip-tester", programs...)
}

// Events records, with arrival times, the marker lines a Kamailio's script
// logs ("FANTEST <METHOD> node=<name>"), and lets a test wait on counts.
type Events struct {
	mu      sync.Mutex
	changed chan struct{}
	at      map[string][]time.Time // key "INVITE a"
	log     strings.Builder
	proc    *peer.Proc // nil for Events not made by Start
}

func NewEvents() *Events { return &Events{changed: make(chan struct{}), at: map[string][]time.Time{}} }

func (e *Events) consume(r io.Reader) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		now := time.Now()
		e.mu.Lock()
		if e.log.Len() < 1<<20 {
			e.log.WriteString(line + "\n")
		}
		if _, rest, ok := strings.Cut(line, "FANTEST "); ok {
			if method, node, ok := strings.Cut(strings.TrimSpace(rest), " node="); ok {
				k := method + " " + node
				e.at[k] = append(e.at[k], now)
				close(e.changed)
				e.changed = make(chan struct{})
			}
		}
		e.mu.Unlock()
	}
}

func (e *Events) Count(key string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.at[key])
}

func (e *Events) Times(key string) []time.Time {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]time.Time(nil), e.at[key]...)
}

// WaitFor waits until cond holds over the counts, or fails after d.
func (e *Events) WaitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.After(d)
	for {
		e.mu.Lock()
		ch := e.changed
		e.mu.Unlock()
		if cond() {
			return
		}
		select {
		case <-ch:
		case <-deadline:
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
	}
}

func (e *Events) String() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.log.String()
}

// Start runs one Kamailio in its own process group (it forks children;
// package peer) and kills that whole group when the test ends.
func Start(t testing.TB, name, cfg string) *Events {
	t.Helper()
	dir := t.TempDir()
	path := filepath.Join(dir, name+".cfg")
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	ev := NewEvents()
	pr, pw := io.Pipe()
	p, err := peer.Start(t, pw, "kamailio", "-f", path, "-DD", "-E", "-Y", dir, "-P", filepath.Join(dir, "pid"), "-m", "32", "-M", "4")
	if err != nil {
		t.Fatalf("kamailio %s: %v", name, err)
	}
	ev.proc = p
	done := make(chan struct{})
	go func() { ev.consume(pr); close(done) }()
	go func() { <-p.Done(); pw.Close() }()
	// Registered after peer's own cleanup, so it runs first: the group is
	// stopped, then the marker lines are all read.
	t.Cleanup(func() {
		p.Stop()
		<-done
	})
	return ev
}

// Signal sends sig to the Kamailio's process group (peer.Proc.Signal:
// SIGSTOP freezes it, and returns once it is frozen).
func (e *Events) Signal(t testing.TB, sig syscall.Signal) { e.proc.Signal(t, sig) }

// SIPpServer runs SIPp as a server with scenario (XML) on a free loopback
// UDP port, and returns the port once SIPp listens on it.
func SIPpServer(t testing.TB, scenario string) int {
	t.Helper()
	port := porttest.Port(t)
	dir := t.TempDir()
	sf := filepath.Join(dir, "scenario.xml")
	if err := os.WriteFile(sf, []byte(scenario), 0o644); err != nil {
		t.Fatal(err)
	}
	p, err := peer.Start(t, nil, "sipp", "-sf", sf, "-i", "127.0.0.1", "-p", fmt.Sprint(port), "-nostdin", "-trace_err",
		"-error_file", filepath.Join(dir, "err.log"), "-bind_local")
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Appendf(nil, "0100007F:%04X", port)
	waittest.Until(t, 10*time.Second, fmt.Sprintf("sipp listening on %d", port), func() bool {
		if p.Exited() {
			t.Fatalf("sipp exited: %s", p.Output())
		}
		b, _ := os.ReadFile("/proc/net/udp")
		return bytes.Contains(b, want)
	})
	return port
}

// SIPp places n calls through the proxy with SIPp's built-in uac scenario.
// It reports failures as an error, never t.Fatal, because tests also run it
// from a goroutine.
func SIPp(ctx context.Context, t testing.TB, proxyPort, n, rate int) error {
	u, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	port := u.LocalAddr().(*net.UDPAddr).Port
	u.Close()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "sipp", "-sn", "uac", "-s", "fan", "-nostdin",
		"-i", "127.0.0.1", "-p", fmt.Sprint(port), "-m", fmt.Sprint(n), "-r", fmt.Sprint(rate),
		"-timeout", "20s", "-timeout_error", "-trace_err", "-error_file", filepath.Join(t.TempDir(), "err.log"),
		fmt.Sprintf("127.0.0.1:%d", proxyPort))
	cmd.Dir = t.TempDir()
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("sipp -m %d: %w\n%s", n, err, lastLines(string(out), 30))
	}
	return nil
}

func FreeUDPPort(t testing.TB) int {
	t.Helper()
	u, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	return u.LocalAddr().(*net.UDPAddr).Port
}

func lastLines(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
