package app

import (
	"testing"

	"github.com/fanpbx/fan/pkg/platform/daemon"
	"github.com/fanpbx/fan/pkg/platform/logtest"
)

// The replicator service's logger carries its own node under daemon.SelfKey, so a
// line about another node (under "node") carries no key twice.
func TestLogKeysDistinct(t *testing.T) {
	var buf logtest.Buffer
	log, err := daemon.NewLogger(&buf, "debug", "json")
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Common: daemon.Common{Cluster: "lab", Node: "n1"}}
	s := New(cfg, log.With(daemon.ServiceKey, "replicator"), "test")
	s.log.Info("about another node", "node", "n2")
	lines := logtest.CheckJSONLines(t, buf.String())
	if len(lines) != 1 || lines[0][daemon.SelfKey] != "n1" || lines[0]["node"] != "n2" || lines[0][daemon.ServiceKey] != "replicator" {
		t.Fatalf("want one line of service replicator, self n1 and node n2: %s", buf.String())
	}
}
