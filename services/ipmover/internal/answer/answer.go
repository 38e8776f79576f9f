// Package answer makes the node's PBX answer on a claimed floating address
// and proves that it does.
//
// Three modes (docs/asterisk22.md, "Binding a floating address"):
// hot, where Asterisk was started with ip_nonlocal_bind=1 and is already
// bound, so the address appearing is enough; reload, an AMI Reload of the
// configured modules (res_pjsip.so on Asterisk 22; chan_sip.so for `sip
// reload` on old Asterisks), which creates a transport that never bound;
// and restart of the systemd unit, the fallback that always works. Then a
// SIP OPTIONS to the floating address from this node must be answered
// before the claim is reported done.
package answer

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"time"

	"github.com/fanpbx/fan/pkg/events"
)

// Reloader reloads one Asterisk module over AMI (*ami.Session). An AMI
// "Response: Error" must come back as an error.
type Reloader interface {
	Reload(ctx context.Context, module string) error
}

// Answerer carries out an answer mode.
type Answerer struct {
	// Reload is nil on a node without AMI configured.
	Reload Reloader
	// Restart is nil on a node without a unit configured.
	Restart *Systemctl
}

// ErrNotConfigured means the node cannot use the requested mode.
var ErrNotConfigured = errors.New("answer mode not configured on this node")

// Answer makes the PBX answer in mode, within ctx.
func (a Answerer) Answer(ctx context.Context, mode events.AnswerMode, modules []string) error {
	switch mode {
	case events.AnswerHot:
		return nil
	case events.AnswerReload:
		if a.Reload == nil {
			return fmt.Errorf("answer reload: %w (no ami)", ErrNotConfigured)
		}
		for _, m := range modules {
			if err := a.Reload.Reload(ctx, m); err != nil {
				return fmt.Errorf("answer reload %s: %w", m, err)
			}
		}
		return nil
	case events.AnswerRestart:
		if a.Restart == nil {
			return fmt.Errorf("answer restart: %w (no unit)", ErrNotConfigured)
		}
		return a.Restart.Restart(ctx)
	}
	return fmt.Errorf("answer mode %q: %w", mode, ErrNotConfigured)
}

// Systemctl restarts a systemd unit with the systemctl command. systemctl
// waits for the restart job to finish (for Type=notify units, until the
// service says it is ready), so its return is a meaningful "started".
type Systemctl struct {
	// Path is the systemctl binary; "systemctl" (found on PATH) when empty.
	Path string
	Unit string
}

// Args is the command line Restart runs.
func (s Systemctl) Args() []string {
	return []string{"restart", "--no-ask-password", "--", s.Unit}
}

// Restart runs `systemctl restart <unit>` and waits for it until ctx ends.
// A non-zero exit, a missing binary or the deadline is an error that
// carries what systemctl printed, so the result event says why.
func (s Systemctl) Restart(ctx context.Context) error {
	path := s.Path
	if path == "" {
		path = "systemctl"
	}
	cmd := exec.CommandContext(ctx, path, s.Args()...)
	// If the deadline kills systemctl, do not wait on pipes held open by
	// anything it may have started.
	cmd.WaitDelay = time.Second
	out, err := cmd.CombinedOutput()
	if err != nil {
		msg := strings.TrimSpace(string(out))
		if ctx.Err() != nil {
			return fmt.Errorf("answer restart %s: %w (systemctl did not finish: %v) %s", s.Unit, ctx.Err(), err, msg)
		}
		return fmt.Errorf("answer restart %s: %w: %s", s.Unit, err, msg)
	}
	return nil
}
