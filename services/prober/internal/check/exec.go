package check

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"time"

	"github.com/fanpbx/fan/pkg/platform/procgroup"
)

// Exec runs a command (such as `asterisk -rx "core show uptime"`); exit
// status 0 is healthy. At the deadline the whole process group is killed: a
// hung `asterisk -rx` must not pile up behind the next run.
type Exec struct {
	argv []string
	// shown is argv with its secret arguments masked (RedactArgs).
	shown string
	// red removes the secret values from what the program printed.
	red *Redactor
}

// NewExec makes the check; secretArgs are the check's secret_args.
func NewExec(argv []string, secretArgs []string) *Exec {
	shown, secrets := RedactArgs(argv, secretArgs)
	return &Exec{argv: argv, shown: strings.Join(shown, " "), red: NewRedactor(secrets)}
}

func (e *Exec) Kind() string   { return "exec" }
func (e *Exec) Target() string { return e.shown }

func (e *Exec) Run(ctx context.Context) Result {
	start := time.Now()
	// Children that keep stdout open must not hold Wait past the deadline.
	cmd := procgroup.Command(ctx, e.argv, 50*time.Millisecond)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if err == nil {
		return finish(start, nil)
	}
	text := e.red.String(strings.TrimSpace(out.String()))
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
		err = e.red.Error(fmt.Errorf("exec %s: %w", e.argv[0], err))
	}
	r := finish(start, err)
	if ee != nil && ee.Exited() {
		r.Figures = map[string]float64{"exit_code": float64(ee.ExitCode())}
	}
	return r
}

func (e *Exec) Close() error { return nil }
