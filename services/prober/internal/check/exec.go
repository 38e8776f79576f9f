package check

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// Exec runs a command (such as `asterisk -rx "core show uptime"`); exit
// status 0 is healthy. At the deadline the whole process group is killed: a
// hung `asterisk -rx` must not pile up behind the next run.
type Exec struct{ argv []string }

func NewExec(argv []string) *Exec { return &Exec{argv: argv} }

func (e *Exec) Kind() string   { return "exec" }
func (e *Exec) Target() string { return strings.Join(e.argv, " ") }

func (e *Exec) Run(ctx context.Context) Result {
	start := time.Now()
	cmd := exec.CommandContext(ctx, e.argv[0], e.argv[1:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	// Children that keep stdout open must not hold Wait past the deadline.
	cmd.WaitDelay = 50 * time.Millisecond
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if err == nil {
		return finish(start, nil)
	}
	text := strings.TrimSpace(out.String())
	if len(text) > 200 {
		text = text[:200] + "…"
	}
	var ee *exec.ExitError
	switch {
	case ctx.Err() != nil:
		err = fmt.Errorf("exec %s: killed at the deadline: %w", e.argv[0], ctx.Err())
	case errors.As(err, &ee) && ee.Exited():
		err = fmt.Errorf("exec %s: exit status %d: %q: %w", e.argv[0], ee.ExitCode(), text, ErrUnhealthy)
	default:
		err = fmt.Errorf("exec %s: %w", e.argv[0], err)
	}
	r := finish(start, err)
	if ee != nil && ee.Exited() {
		r.Figures = map[string]float64{"exit_code": float64(ee.ExitCode())}
	}
	return r
}

func (e *Exec) Close() error { return nil }
