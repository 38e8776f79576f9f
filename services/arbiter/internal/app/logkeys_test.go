package app

import (
	"log/slog"
	"testing"

	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/daemon"
	"github.com/fanpbx/fan/pkg/platform/daemon/logkeystest"
)

// The arbiter service's logger carries its own node under daemon.SelfKey, so a
// line about another node (under "node") carries no key twice.
func TestLogKeysDistinct(t *testing.T) {
	logkeystest.Check(t, "arbiter", func(log *slog.Logger) *slog.Logger {
		cfg := Config{Common: daemon.Common{Cluster: "lab", Node: "n1", Bus: bus.Config{URL: "nats://127.0.0.1:4222"}},
			Groups: []GroupConfig{{Name: "pbx", Addresses: []string{"198.51.100.10/24"}, Nodes: []string{"n1", "n2"}, HealthCheck: "pbx"}}}
		if err := cfg.Validate(); err != nil {
			t.Fatal(err)
		}
		s, err := New(cfg, log, "test")
		if err != nil {
			t.Fatal(err)
		}
		return s.log
	})
}
