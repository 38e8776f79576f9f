package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/platform/config/configtest"
)

// TestMain runs main itself when a test execs this binary with
// FAN_NATS_MAIN set: the tests below run fan-nats as its unit does.
func TestMain(m *testing.M) {
	if os.Getenv("FAN_NATS_MAIN") == "1" {
		os.Args = append([]string{"fan-nats"}, strings.Fields(os.Getenv("FAN_NATS_ARGS"))...)
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func fanNATS(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "FAN_NATS_MAIN=1", "FAN_NATS_ARGS="+strings.Join(args, " "))
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		code = exit.ExitCode()
	case err != nil:
		t.Fatal(err)
	}
	return code, o.String(), e.String()
}

// fan-nats -check-config, as the unit's ExecStartPre runs it: a good
// nats-server configuration passes; a broken one is refused with every
// error on its line, and nothing is started.
func TestCheckConfig(t *testing.T) {
	dir := t.TempDir()
	n := time.Now()
	cert, key := configtest.WriteCert(t, dir, "server", n.Add(-time.Hour), n.Add(400*24*time.Hour))
	_, otherKey := configtest.WriteCert(t, dir, "other", n.Add(-time.Hour), n.Add(400*24*time.Hour))
	serverConf := func(name, key, extra string) string {
		return configtest.WriteFile(t, dir, name, fmt.Appendf(nil, `listen: "0.0.0.0:4222"
tls {
  cert_file: %q
  key_file: %q
  ca_file: %q
  verify: true
}
authorization { token: "0123456789abcdef" }
%s`, cert, key, cert, extra))
	}
	good := serverConf("good.conf", key, "")
	broken := serverConf("broken.conf", otherKey, "jetstream {\n  max_mem: lots\n}\nno_such_field: 1\n")
	store := filepath.Join(dir, "store")
	natsYAML := func(name, server string) string {
		return configtest.WriteFile(t, dir, name, fmt.Appendf(nil, "server_name: nats-1\nlisten: 0.0.0.0:4222\nstore_dir: %s\nserver_config: %s\n", store, server))
	}

	code, out, errOut := fanNATS(t, "-check-config", natsYAML("good.yaml", good))
	if code != 0 || !strings.Contains(out, "fan-nats: configuration "+filepath.Join(dir, "good.yaml")+" is valid") {
		t.Fatalf("good: exit %d, stdout %q, stderr %q", code, out, errOut)
	}

	path := natsYAML("broken.yaml", broken)
	code, out, errOut = fanNATS(t, "-check-config", path, "-cluster-name", "fan")
	lines := strings.Split(strings.TrimSpace(errOut), "\n")
	want := []string{
		path + ": cluster.listen: required in a cluster", // -cluster-name made it a cluster member
		broken + ":4: tls.key_file: " + otherKey + " is not the key of the certificate in " + cert + " (tls.cert_file)",
		broken + ":10:3: max_mem_store",
		broken + `:12:1: unknown field "no_such_field"`,
		"fan-nats: configuration " + path + " refused: 4 errors",
	}
	if code != 2 || out != "" || len(lines) != len(want) {
		t.Fatalf("broken: exit %d, stdout %q, stderr:\n%s", code, out, errOut)
	}
	for i := range want {
		if !strings.HasPrefix(lines[i], want[i]) {
			t.Errorf("line %d:\n got %s\nwant %s...", i+1, lines[i], want[i])
		}
	}
	if _, err := os.Stat(store); err == nil {
		t.Error("-check-config made the store")
	}
}
