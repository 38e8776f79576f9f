package app

import (
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fanpbx/fan/pkg/platform/daemon"
)

// The interface must exist on the host that checks the file (and starts
// the service): "eth0" copied to a host whose NIC is ens18 is refused by
// -check-config, naming the interfaces the host has, not by the first
// claim at a failover. The state file's directory is checked the same way.
func TestBuildChecksTheHost(t *testing.T) {
	dir := t.TempDir()
	state := filepath.Join(dir, "state.json")
	write := func(body string) string {
		p := filepath.Join(dir, "ipmover.yaml")
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	build := func(path string) error {
		_, err := Build(daemon.Options{ConfigPath: path, Logger: slog.New(slog.DiscardHandler), Version: "test"})
		return err
	}
	head := "cluster: lab\nnode: n1\nbus: {url: \"nats://127.0.0.1:4222\"}\n"
	groups := "groups: [{name: pbx, prefixes: [192.0.2.10/32]}]\n"

	if err := build(write(head + "interface: lo\n" + groups + "state_file: " + state + "\n")); err != nil {
		t.Fatalf("lo, an interface every host has: %v", err)
	}

	path := write(head + "interface: eth-none0\n" + groups + "state_file: " + filepath.Join(dir, "gone", "state.json") + "\n")
	err := build(path)
	lines := strings.Split(err.Error(), "\n")
	if len(lines) != 2 ||
		!strings.HasPrefix(lines[0], path+":4: interface: eth-none0 does not exist on this host (it has: ") ||
		!strings.HasPrefix(lines[1], path+":6: state_file: "+filepath.Join(dir, "gone", "state.json")+": its directory") {
		t.Fatalf("got\n%v", err)
	}
	ifs, _ := net.Interfaces()
	for _, ifc := range ifs {
		if !strings.Contains(lines[0], ifc.Name) {
			t.Errorf("the refusal does not name %s: %s", ifc.Name, lines[0])
		}
	}

	// -release-all releases whatever the host has become: its Build
	// leaves the host alone.
	if _, err := Build(daemon.Options{ConfigPath: path, Logger: slog.New(slog.DiscardHandler), SkipHostChecks: true}); err != nil {
		t.Fatalf("-release-all's Build checked the host: %v", err)
	}

	// Parse (a file read where it does not run, as tests and tools do)
	// leaves the host alone.
	b, _ := os.ReadFile(path)
	if _, err := Parse(path, b, slog.New(slog.DiscardHandler), "test"); err != nil {
		t.Fatalf("Parse checked the host: %v", err)
	}
}
