// Package logkeystest checks, for any service, that its logger names the
// service's own node apart from the node a line is about: log pipelines
// keep one of two equal keys in a JSON line.
package logkeystest

import (
	"log/slog"
	"testing"

	"github.com/fanpbx/fan/pkg/platform/daemon"
	"github.com/fanpbx/fan/pkg/platform/logtest"
)

// Check hands build daemon's JSON logger, as the service's main makes it
// (with daemon.ServiceKey set to service), takes back the logger the
// service built from it for node n1, logs one line about node n2 through
// it, and fails t unless that line repeats no key and says service, self
// n1 and node n2.
func Check(t *testing.T, service string, build func(log *slog.Logger) *slog.Logger) {
	t.Helper()
	var buf logtest.Buffer
	log, err := daemon.NewLogger(&buf, "debug", "json")
	if err != nil {
		t.Fatal(err)
	}
	build(log.With(daemon.ServiceKey, service)).Info("about another node", "node", "n2")
	lines := logtest.CheckJSONLines(t, buf.String())
	if len(lines) != 1 || lines[0][daemon.SelfKey] != "n1" || lines[0]["node"] != "n2" || lines[0][daemon.ServiceKey] != service {
		t.Fatalf("want one line of service %s, self n1 and node n2: %s", service, buf.String())
	}
}
