package bustest

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
)

// User is one nkey identity of a test bus with the permissions pkg/events
// derives for its role: what fanctl nats-config writes for a server.
type User struct {
	ID events.Identity
	// SeedFile holds the identity's seed, as a service's nkey_seed names it.
	SeedFile string
}

// NewUser makes an identity of role named name in cluster.
func NewUser(t testing.TB, cluster string, role events.BusRole, name string) User {
	t.Helper()
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	seed, err := kp.Seed()
	if err != nil {
		t.Fatal(err)
	}
	pub, err := kp.PublicKey()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "user.nk")
	if err := os.WriteFile(path, seed, 0o600); err != nil {
		t.Fatal(err)
	}
	return User{ID: events.Identity{Cluster: cluster, Role: role, Name: name, PublicKey: pub}, SeedFile: path}
}

// NkeyUser is u as a server's configuration knows it.
func (u User) NkeyUser(t testing.TB) *server.NkeyUser {
	t.Helper()
	p, err := u.ID.Permissions()
	if err != nil {
		t.Fatal(err)
	}
	sp := &server.Permissions{
		Publish:   &server.SubjectPermission{Allow: p.Publish.Allow, Deny: p.Publish.Deny},
		Subscribe: &server.SubjectPermission{Allow: p.Subscribe.Allow, Deny: p.Subscribe.Deny},
	}
	if p.AllowResponses {
		sp.Response = &server.ResponsePermission{MaxMsgs: 1}
	}
	return &server.NkeyUser{Nkey: u.ID.PublicKey, Permissions: sp}
}

// EnforcingServer starts a JetStream server on loopback that knows only
// users, each held to its permissions; stopped when the test ends.
func EnforcingServer(t testing.TB, users ...User) *server.Server {
	t.Helper()
	var nk []*server.NkeyUser
	for _, u := range users {
		nk = append(nk, u.NkeyUser(t))
	}
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, JetStream: true,
		StoreDir: t.TempDir(), NoLog: true, NoSigs: true, Nkeys: nk})
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

// ConnectAs connects u to s as service (its node is u's name), without
// provisioning; closed at cleanup.
func ConnectAs(ctx context.Context, t testing.TB, s *server.Server, u User, service string) *bus.Bus {
	t.Helper()
	b, err := bus.Connect(ctx, bus.Config{URL: s.ClientURL(), NKeySeed: u.SeedFile},
		bus.Identity{Cluster: u.ID.Cluster, Service: service, Node: u.ID.Name}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatalf("bus connect as %s: %v", u.ID.Name, err)
	}
	t.Cleanup(b.Close)
	return b
}
