package daemon

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
)

// Reloader is implemented by a Service that can apply a changed
// configuration file without a restart. The daemon calls Reload on SIGHUP
// (systemctl reload), one call at a time, possibly before or while Run's
// body runs. Reload re-reads the file it was built from and applies the keys
// that are safe to change live, all of them or none.
//
// When the new file also changes keys that only a restart applies, Reload
// applies the safe part and returns a *RestartRequired naming the others
// (errors.As finds it in a joined error). Any other error means nothing was
// applied and the running configuration stands.
//
// A Service that does not implement Reloader keeps running unchanged on
// SIGHUP; the daemon checks the new file and logs that a restart is needed.
type Reloader interface {
	Reload(ctx context.Context) error
}

// RestartRequired names configuration keys whose change needs a restart.
type RestartRequired struct {
	Keys []string
}

func (e *RestartRequired) Error() string {
	return "restart needed to apply: " + strings.Join(e.Keys, ", ")
}

// CommonRestartKeys lists the common keys that differ between two
// configurations. All of them need a restart: they name the instance on the
// bus, the connection itself and the listening socket.
func CommonRestartKeys(old, new Common) []string {
	var keys []string
	if old.Cluster != new.Cluster {
		keys = append(keys, "cluster")
	}
	if old.Node != new.Node {
		keys = append(keys, "node")
	}
	if !reflect.DeepEqual(old.Bus, new.Bus) {
		keys = append(keys, "bus")
	}
	if old.HTTPListen != new.HTTPListen {
		keys = append(keys, "http_listen")
	}
	if old.ShutdownTimeout != new.ShutdownTimeout {
		keys = append(keys, "shutdown_timeout")
	}
	return keys
}

// reload handles one SIGHUP. svc is the running service; build re-checks the
// file for services that cannot reload, so the operator learns now, not at
// the next restart, whether the new file would even start.
func (s *supervisor) reload(ctx context.Context, svc Service, build Builder, opts Options) {
	r, ok := svc.(Reloader)
	if !ok {
		s.reloads.WithLabelValues("unsupported").Inc()
		if _, err := build(opts); err != nil {
			s.log.Error("SIGHUP: this service cannot reload and the configuration file is invalid: a restart would fail; running configuration unchanged",
				"config", opts.ConfigPath, "err", err)
			return
		}
		s.log.Warn("SIGHUP: this service cannot reload; restart needed to apply the configuration file; running configuration unchanged",
			"config", opts.ConfigPath, "restart_needed", true)
		return
	}
	s.send(NotifyReloading)
	defer s.send(NotifyReady)
	err := r.Reload(ctx)
	var rr *RestartRequired
	switch {
	case err == nil:
		s.reloads.WithLabelValues("applied").Inc()
		s.log.Info("SIGHUP: configuration reloaded", "config", opts.ConfigPath)
	case errors.As(err, &rr):
		s.reloads.WithLabelValues("restart_needed").Inc()
		s.log.Warn("SIGHUP: safe keys reloaded; restart needed for the others", "config", opts.ConfigPath,
			"restart_needed", true, "restart_keys", rr.Keys)
	default:
		s.reloads.WithLabelValues("failed").Inc()
		s.log.Error("SIGHUP: reload failed; running configuration unchanged", "config", opts.ConfigPath, "err", fmt.Errorf("reload: %w", err))
	}
}
