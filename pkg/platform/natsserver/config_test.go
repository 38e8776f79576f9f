package natsserver_test

import (
	"strings"
	"testing"

	"github.com/fanpbx/fan/pkg/platform/natsserver"
)

// Each setting out of its bounds is refused, naming its key
// (docs/bounds.md).
func TestValidate(t *testing.T) {
	cases := map[string]struct {
		cfg natsserver.Config
		key string
	}{
		"no store dir":      {natsserver.Config{}, "store_dir"},
		"listen port 70000": {natsserver.Config{StoreDir: "/tmp/x", Listen: "127.0.0.1:70000"}, "listen"},
		"route port 70000": {natsserver.Config{StoreDir: "/tmp/x", ServerName: "a",
			Cluster: natsserver.Cluster{Name: "c", Listen: "127.0.0.1:6222", Routes: []string{"127.0.0.1:70000"}}}, "cluster.routes[0]"},
		"17 routes": {natsserver.Config{StoreDir: "/tmp/x", ServerName: "a",
			Cluster: natsserver.Cluster{Name: "c", Listen: "127.0.0.1:6222", Routes: make([]string, 17)}}, "cluster.routes"},
		"routes without a cluster name": {natsserver.Config{StoreDir: "/tmp/x", Cluster: natsserver.Cluster{Routes: []string{"a:1"}}}, "cluster.name"},
		"cluster without a server name": {natsserver.Config{StoreDir: "/tmp/x", Cluster: natsserver.Cluster{Name: "c", Listen: "127.0.0.1:6222"}}, "server_name"},
	}
	for name, c := range cases {
		err := c.cfg.Validate("")
		if err == nil || !strings.Contains(err.Error(), c.key+":") {
			t.Errorf("%s: error %v, want one naming %s", name, err, c.key)
		}
	}
	ok := natsserver.Config{StoreDir: "/tmp/x", Listen: "127.0.0.1:4222", ServerName: "a",
		Cluster: natsserver.Cluster{Name: "c", Listen: "127.0.0.1:6222", Routes: []string{"127.0.0.1:6223", "nats-route://127.0.0.1:6224"}}}
	if err := ok.Validate(""); err != nil {
		t.Errorf("a valid cluster member refused: %v", err)
	}
}
