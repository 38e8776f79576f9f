package app

import (
	"testing"

	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/daemon"
	"github.com/fanpbx/fan/pkg/platform/logtest"
)

// The arbiter service's logger carries its own node under daemon.SelfKey, so a
// line about another node (under "node") carries no key twice.
func TestLogKeysDistinct(t *testing.T) {
	var buf logtest.Buffer
	log, err := daemon.NewLogger(&buf, "debug", "json")
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Common: daemon.Common{Cluster: "lab", Node: "n1", Bus: bus.Config{URL: "nats://127.0.0.1:4222"}},
		Groups: []GroupConfig{{Name: "pbx", Addresses: []string{"198.51.100.10/24"}, Nodes: []string{"n1", "n2"}, HealthCheck: "pbx"}}}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	s, err := New(cfg, log.With(daemon.ServiceKey, "arbiter"), "test")
	if err != nil {
		t.Fatal(err)
	}
	s.log.Info("about another node", "node", "n2")
	lines := logtest.CheckJSONLines(t, buf.String())
	if len(lines) != 1 || lines[0][daemon.SelfKey] != "n1" || lines[0]["node"] != "n2" || lines[0][daemon.ServiceKey] != "arbiter" {
		t.Fatalf("want one line of service arbiter, self n1 and node n2: %s", buf.String())
	}
}
