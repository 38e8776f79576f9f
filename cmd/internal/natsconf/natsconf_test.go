package natsconf

import (
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/fanpbx/fan/pkg/platform/natsserver"
)

func TestFlagsOverrideOnlyWhatTheyName(t *testing.T) {
	path := filepath.Join(t.TempDir(), "nats.yaml")
	err := os.WriteFile(path, []byte(`store_dir: /srv/nats
listen: 0.0.0.0:4222
server_name: nats-n1
tags: [host:n1]
cluster:
  name: fan
  listen: 0.0.0.0:6222
  routes: [198.51.100.11:6222, 198.51.100.12:6222, 198.51.100.2:6222]
`), 0o644)
	if err != nil {
		t.Fatal(err)
	}
	fromFile := natsserver.Config{StoreDir: "/srv/nats", Listen: "0.0.0.0:4222", ServerName: "nats-n1", Tags: []string{"host:n1"},
		Cluster: natsserver.Cluster{Name: "fan", Listen: "0.0.0.0:6222", Routes: []string{"198.51.100.11:6222", "198.51.100.12:6222", "198.51.100.2:6222"}}}
	for _, tc := range []struct {
		name string
		args []string
		want func(e *natsserver.Config)
	}{
		{"file only", nil, func(*natsserver.Config) {}},
		{"listen and store", []string{"-listen", "127.0.0.1:5222", "-store", "/tmp/x"}, func(e *natsserver.Config) {
			e.Listen, e.StoreDir = "127.0.0.1:5222", "/tmp/x"
		}},
		{"routes replace the list", []string{"-routes", "a:1, b:2"}, func(e *natsserver.Config) { e.Cluster.Routes = []string{"a:1", "b:2"} }},
		{"name and tags", []string{"-name", "nats-x", "-tags", "a,b"}, func(e *natsserver.Config) {
			e.ServerName, e.Tags = "nats-x", []string{"a", "b"}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Parse(append([]string{"-config", path}, tc.args...), io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			want := fromFile
			want.Cluster.Routes = append([]string(nil), fromFile.Cluster.Routes...)
			tc.want(&want)
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("got %+v\nwant %+v", got, want)
			}
		})
	}
}

func TestFlagsAloneAndDefaults(t *testing.T) {
	got, err := Parse(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if got.Listen != DefaultListen || got.StoreDir != DefaultStore || got.ServerName != DefaultName || got.Cluster.Name != "" {
		t.Fatalf("defaults: %+v", got)
	}
	got, err = Parse([]string{"-name", "nats-ctl", "-cluster-name", "fan", "-cluster-listen", "127.0.0.1:6222", "-routes", "127.0.0.1:6222,127.0.0.1:6223"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if got.Cluster.Name != "fan" || len(got.Cluster.Routes) != 2 {
		t.Fatalf("cluster flags: %+v", got)
	}
}

func TestRefusals(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bad.yaml")
	os.WriteFile(path, []byte("store_dir: /x\nroutez: [a:1]\n"), 0o644)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-config", path}, "routez"},
		{[]string{"-routes", "a:1"}, "cluster.name"},
		{[]string{"-cluster-name", "fan"}, "cluster.listen"},
		{[]string{"-cluster-name", "fan", "-cluster-listen", "x:1", "-routes", "nohost"}, "cluster.routes[0]"},
	} {
		_, err := Parse(tc.args, io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: got %v, want an error naming %s", tc.args, err, tc.want)
		}
	}
	if _, err := Parse([]string{"-bogus"}, io.Discard); err != ErrUsage {
		t.Errorf("unknown flag: %v", err)
	}
}

// -check-config takes the file as -config or as the one path after it,
// wherever the flags are; a leftover argument is a usage error naming it.
func TestCheckConfigArguments(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "nats.yaml")
	if err := os.WriteFile(path, []byte("store_dir: "+dir+"\nlisten: 127.0.0.1:4222\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"-check-config", path},
		{"-check-config", path, "-name", "n1"},
		{"-name", "n1", "-check-config", path},
		{path, "-check-config"},
		{"-config", path, "-check-config"},
	} {
		s, _, err := Load(args, io.Discard)
		if err != nil || !s.Check || s.ConfigPath != path || s.Server.StoreDir != dir {
			t.Errorf("%q: %+v, %v", args, s, err)
		}
	}
	for _, args := range [][]string{
		{"-check-config", path, "stray"},
		{"-config", path, "-check-config", "other.yaml"},
		{path},
	} {
		var stderr strings.Builder
		if _, _, err := Load(args, &stderr); err != ErrUsage || !strings.Contains(stderr.String(), "unexpected argument") {
			t.Errorf("%q: %v, %q", args, err, stderr.String())
		}
	}
}

// Every error of the settings is reported: on its line of the file, or on
// the flag that set the key, and those of the nats-server configuration
// file on its lines.
func TestLoadReportsEveryError(t *testing.T) {
	dir := t.TempDir()
	serverConf := filepath.Join(dir, "nats-server.conf")
	if err := os.WriteFile(serverConf, []byte("listen: 0.0.0.0:4222\nlisten_typo: 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "nats.yaml")
	if err := os.WriteFile(path, []byte("store_dir: "+dir+"\nlistn: 127.0.0.1:4222\nserver_config: "+serverConf+"\ncluster:\n  name: fan\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, _, err := Load([]string{"-check-config", path, "-routes", "nohost"}, io.Discard)
	want := strings.Join([]string{
		path + ":2: listn: unknown key; did you mean listen?",
		path + ":4: cluster.listen: required in a cluster",
		`-routes: cluster.routes[0]: route "nats-route://nohost": want host:port`,
		serverConf + `:2:1: unknown field "listen_typo"`,
	}, "\n")
	if err == nil || err.Error() != want {
		t.Fatalf("got\n%v\nwant\n%s", err, want)
	}
}
