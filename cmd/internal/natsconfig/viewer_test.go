package natsconfig

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fanpbx/fan/cmd/internal/statuspage"
	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/waittest"
)

// TestViewerServesThePage: the status page runs on the viewer's generated
// credentials, on a server enforcing the generated permissions: it shows
// the status the arbiter wrote with the node's checks, streams the trail
// and explains a decision. The same credentials are refused every write
// and every request to a service.
func TestViewerServesThePage(t *testing.T) {
	out := t.TempDir()
	c := testCluster(t, out)
	c.Viewers = []string{"noc"}
	if err := c.validate(); err != nil {
		t.Fatal(err)
	}
	if _, err := Generate(c, Options{Out: out}); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(Bundle(out, "noc"), FanctlFile)); err != nil || !strings.Contains(string(b), "nkey_seed") {
		t.Fatalf("the viewer's fanctl.yaml: %v\n%s", err, b)
	}
	startServer(t, c, out)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := connectBus(t, ctx, c, out, "admin", "admin").Provision(ctx); err != nil {
		t.Fatal(err)
	}
	arbiter := connectBus(t, ctx, c, out, "ctl1", "arbiter")
	prober := connectBus(t, ctx, c, out, "n1", "prober")
	now := time.Now()
	g := events.GroupStatus{Group: "pbx", Holder: "n1", Epoch: 4, UpdatedAt: now,
		Nodes: map[string]events.NodeStatus{"n1": {Health: events.HealthUp, LastHeartbeat: now}}}
	v, _ := json.Marshal(g)
	kv, err := arbiter.StateKV(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, events.GroupStatusKey(c.Cluster, "pbx"), v); err != nil {
		t.Fatal(err)
	}
	if _, err := prober.Emit(ctx, events.NodeHeartbeat{Node: "n1", IntervalMS: 1000, Version: "t",
		Checks: map[string]events.CheckState{"ami": {TargetNode: "n1", Role: events.RoleSelf, Health: events.HealthUp, Since: now}}}); err != nil {
		t.Fatal(err)
	}
	down, err := prober.Emit(ctx, events.HealthTransition{Check: "ami", TargetNode: "n1", Role: events.RoleSelf, From: events.HealthUp,
		To: events.HealthDown, Reason: "test", Consecutive: 3, Rise: 2, Fall: 3,
		Evidence: []events.Evidence{{At: now, Error: "timeout", ErrorClass: events.ErrorTimeout}}})
	if err != nil {
		t.Fatal(err)
	}
	dec, err := arbiter.Emit(ctx, events.ArbiterDecision{Group: "pbx", Action: events.ActionHold, From: "n1", Reason: "test",
		CausedBy: []string{down.ID}}, events.CausedBy(down))
	if err != nil {
		t.Fatal(err)
	}

	token := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(token, []byte("a-token-for-the-viewer-test-0123"), 0o600); err != nil {
		t.Fatal(err)
	}
	srv, err := statuspage.New(statuspage.Config{Listen: "127.0.0.1:0", TokenFile: token}, c.Cluster, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	ln, err := srv.Listen()
	if err != nil {
		t.Fatal(err)
	}
	viewer := connectBus(t, ctx, c, out, "noc", "viewer")
	sctx, stop := context.WithCancel(ctx)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(sctx, ln, viewer) }()
	defer func() {
		stop()
		if err := <-served; err != nil {
			t.Errorf("serve: %v", err)
		}
	}()
	base := "http://" + ln.Addr().String() + "/"
	get := func(rel string) *http.Response {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+rel, nil)
		req.Header.Set("Authorization", "Bearer a-token-for-the-viewer-test-0123")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}

	// The status, with the heartbeat's checks: KV and live stream reads.
	var snap statuspage.Snapshot
	waittest.Succeeds(t, 10*time.Second, "the viewer's page showing the group with its checks", func() error {
		resp := get("api/status")
		err := json.NewDecoder(resp.Body).Decode(&snap)
		_ = resp.Body.Close()
		if err == nil && (len(snap.Groups) != 1 || len(snap.Groups[0].Nodes) != 1 || len(snap.Groups[0].Nodes[0].Checks) != 1) {
			err = fmt.Errorf("shown: %+v", snap)
		}
		return err
	})
	if snap.Groups[0].Status.Holder != "n1" || snap.Groups[0].Status.Epoch != 4 {
		t.Fatalf("status %+v", snap.Groups[0].Status)
	}

	// The timeline: the audit stream through the page's own consumer.
	resp := get("api/events")
	r := bufio.NewReader(resp.Body)
	for found := false; !found; {
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("the stream ended before the decision: %v", err)
		}
		found = strings.HasPrefix(line, "data: ") && strings.Contains(line, dec.ID)
	}
	_ = resp.Body.Close()

	// An explanation: the trail read back, audit and live streams.
	resp = get("api/explain?id=" + dec.ID)
	var chain struct {
		Links []statuspage.LinkView `json:"links"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&chain); err != nil || resp.StatusCode != http.StatusOK || len(chain.Links) != 2 {
		t.Fatalf("explain as the viewer: %s %v %+v", resp.Status, err, chain)
	}
	_ = resp.Body.Close()

	// Everything else is refused.
	vr := connectRaw(t, c, out, "noc", "viewer")
	vr.publish(t, "viewer writes a group status", events.KVSubject(events.StateBucket, events.GroupStatusKey(c.Cluster, "pbx")))
	vr.publish(t, "viewer publishes a health transition", events.HealthSubject(c.Cluster, "n1"))
	vr.publish(t, "viewer sends a claim", events.CommandSubject(c.Cluster, "n1", events.VerbClaim))
	vr.publish(t, "viewer asks for a switchover", events.OperatorRequestSubject(c.Cluster, "noc"))
	vr.publish(t, "viewer asks the arbiter's status", events.ServiceStatusSubject(c.Cluster, "arbiter", "ctl1"))
	vr.publish(t, "viewer pings the services", "$SRV.PING")
	vr.publish(t, "viewer lists the streams", "$JS.API.STREAM.NAMES")
	vr.publish(t, "viewer reads the command stream", "$JS.API.CONSUMER.CREATE.FAN_CMD.x."+events.NodeCommands(c.Cluster, "n1"))
	vr.publish(t, "viewer purges the live stream", "$JS.API.STREAM.PURGE.FAN_LIVE")
}
