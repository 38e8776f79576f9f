package dispatchexec

import (
	"time"

	"github.com/fanpbx/fan/pkg/platform/config"
)

// maxNodes bounds dispatcher.nodes (README "Configuration").
const maxNodes = 256

// validateBounds refuses out-of-range values of the dispatcher executor's
// keys before defaults are derived from them.
func (d *DispatcherConfig) validateBounds() error {
	return config.Join(
		config.DurationOrZero("dispatcher.timeout", d.Timeout, 100*time.Millisecond, time.Minute),
		config.DurationOrZero("dispatcher.reload_retry", d.ReloadRetry, 10*time.Millisecond, 10*time.Second),
		config.DurationOrZero("dispatcher.resync", d.Resync.D(), time.Second, time.Hour),
		config.IntIn("dispatcher.set", d.Set, 0, 1<<31-1),
		config.CountIn("dispatcher.nodes", len(d.Nodes), 0, maxNodes),
	)
}
