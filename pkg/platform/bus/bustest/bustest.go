// Package bustest starts a real, embedded nats-server with JetStream for
// tests, one per test, on a random loopback port.
package bustest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/natsserver"
	"github.com/fanpbx/fan/pkg/platform/porttest"
	"github.com/fanpbx/fan/pkg/platform/waittest"
	"github.com/nats-io/nats-server/v2/server"
)

// Server starts a JetStream server listening on 127.0.0.1 (so separate
// processes can reach it too) and stops it when the test ends.
func Server(t testing.TB) *server.Server {
	t.Helper()
	s, err := server.NewServer(&server.Options{
		Host: "127.0.0.1", Port: server.RANDOM_PORT, JetStream: true,
		StoreDir: t.TempDir(), NoLog: true, NoSigs: true,
	})
	if err != nil {
		t.Fatalf("nats server: %v", err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats server not ready")
	}
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	return s
}

// Connect connects a provisioned bus client for id to s; closed at cleanup.
func Connect(t testing.TB, s *server.Server, id bus.Identity) *bus.Bus {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	b, err := bus.Connect(ctx, bus.Config{URL: s.ClientURL()}, id, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatalf("bus connect: %v", err)
	}
	t.Cleanup(b.Close)
	if err := b.Provision(ctx); err != nil {
		t.Fatalf("provision: %v", err)
	}
	return b
}

// Cluster starts a JetStream cluster of len(names) servers on loopback,
// through natsserver.Start as fan-nats does, each server named after its
// entry in names. It returns once the servers are routed to one another and
// JetStream has a meta leader, and stops them when the test ends. Servers
// shut down by the test stay down; Restart brings one back.
func Cluster(t testing.TB, names ...string) *TestCluster {
	t.Helper()
	c := &TestCluster{t: t, specs: memberSpecs(t, t.TempDir(), names), Names: names, Servers: map[string]*server.Server{}}
	var wg sync.WaitGroup
	errs := make([]error, len(names))
	for i, name := range names {
		wg.Go(func() { errs[i] = c.start(name) })
	}
	wg.Wait()
	t.Cleanup(func() {
		for _, s := range c.Servers {
			s.Shutdown()
			s.WaitForShutdown()
		}
	})
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	c.WaitMetaLeader()
	return c
}

// TestCluster is a running test cluster.
type TestCluster struct {
	t       testing.TB
	specs   map[string]natsserver.Config
	mu      sync.Mutex
	Names   []string
	Servers map[string]*server.Server
}

func (c *TestCluster) start(name string) error {
	s, err := natsserver.Start(c.specs[name], slog.New(slog.DiscardHandler))
	if err != nil {
		return fmt.Errorf("start %s: %w", name, err)
	}
	c.mu.Lock()
	c.Servers[name] = s
	c.mu.Unlock()
	return nil
}

// URL lists every member's client address, in the order of names given
// (the first one first), as a service's bus.url does.
func (c *TestCluster) URL(names ...string) string { return clusterURL(c.specs, c.Names, names) }

// memberSpecs gives each named member a client port, a route port and a
// store under dir, every member routed to all.
func memberSpecs(t testing.TB, dir string, names []string) map[string]natsserver.Config {
	t.Helper()
	routes := make([]string, len(names))
	clientPorts := make([]int, len(names))
	for i := range names {
		routes[i] = fmt.Sprintf("127.0.0.1:%d", porttest.Port(t))
		clientPorts[i] = porttest.Port(t)
	}
	specs := map[string]natsserver.Config{}
	for i, name := range names {
		specs[name] = natsserver.Config{
			StoreDir:   filepath.Join(dir, name),
			Listen:     fmt.Sprintf("127.0.0.1:%d", clientPorts[i]),
			ServerName: name,
			Cluster:    natsserver.Cluster{Name: "fan-test", Listen: routes[i], Routes: routes},
		}
	}
	return specs
}

// clusterURL lists the client addresses of names (all, in order, when none
// are given).
func clusterURL(specs map[string]natsserver.Config, all, names []string) string {
	if len(names) == 0 {
		names = all
	}
	var urls []string
	for _, n := range names {
		urls = append(urls, "nats://"+specs[n].Listen)
	}
	return strings.Join(urls, ",")
}

// Stop shuts one member down (its store stays for Restart).
func (c *TestCluster) Stop(name string) {
	c.mu.Lock()
	s := c.Servers[name]
	delete(c.Servers, name)
	c.mu.Unlock()
	if s != nil {
		s.Shutdown()
		s.WaitForShutdown()
	}
}

// Restart starts a stopped member again on its address and store.
func (c *TestCluster) Restart(name string) {
	c.t.Helper()
	if err := c.start(name); err != nil {
		c.t.Fatal(err)
	}
}

// WaitMetaLeader waits until every running member knows the same JetStream
// meta leader, and returns its name.
func (c *TestCluster) WaitMetaLeader() string {
	c.t.Helper()
	var leader string
	waittest.Succeeds(c.t, 30*time.Second, fmt.Sprintf("a JetStream meta leader agreed by %v", c.Names), func() error {
		var err error
		leader, err = c.agreedMetaLeader()
		return err
	})
	return leader
}

// agreedMetaLeader is the meta leader every running member knows, one that
// sees every other member as current; or, as the error, what each sees.
func (c *TestCluster) agreedMetaLeader() (string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	leaders := map[string]bool{}
	ready := true
	var seen []string
	for name, s := range c.Servers {
		jsz, err := s.Jsz(nil)
		switch {
		case err != nil:
			seen = append(seen, fmt.Sprintf("%s: %v", name, err))
			ready = false
			continue
		case jsz.Meta == nil:
			seen = append(seen, fmt.Sprintf("%s: no meta group (routes %d)", name, s.NumRoutes()))
			ready = false
			continue
		}
		seen = append(seen, fmt.Sprintf("%s: leader %q size %d routes %d", name, jsz.Meta.Leader, jsz.Meta.Size, s.NumRoutes()))
		if jsz.Meta.Leader == "" {
			ready = false
			continue
		}
		// The leader must see every other running member as current.
		if s.JetStreamIsLeader() {
			current := 1
			for _, p := range jsz.Meta.Replicas {
				if p.Current && !p.Offline {
					current++
				}
			}
			if current < len(c.Servers) {
				ready = false
			}
		}
		leaders[jsz.Meta.Leader] = true
	}
	if ready && len(leaders) == 1 {
		for l := range leaders {
			return l, nil
		}
	}
	return "", errors.New(strings.Join(seen, "; "))
}

// Outbox starts an outbox on b, as the daemon runtime does for a service;
// it is drained (for up to a second) at cleanup.
func Outbox(t testing.TB, b *bus.Bus) *bus.Outbox {
	t.Helper()
	o := bus.NewOutbox(b, bus.OutboxConfig{}, slog.New(slog.DiscardHandler))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = o.Close(ctx)
	})
	return o
}
