package netlab

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Proc is a long-running process started in a host's namespace.
type Proc struct {
	Host string
	Name string
	// LogPath holds the process's stdout and stderr; it lives in the lab's temp dir, so
	// read it (Tail) before Close.
	LogPath string

	cmd         *exec.Cmd
	stopTimeout time.Duration
	done        chan struct{}
	waitErr     error
	stopOnce    sync.Once
	stopErr     error
}

var procNameRE = regexp.MustCompile(`[^A-Za-z0-9._-]+`)

// Start runs argv in host's namespace via `ip netns exec` (which execs, so Pid is the
// program's pid) in a new process group, so Stop and Close reach its children too. env
// is appended to the caller's environment. Output goes to LogPath.
func (l *Lab) Start(host, name string, argv []string, env []string) (*Proc, error) {
	h, err := l.host(host)
	if err != nil {
		return nil, err
	}
	if len(argv) == 0 {
		return nil, fmt.Errorf("netlab: %s: start %s on %s: empty argv", l.prefix, name, host)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil, fmt.Errorf("netlab: %s: start %s on %s: lab closed", l.prefix, name, host)
	}
	logPath := filepath.Join(l.dir, fmt.Sprintf("%s-%s-%d.log", host, procNameRE.ReplaceAllString(name, "_"), len(l.procs)))
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("%s: start %s on %s: %w", l.prefix, name, host, err)
	}
	cmd := exec.Command("ip", append([]string{"netns", "exec", h.NS}, argv...)...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Setpgid: true,
		// If the owner dies without Close the leader goes with it; its descendants and
		// the namespaces are left for Sweep.
		Pdeathsig: syscall.SIGKILL,
	}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("%s: start %s on %s: %w", l.prefix, name, host, err)
	}
	p := &Proc{Host: host, Name: name, LogPath: logPath, cmd: cmd, stopTimeout: l.stopTimeout, done: make(chan struct{})}
	go func() {
		p.waitErr = cmd.Wait()
		logf.Close()
		close(p.done)
	}()
	l.procs = append(l.procs, p)
	l.log.Debug("netlab: started", "host", host, "name", name, "pid", cmd.Process.Pid, "log", logPath)
	return p, nil
}

// Pid is the process id (also its process group id).
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Done is closed when the process has exited and been reaped.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Wait waits for the process to exit and returns its exit error.
func (p *Proc) Wait() error {
	<-p.done
	return p.waitErr
}

// Exited reports whether the process has exited.
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Stop sends SIGTERM to the process group, waits up to the lab's StopTimeout, then sends
// SIGKILL. It returns nil once the process is gone, whatever its exit status (see Wait).
func (p *Proc) Stop() error { return p.stop(p.stopTimeout) }

// Kill sends SIGKILL to the process group and waits for the process to exit.
func (p *Proc) Kill() error { return p.stop(0) }

func (p *Proc) stop(grace time.Duration) error {
	p.stopOnce.Do(func() {
		pgid := p.Pid()
		if grace > 0 && !p.Exited() {
			_ = syscall.Kill(-pgid, syscall.SIGTERM)
			select {
			case <-p.done:
			case <-time.After(grace):
			}
		}
		// Even after the leader is gone, group members it forked may remain.
		if err := syscall.Kill(-pgid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
			p.stopErr = fmt.Errorf("kill process group %d (%s on %s): %w", pgid, p.Name, p.Host, err)
		}
		deadline := time.After(5 * time.Second)
		select {
		case <-p.done:
		case <-deadline:
			p.stopErr = errors.Join(p.stopErr, fmt.Errorf("netlab: %s on %s (pid %d) did not exit after SIGKILL", p.Name, p.Host, pgid))
			return
		}
		// SIGKILL is delivered asynchronously; callers rely on the whole group being gone
		// when Stop returns (e.g. a port being free again).
		for {
			left := groupMembers(pgid)
			if len(left) == 0 {
				return
			}
			select {
			case <-deadline:
				p.stopErr = errors.Join(p.stopErr, fmt.Errorf("netlab: %s on %s: process group %d still has %v after SIGKILL", p.Name, p.Host, pgid, left))
				return
			case <-time.After(5 * time.Millisecond):
				_ = syscall.Kill(-pgid, syscall.SIGKILL)
			}
		}
	})
	if p.stopErr == nil {
		<-p.done
	}
	return p.stopErr
}

// groupMembers lists the live (non-zombie) processes in process group pgid. Zombies are
// left out because an init that never reaps would keep them forever.
func groupMembers(pgid int) []int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		// After the command name: state, ppid, pgrp.
		f := strings.Fields(s[i+1:])
		if len(f) < 3 || f[0] == "Z" || f[0] == "X" {
			continue
		}
		if g, err := strconv.Atoi(f[2]); err == nil && g == pgid {
			out = append(out, pid)
		}
	}
	return out
}

// Tail returns up to the last n bytes of the process's log, for failure reports.
func (p *Proc) Tail(n int64) string {
	f, err := os.Open(p.LogPath)
	if err != nil {
		return fmt.Sprintf("<%v>", err)
	}
	defer f.Close()
	if st, err := f.Stat(); err == nil && st.Size() > n {
		_, _ = f.Seek(-n, io.SeekEnd)
	}
	b, _ := io.ReadAll(f)
	return string(b)
}

// Exec runs a short command in host's namespace and returns its combined output; the
// error includes the output.
func (l *Lab) Exec(ctx context.Context, host string, argv ...string) ([]byte, error) {
	h, err := l.host(host)
	if err != nil {
		return nil, err
	}
	if len(argv) == 0 {
		return nil, fmt.Errorf("netlab: %s: exec on %s: empty argv", l.prefix, host)
	}
	cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", h.NS}, argv...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("%s: exec on %s %q: %w: %s", l.prefix, host, strings.Join(argv, " "), err, strings.TrimSpace(string(out)))
	}
	return out, nil
}
