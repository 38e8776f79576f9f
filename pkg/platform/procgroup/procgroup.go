// Package procgroup starts the programs an operator configures fan to run (the
// prober's exec checks, the arbiter's notify hooks) so that one that hangs
// can be killed whole, children included.
package procgroup

import (
	"context"
	"os/exec"
	"syscall"
	"time"
)

// Command returns argv as a command that runs in a process group of its
// own. When ctx ends before the command does, the whole group gets
// SIGKILL: a shell script's children die with it instead of living on
// unseen. waitDelay bounds how long Wait then waits for output pipes that
// a child which left the group may still hold open.
func Command(ctx context.Context, argv []string, waitDelay time.Duration) *exec.Cmd {
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error {
		// The negative pid is the group the command leads.
		return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
	cmd.WaitDelay = waitDelay
	return cmd
}
