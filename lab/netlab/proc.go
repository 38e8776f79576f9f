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
	// read it (Tail) before Close. A restarted process appends to it.
	LogPath string

	stopTimeout time.Duration
	// restartAfter, when positive, restarts the process that long after it exits on its
	// own (StartService).
	restartAfter time.Duration

	mu       sync.Mutex
	cur      *run // the current (or last) run
	stopping bool // Stop, Kill or the lab's Close: no restart any more
	quit     chan struct{}
	restarts int
	// unsupervised closes when no restart of the process can follow any more.
	unsupervised chan struct{}

	stopOnce sync.Once
	stopErr  error
}

// run is one execution of a Proc's program.
type run struct {
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

var procNameRE = regexp.MustCompile(`[^A-Za-z0-9._-]+`)

// Start runs argv in host's namespace via `ip netns exec` (which execs, so Pid is the
// program's pid) in a new process group, so Stop and Close reach its children too. env
// is appended to the caller's environment. Output goes to LogPath.
func (l *Lab) Start(host, name string, argv []string, env []string) (*Proc, error) {
	return l.start(host, name, argv, env, 0)
}

// StartService is Start for a process a service manager keeps running, as systemd's
// Restart=always does: when it exits without Stop, Kill or Close having asked it to, it
// is started again restartAfter later (the unit's RestartSec) with the same argv and env,
// appending to the same LogPath. Each exit and restart is logged at warning level with
// the host, the name and the exit status, so the lab's output says a service crashed
// and came back.
func (l *Lab) StartService(host, name string, argv []string, env []string, restartAfter time.Duration) (*Proc, error) {
	if restartAfter <= 0 {
		return nil, fmt.Errorf("netlab: %s: start %s on %s: restart delay %v must be positive", l.prefix, name, host, restartAfter)
	}
	return l.start(host, name, argv, env, restartAfter)
}

func (l *Lab) start(host, name string, argv []string, env []string, restartAfter time.Duration) (*Proc, error) {
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
	p := &Proc{Host: host, Name: name, stopTimeout: l.stopTimeout, restartAfter: restartAfter, quit: make(chan struct{}), unsupervised: make(chan struct{}),
		LogPath: filepath.Join(l.dir, fmt.Sprintf("%s-%s-%d.log", host, procNameRE.ReplaceAllString(name, "_"), len(l.procs)))}
	r, err := l.spawn(h, p, argv, env)
	if err != nil {
		return nil, err
	}
	p.cur = r
	go l.supervise(h, p, r, argv, env)
	l.procs = append(l.procs, p)
	l.log.Debug("netlab: started", "host", host, "name", name, "pid", r.cmd.Process.Pid, "log", p.LogPath)
	return p, nil
}

// spawn starts one run of p's program; the run's done closes once it is reaped.
func (l *Lab) spawn(h *Host, p *Proc, argv, env []string) (*run, error) {
	logf, err := os.OpenFile(p.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("%s: start %s on %s: %w", l.prefix, p.Name, p.Host, err)
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
		return nil, fmt.Errorf("%s: start %s on %s: %w", l.prefix, p.Name, p.Host, err)
	}
	r := &run{cmd: cmd, done: make(chan struct{})}
	go func() {
		r.err = cmd.Wait()
		logf.Close()
		close(r.done)
	}()
	return r, nil
}

// supervise restarts p after each run that ends on its own, when p restarts at all.
func (l *Lab) supervise(h *Host, p *Proc, r *run, argv, env []string) {
	defer close(p.unsupervised)
	if p.restartAfter <= 0 {
		return
	}
	for {
		<-r.done
		if p.stopped() {
			return
		}
		l.log.Warn("netlab: process exited; restarting it as Restart=always would", "host", p.Host, "name", p.Name,
			"pid", r.cmd.Process.Pid, "status", exitStatus(r.err), "restart_sec", p.restartAfter)
		select {
		case <-p.quit:
			return
		case <-time.After(p.restartAfter):
		}
		var err error
		if r, err = l.restart(h, p, argv, env); err != nil || r == nil {
			if err != nil {
				l.log.Warn("netlab: restart failed", "host", p.Host, "name", p.Name, "err", err)
			}
			return
		}
		l.log.Warn("netlab: process restarted", "host", p.Host, "name", p.Name, "pid", r.cmd.Process.Pid, "restarts", p.Restarts())
	}
}

// restart starts p's next run unless the lab closed or p was stopped meanwhile (then it
// returns nil, nil).
func (l *Lab) restart(h *Host, p *Proc, argv, env []string) (*run, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	p.mu.Lock()
	defer p.mu.Unlock()
	if l.closed || p.stopping {
		return nil, nil
	}
	r, err := l.spawn(h, p, argv, env)
	if err != nil {
		return nil, err
	}
	p.cur = r
	p.restarts++
	return r, nil
}

// exitStatus renders how a run ended: "exit status 1", "signal: killed".
func exitStatus(err error) string {
	if err == nil {
		return "exit status 0"
	}
	return err.Error()
}

func (p *Proc) current() *run {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cur
}

// disarm calls off every restart of p and returns its current run, the last.
func (p *Proc) disarm() *run {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.stopping {
		p.stopping = true
		close(p.quit)
	}
	return p.cur
}

func (p *Proc) stopped() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stopping
}

// Restarts is how many times the process was restarted after exiting on its own
// (StartService).
func (p *Proc) Restarts() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.restarts
}

// Pid is the process id (also its process group id) of the current run.
func (p *Proc) Pid() int { return p.current().cmd.Process.Pid }

// Done is closed when the current run has exited and been reaped.
func (p *Proc) Done() <-chan struct{} { return p.current().done }

// Wait waits for the current run to exit and returns its exit error.
func (p *Proc) Wait() error {
	r := p.current()
	<-r.done
	return r.err
}

// Exited reports whether the current run has exited (a process that restarts is
// Exited between its exit and its restart).
func (p *Proc) Exited() bool {
	select {
	case <-p.Done():
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
		// No restart after this: the run stopped here is the last.
		r := p.disarm()
		pgid := r.cmd.Process.Pid
		if grace > 0 && !p.Exited() {
			_ = syscall.Kill(-pgid, syscall.SIGTERM)
			select {
			case <-r.done:
			case <-time.After(grace):
			}
		}
		// Even after the leader is gone, group members it forked may remain.
		if err := syscall.Kill(-pgid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
			p.stopErr = fmt.Errorf("kill process group %d (%s on %s): %w", pgid, p.Name, p.Host, err)
		}
		deadline := time.After(5 * time.Second)
		select {
		case <-r.done:
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
		<-p.Done()
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
