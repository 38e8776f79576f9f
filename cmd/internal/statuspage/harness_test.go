package statuspage_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/fanpbx/fan/cmd/internal/statuspage"
	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/bus/bustest"
	"github.com/fanpbx/fan/pkg/platform/logtest"
	"github.com/nats-io/nats-server/v2/server"
)

const testToken = "k3J9-a-test-token-of-some-length_0123456789"

// page is a status page served on loopback from a real embedded JetStream,
// with the arbiter's and two probers' connections to publish what they do.
type page struct {
	t      *testing.T
	base   string // http://127.0.0.1:PORT/PREFIX/
	arb    *bus.Bus
	probes map[string]*bus.Bus
	logs   *logtest.Buffer
	// srv is the bus's server; repl the replicators' connections made on
	// demand (summarise).
	srv  *server.Server
	repl map[string]*bus.Bus
}

// startPage starts a bus, writes the token file and serves the page with
// cfg (Listen and TokenFile are filled in) until the test ends.
func startPage(t *testing.T, cfg statuspage.Config) *page {
	t.Helper()
	s := bustest.Server(t)
	p := &page{t: t, arb: bustest.Connect(t, s, bus.Identity{Cluster: "lab", Service: "arbiter", Node: "ctl"}),
		probes: map[string]*bus.Bus{}, srv: s}
	for _, n := range []string{"n1", "n2"} {
		p.probes[n] = bustest.Connect(t, s, bus.Identity{Cluster: "lab", Service: "prober", Node: n})
	}
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte(testToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg.TokenFile = tokenFile
	cfg.Listen = "127.0.0.1:0"
	p.logs = &logtest.Buffer{}
	log := slog.New(slog.NewTextHandler(p.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	srv, err := statuspage.New(cfg, "lab", log)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := srv.Listen()
	if err != nil {
		t.Fatal(err)
	}
	viewer := bustest.Connect(t, s, bus.Identity{Cluster: "lab", Service: "fanctl-serve", Node: "noc"})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, ln, viewer) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("serve: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("the page did not stop within 10 s of its context")
		}
		if bytes.Contains([]byte(p.logs.String()), []byte(testToken)) {
			t.Error("the token is in the page's log")
		}
	})
	prefix := cfg.PathPrefix
	if prefix == "" {
		prefix = "/"
	}
	p.base = "http://" + ln.Addr().(*net.TCPAddr).String() + prefix
	return p
}

// putStatus writes a group's status record as the arbiter leader does.
func (p *page) putStatus(g events.GroupStatus) {
	p.t.Helper()
	ctx := context.Background()
	kv, err := p.arb.StateKV(ctx)
	if err != nil {
		p.t.Fatal(err)
	}
	v, err := json.Marshal(g)
	if err != nil {
		p.t.Fatal(err)
	}
	if _, err := kv.Put(ctx, events.GroupStatusKey("lab", g.Group), v); err != nil {
		p.t.Fatal(err)
	}
}

// heartbeat publishes node's heartbeat with its prober's check states.
func (p *page) heartbeat(node string, checks map[string]events.CheckState) {
	p.t.Helper()
	if _, err := p.probes[node].Emit(context.Background(), events.NodeHeartbeat{Node: node, Seq: 1, IntervalMS: 1000,
		Version: "test", Checks: checks}); err != nil {
		p.t.Fatal(err)
	}
}

// group is a two-node group held by holder at epoch.
func group(holder string, epoch uint64, now time.Time) events.GroupStatus {
	health := map[string]events.Health{"n1": events.HealthUp, "n2": events.HealthUp}
	if holder == "n2" {
		health["n1"] = events.HealthDown
	}
	situation := "holding: n1 is preferred and healthy"
	if holder == "n2" {
		situation = "holding n2: n1 is down (ami); failing back to n1 waits for a failback permit"
	}
	return events.GroupStatus{Group: "pbx", Addresses: []string{"198.51.100.10/24"}, Holder: holder, Epoch: epoch,
		Since: now, UpdatedAt: now, PermitUntil: now.Add(time.Hour), Situation: situation,
		Nodes: map[string]events.NodeStatus{
			"n1": {Health: health["n1"], HealthSince: now, LastHeartbeat: now, Priority: 0, Eligible: health["n1"] == events.HealthUp},
			"n2": {Health: health["n2"], HealthSince: now, LastHeartbeat: now, Priority: 1, Eligible: true}}}
}

// failover publishes what the real services publish when n1 fails: n1's
// prober's transition, the arbiter's decision citing it, and the new status
// record. It returns the decision.
func (p *page) failover(epoch uint64) events.Envelope {
	p.t.Helper()
	ctx := context.Background()
	down, err := p.probes["n1"].Emit(ctx, events.HealthTransition{Check: "ami", TargetNode: "n1", Role: events.RoleSelf,
		From: events.HealthUp, To: events.HealthDown, Reason: "3 consecutive failures", Consecutive: 3, Rise: 2, Fall: 3,
		Evidence: []events.Evidence{{At: time.Now(), Error: "connection refused", ErrorClass: events.ErrorRefused, DurationMS: 1.5}}})
	if err != nil {
		p.t.Fatal(err)
	}
	dec, err := p.arb.Emit(ctx, events.ArbiterDecision{Group: "pbx", Action: events.ActionFailover, From: "n1", To: "n2",
		Reason: "holder n1 down (ami)", CausedBy: []string{down.ID}}, events.CausedBy(down), events.WithEpoch(epoch))
	if err != nil {
		p.t.Fatal(err)
	}
	p.putStatus(group("n2", epoch, time.Now()))
	return dec
}

// get sends a GET of rel under the page with the given headers.
func (p *page) get(rel string, header map[string]string) *http.Response {
	p.t.Helper()
	return p.getURL(p.base+rel, header)
}

var noRedirect = &http.Client{Timeout: 20 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error {
	return http.ErrUseLastResponse
}}

func bearer(tok string) map[string]string { return map[string]string{"Authorization": "Bearer " + tok} }
