// Package peer runs the real programs a test talks to on loopback
// (Kamailio, BIND, SIPp): each in its own process group, so that a
// program's children are reached too, its output kept for the test's log,
// frozen and thawed on demand (SIGSTOP: the kernel still accepts TCP
// connections, nothing answers), and killed with its whole group when the
// test ends, pass or fail. The harnesses kamailiotest and bindtest start
// their programs through it; netlab runs programs inside namespaces.
package peer

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/platform/poll"
)

// maxOutput bounds the output kept per program.
const maxOutput = 1 << 20

// Proc is a running peer program.
type Proc struct {
	Name string

	cmd      *exec.Cmd
	out      output
	done     chan struct{}
	stopOnce sync.Once
}

// output keeps what a program wrote, up to maxOutput, safely for the
// goroutines exec copies with.
type output struct {
	mu sync.Mutex
	b  bytes.Buffer
	w  io.Writer
}

func (o *output) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.b.Len() < maxOutput {
		o.b.Write(p[:min(len(p), maxOutput-o.b.Len())])
	}
	if o.w != nil {
		// A reader that went away must not stop the program.
		if _, err := o.w.Write(p); err != nil {
			o.w = nil
		}
	}
	return len(p), nil
}

// Start runs argv in its own process group; what it writes is kept (Output)
// and, when also is not nil, written to also as well. The program is
// stopped when the test ends (Stop). An error means it did not start.
func Start(t testing.TB, also io.Writer, argv ...string) (*Proc, error) {
	t.Helper()
	if len(argv) == 0 {
		return nil, errors.New("peer: empty argv")
	}
	p := &Proc{Name: filepath.Base(argv[0]), done: make(chan struct{})}
	p.out.w = also
	p.cmd = exec.Command(argv[0], argv[1:]...)
	p.cmd.Stdout, p.cmd.Stderr = &p.out, &p.out
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", p.Name, err)
	}
	go func() {
		_ = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.Stop()
		if t.Failed() {
			t.Logf("%s (pid %d) output:\n%s", p.Name, p.cmd.Process.Pid, lastLines(p.Output(), 60))
		}
	})
	return p, nil
}

// MustStart is Start that fails the test when the program does not start.
func MustStart(t testing.TB, also io.Writer, argv ...string) *Proc {
	t.Helper()
	p, err := Start(t, also, argv...)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// Output is what the program has written so far (its first MiB).
func (p *Proc) Output() string {
	p.out.mu.Lock()
	defer p.out.mu.Unlock()
	return p.out.b.String()
}

// Done is closed once the program has exited and its output is read.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Exited reports whether the program has exited.
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Stop ends the whole group: SIGCONT (a frozen program cannot act on
// SIGTERM), SIGTERM, up to 5 s, then SIGKILL. It waits for the program to
// exit; calling it again does nothing.
func (p *Proc) Stop() {
	p.stopOnce.Do(func() {
		pgid := p.cmd.Process.Pid
		_ = syscall.Kill(-pgid, syscall.SIGCONT)
		_ = syscall.Kill(-pgid, syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(5 * time.Second):
		}
		// Children may outlive the leader briefly; none is left.
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		<-p.done
	})
}

// Signal sends sig to the whole group. For SIGSTOP and SIGCONT it returns
// only once every thread of the group is stopped (or running again):
// kill returns before a stop takes effect, and on a busy machine a server
// could otherwise still answer one more request.
func (p *Proc) Signal(t testing.TB, sig syscall.Signal) {
	t.Helper()
	pgid := p.cmd.Process.Pid
	if err := syscall.Kill(-pgid, sig); err != nil {
		t.Fatal(err)
	}
	if sig != syscall.SIGSTOP && sig != syscall.SIGCONT {
		return
	}
	want := sig == syscall.SIGSTOP
	// Finer than poll.Until's pace: a stop takes effect within a few
	// milliseconds, and tests freeze and thaw peers many times.
	if err := poll.Every(context.Background(), 5*time.Millisecond, 5*time.Second,
		fmt.Sprintf("%s: process group %d stopped=%v", p.Name, pgid, want), func() error {
			if groupStopped(pgid) != want {
				return errors.New("some thread not in that state yet")
			}
			return nil
		}); err != nil {
		t.Fatalf("%v", err)
	}
}

// groupStopped reports whether every thread of every process in the group
// is stopped (or already dead: a zombie answers nothing either).
func groupStopped(pgid int) bool {
	procs, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, statPath := range procs {
		f := statFields(statPath)
		// After the command name: state, ppid, pgrp.
		if len(f) < 3 || f[2] != strconv.Itoa(pgid) {
			continue
		}
		tasks, _ := filepath.Glob(filepath.Join(filepath.Dir(statPath), "task", "*", "stat"))
		for _, tp := range tasks {
			tf := statFields(tp)
			if len(tf) == 0 || !strings.Contains("TtZX", tf[0]) {
				return false
			}
		}
	}
	return true
}

// statFields are the fields of a /proc stat file after the command name
// (which may hold spaces and parentheses).
func statFields(path string) []string {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 > len(b) {
		return nil
	}
	return strings.Fields(string(b[i+2:]))
}

func lastLines(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
