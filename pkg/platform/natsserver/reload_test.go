package natsserver_test

import (
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/platform/natsserver"
	"github.com/nats-io/nats.go"
)

// TestReloadAcceptsANewUser: a user added to the server's
// configuration file can connect once the server reloads, without the
// connections it had being dropped; a change that needs a restart is
// refused and the server keeps running as it was.
func TestReloadAcceptsANewUser(t *testing.T) {
	dir := t.TempDir()
	conf := filepath.Join(dir, "server.conf")
	users := func(names ...string) string {
		var b strings.Builder
		b.WriteString("authorization { users: [\n")
		for _, n := range names {
			b.WriteString("  { user: \"" + n + "\", password: \"pw-" + n + "\" }\n")
		}
		b.WriteString("] }\n")
		return b.String()
	}
	if err := os.WriteFile(conf, []byte(users("alice")), 0o600); err != nil {
		t.Fatal(err)
	}
	e := natsserver.Config{StoreDir: filepath.Join(dir, "store"), Listen: "127.0.0.1:0", ServerName: "reload", ServerConfig: conf}
	srv, err := natsserver.Start(e, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	url := srv.ClientURL()
	alice, err := nats.Connect(url, nats.UserInfo("alice", "pw-alice"))
	if err != nil {
		t.Fatal(err)
	}
	defer alice.Close()
	if nc, err := nats.Connect(url, nats.UserInfo("bob", "pw-bob"), nats.Timeout(time.Second)); err == nil {
		nc.Close()
		t.Fatal("bob connected before being added")
	}

	if err := os.WriteFile(conf, []byte(users("alice", "bob")), 0o600); err != nil {
		t.Fatal(err)
	}
	// The port the server chose stays: a reload may not move a listener.
	e.Listen = strings.TrimPrefix(url, "nats://")
	if err := natsserver.Reload(srv, e); err != nil {
		t.Fatal(err)
	}
	bob, err := nats.Connect(url, nats.UserInfo("bob", "pw-bob"))
	if err != nil {
		t.Fatalf("bob after the reload: %v", err)
	}
	bob.Close()
	if !alice.IsConnected() {
		t.Error("the reload dropped alice's connection")
	}

	e.ServerName = "renamed"
	if err := natsserver.Reload(srv, e); err == nil {
		t.Error("a new server name was applied by a reload")
	}
	if nc, err := nats.Connect(url, nats.UserInfo("bob", "pw-bob")); err != nil {
		t.Errorf("after a refused reload the server no longer serves: %v", err)
	} else {
		nc.Close()
	}
}
