package bus_test

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/bus/bustest"
	"github.com/fanpbx/fan/pkg/platform/waittest"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/prometheus/client_golang/prometheus"
)

// gauge reads one series of u's collectors, -1 when absent.
func gauge(t *testing.T, u *bus.Usage, name string, labels ...string) float64 {
	t.Helper()
	reg := prometheus.NewRegistry()
	for _, c := range u.Collectors() {
		reg.MustRegister(c)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metric:
		for _, m := range mf.GetMetric() {
			got := map[string]string{}
			for _, lp := range m.GetLabel() {
				got[lp.GetName()] = lp.GetValue()
			}
			for i := 0; i+1 < len(labels); i += 2 {
				if got[labels[i]] != labels[i+1] {
					continue metric
				}
			}
			return m.GetGauge().GetValue()
		}
	}
	return -1
}

// TestPeersFollowTheCluster: on a real three-server cluster with fan's
// streams at replicas 3, every raft group (the meta group through the
// system account) reports three current peers of three and every server
// up; with one server stopped, its groups report two current peers and the
// server down; back, three again.
func TestPeersFollowTheCluster(t *testing.T) {
	c := bustest.SystemCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cfg := bus.Config{URL: c.URL(), Replicas: 3, System: &bus.SystemAccount{User: bustest.SystemUser, Password: bustest.SystemPassword}}
	b, err := bus.Connect(ctx, cfg, ident("arbiter", "ctl"), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if err := b.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	sys, err := bus.ConnectSystem(cfg, "peers-test", slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer sys.Close()
	u := bus.NewUsage()
	u.System = sys
	// waitRead reads until ok holds for what the gauges say.
	waitRead := func(what string, ok func() bool) {
		t.Helper()
		deadline, _ := ctx.Deadline()
		waittest.Succeeds(t, time.Until(deadline), what, func() error {
			b.ReadUsage(ctx, u)
			if ok() {
				return nil
			}
			return fmt.Errorf("FAN_EVENTS %v of %v current, meta %v of %v, servers n1 %v n2 %v n3 %v",
				gauge(t, u, "fan_raft_peers_current", "group", bus.EventsStream), gauge(t, u, "fan_raft_peers", "group", bus.EventsStream),
				gauge(t, u, "fan_raft_peers_current", "group", bus.MetaGroup), gauge(t, u, "fan_raft_peers", "group", bus.MetaGroup),
				gauge(t, u, "fan_nats_server_up", "server", "n1"), gauge(t, u, "fan_nats_server_up", "server", "n2"),
				gauge(t, u, "fan_nats_server_up", "server", "n3"))
		})
	}
	all := func(groups []string, want float64) bool {
		for _, g := range groups {
			if gauge(t, u, "fan_raft_peers", "group", g) != 3 || gauge(t, u, "fan_raft_peers_current", "group", g) != want {
				return false
			}
		}
		return true
	}
	groups := []string{bus.EventsStream, bus.CommandsStream, bus.LiveStream, bus.MetaGroup}
	up := func(name string, want float64) bool { return gauge(t, u, "fan_nats_server_up", "server", name) == want }
	waitRead("healthy", func() bool { return all(groups, 3) && up("n1", 1) && up("n2", 1) && up("n3", 1) })

	c.Stop("n3")
	waitRead("n3 stopped", func() bool { return all(groups, 2) && up("n3", 0) && up("n1", 1) && up("n2", 1) })

	c.Restart("n3")
	waitRead("n3 back", func() bool { return all(groups, 3) && up("n3", 1) })
}

// TestServerCertificatesThroughTheSystemAccount: every server's TLS
// certificate expiry, read from its report through the system account.
func TestServerCertificatesThroughTheSystemAccount(t *testing.T) {
	p := newPKI(t)
	conf := fmt.Sprintf(`server_name: nats-ctl
listen: 127.0.0.1:-1
jetstream { store_dir: %q }
tls { cert_file: %q, key_file: %q }
accounts {
  FAN { jetstream: enabled, users: [{user: fan, password: fan}] }
  SYS { users: [{user: sys, password: sys}] }
}
system_account: SYS
no_auth_user: fan
`, filepath.Join(t.TempDir(), "js"), p.serverCert, p.serverKey)
	path := filepath.Join(t.TempDir(), "nats.conf")
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	opts, err := server.ProcessConfigFile(path)
	if err != nil {
		t.Fatal(err)
	}
	opts.NoLog, opts.NoSigs = true, true
	s, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("server not ready")
	}
	defer s.Shutdown()
	url := strings.Replace(s.ClientURL(), "nats://", "tls://", 1)
	cfg := bus.Config{URL: url, TLS: bus.TLSConfig{CA: p.ca}, System: &bus.SystemAccount{User: "sys", Password: "sys"}}
	sys, err := bus.ConnectSystem(cfg, "certs-test", slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer sys.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	app, err := bus.Connect(ctx, bus.Config{URL: url, TLS: bus.TLSConfig{CA: p.ca}}, ident("arbiter", "ctl"), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer app.Close()
	u := bus.NewUsage()
	u.System = sys
	want := float64(mustNotAfter(t, p.serverCert).Unix())
	deadline, _ := ctx.Deadline()
	waittest.Succeeds(t, time.Until(deadline), "the client certificate of nats-ctl read", func() error {
		app.ReadUsage(ctx, u)
		got := gauge(t, u, "fan_nats_cert_not_after_timestamp_seconds", "server", "nats-ctl", "listener", "client")
		if got != want || gauge(t, u, "fan_nats_server_up", "server", "nats-ctl") != 1 {
			return fmt.Errorf("not after %v, want %v", got, want)
		}
		return nil
	})
}

func mustNotAfter(t *testing.T, path string) time.Time {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		t.Fatalf("%s: no PEM block", path)
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c.NotAfter
}
