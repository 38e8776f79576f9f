package notify

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/fanpbx/fan/pkg/platform/procgroup"
)

// commandPath is the whole PATH a hook's command gets: it inherits nothing
// else of the arbiter's environment (bus credentials' paths, systemd's
// variables), only this and the event's FAN_* variables.
const commandPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// outputKept bounds what is kept of a command's output for the log.
const outputKept = 2048

// pipeGrace is how long Wait waits for a command's output pipes after the
// command ended or was killed: a background child that inherited them
// (and left the process group) must not hold the hook's worker.
const pipeGrace = time.Second

// Results a run ends with (fan_notify_runs_total's result label).
const (
	resultOK      = "ok"
	resultFailed  = "failed"  // non-zero exit, or a webhook's receiver refused or failed every try
	resultTimeout = "timeout" // killed at its timeout (a command), or every try timed out (a webhook)
	resultError   = "error"   // could not start, or the run was stopped with the service
)

// errTimedOut marks a run killed at its timeout.
var errTimedOut = errors.New("timed out")

// runCommand runs argv with the event on stdin and in the environment, in
// a process group of its own, and kills the whole group (SIGKILL) when the
// timeout passes or ctx ends: a script's children die with it.
func runCommand(ctx context.Context, argv []string, ev Event, timeout time.Duration) (string, error) {
	ctx, cancel := context.WithTimeoutCause(ctx, timeout, errTimedOut)
	defer cancel()
	cmd := procgroup.Command(ctx, argv, pipeGrace)
	cmd.Dir = "/"
	cmd.Env = append([]string{commandPath}, ev.Env()...)
	cmd.Stdin = bytes.NewReader(ev.JSON())
	out := &capped{max: outputKept}
	cmd.Stdout, cmd.Stderr = out, out
	err := cmd.Run()
	if err == nil {
		return out.String(), nil
	}
	if errors.Is(context.Cause(ctx), errTimedOut) {
		return out.String(), fmt.Errorf("%s killed after %v: %w", argv[0], timeout, errTimedOut)
	}
	return out.String(), fmt.Errorf("%s: %w", argv[0], err)
}

// capped keeps the first max bytes written to it.
type capped struct {
	buf bytes.Buffer
	max int
}

func (c *capped) Write(p []byte) (int, error) {
	if room := c.max - c.buf.Len(); room > 0 {
		c.buf.Write(p[:min(room, len(p))])
	}
	return len(p), nil
}

func (c *capped) String() string { return strings.TrimSpace(c.buf.String()) }
