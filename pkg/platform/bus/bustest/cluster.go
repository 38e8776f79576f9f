package bustest

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/fanpbx/fan/pkg/platform/porttest"
	"github.com/fanpbx/fan/pkg/platform/waittest"
)

// System account credentials of a Cluster (for meta-leader requests).
const (
	SystemUser     = "sys"
	SystemPassword = "sys"
)

// AccountsCluster is a JetStream cluster of real nats-servers in this
// process, on loopback, set up with accounts as a production cluster is:
// clients that give no credentials land in the application account, and
// SystemUser/SystemPassword reach the system account (which requests about
// the meta group need; Cluster's servers have no system user). Each server
// keeps its ports and store across Stop and Restart.
type AccountsCluster struct {
	t     testing.TB
	Names []string

	mu      sync.Mutex
	confs   map[string]string
	clients map[string]string
	servers map[string]*server.Server
}

// SystemCluster starts n servers named n1..nN (n >= 3 for a quorum that
// survives one loss), waits until JetStream has a meta leader, and stops
// them all at cleanup.
func SystemCluster(t testing.TB, n int) *AccountsCluster {
	t.Helper()
	c := &AccountsCluster{t: t, confs: map[string]string{}, clients: map[string]string{}, servers: map[string]*server.Server{}}
	var clientPorts, routePorts []int
	var routes []string
	for range n {
		clientPorts, routePorts = append(clientPorts, porttest.Port(t)), append(routePorts, porttest.Port(t))
		routes = append(routes, fmt.Sprintf("nats-route://127.0.0.1:%d", routePorts[len(routePorts)-1]))
	}
	dir := t.TempDir()
	for i := range n {
		name := fmt.Sprintf("n%d", i+1)
		c.Names = append(c.Names, name)
		conf := fmt.Sprintf(`server_name: %s
listen: 127.0.0.1:%d
jetstream { store_dir: %q, max_memory_store: 64MB, max_file_store: 1GB }
cluster { name: fantest, listen: 127.0.0.1:%d, routes: [%s] }
accounts {
  FAN { jetstream: enabled, users: [{user: fan, password: fan}] }
  SYS { users: [{user: %s, password: %s}] }
}
system_account: SYS
no_auth_user: fan
`, name, clientPorts[i], filepath.Join(dir, name), routePorts[i], strings.Join(routes, ", "), SystemUser, SystemPassword)
		path := filepath.Join(dir, name+".conf")
		if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
			t.Fatalf("cluster config: %v", err)
		}
		c.confs[name] = path
		c.clients[name] = fmt.Sprintf("nats://127.0.0.1:%d", clientPorts[i])
	}
	// Start all before waiting on any: a server is not ready for JetStream
	// until it has routes.
	var wg sync.WaitGroup
	for _, name := range c.Names {
		wg.Go(func() { c.start(name) })
	}
	wg.Wait()
	t.Cleanup(func() {
		for _, name := range c.Names {
			c.Stop(name)
		}
	})
	c.WaitMetaLeader(30 * time.Second)
	return c
}

func (c *AccountsCluster) start(name string) {
	opts, err := server.ProcessConfigFile(c.confs[name])
	if err != nil {
		c.t.Errorf("cluster %s config: %v", name, err)
		return
	}
	opts.NoLog, opts.NoSigs = true, true
	s, err := server.NewServer(opts)
	if err != nil {
		c.t.Errorf("cluster %s: %v", name, err)
		return
	}
	go s.Start()
	if !s.ReadyForConnections(20 * time.Second) {
		c.t.Errorf("cluster %s not ready", name)
		return
	}
	c.mu.Lock()
	c.servers[name] = s
	c.mu.Unlock()
}

// URL lists every server's client URL, for bus.Config.URL.
func (c *AccountsCluster) URL() string {
	var urls []string
	for _, name := range c.Names {
		urls = append(urls, c.clients[name])
	}
	return strings.Join(urls, ",")
}

// ClientURL is one server's client URL.
func (c *AccountsCluster) ClientURL(name string) string { return c.clients[name] }

// Server returns a running server by name, nil when stopped.
func (c *AccountsCluster) Server(name string) *server.Server {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.servers[name]
}

// Stop shuts a server down; its raft groups hand their leadership over
// first, as nats-server does on every clean shutdown.
func (c *AccountsCluster) Stop(name string) {
	c.mu.Lock()
	s := c.servers[name]
	delete(c.servers, name)
	c.mu.Unlock()
	if s != nil {
		s.Shutdown()
		s.WaitForShutdown()
	}
}

// Restart starts a stopped server again with its ports and store.
func (c *AccountsCluster) Restart(name string) {
	c.t.Helper()
	if c.Server(name) != nil {
		return
	}
	c.start(name)
}

// WaitMetaLeader waits until some running server sees a meta leader.
func (c *AccountsCluster) WaitMetaLeader(within time.Duration) string {
	c.t.Helper()
	var leader string
	waittest.Until(c.t, within, "a JetStream meta leader", func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		for _, s := range c.servers {
			if s.JetStreamIsLeader() {
				leader = s.Name()
				return true
			}
		}
		return false
	})
	return leader
}
