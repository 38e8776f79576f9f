package app

import (
	"log/slog"
	"testing"

	"github.com/fanpbx/fan/pkg/platform/daemon"
	"github.com/fanpbx/fan/pkg/platform/daemon/logkeystest"
)

// The prober service's logger carries its own node under daemon.SelfKey, so a
// line about another node (under "node") carries no key twice.
func TestLogKeysDistinct(t *testing.T) {
	logkeystest.Check(t, "prober", func(log *slog.Logger) *slog.Logger {
		cfg := Config{Common: daemon.Common{Cluster: "lab", Node: "n1"}}
		s := New(cfg, log, "test")
		return s.log
	})
}
