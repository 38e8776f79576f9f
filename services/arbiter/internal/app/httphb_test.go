package app

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/bus/bustest"
	"github.com/fanpbx/fan/pkg/platform/porttest"
	"github.com/fanpbx/fan/pkg/platform/waittest"
)

const (
	testToken = "s3cret-token-for-tests"
	// nodeToken is legacy2's own token (http_heartbeat.node_token_files).
	nodeToken = "legacy2-own-token-for-tests"
)

// tokenFile writes a token to a file of its own.
func tokenFile(t *testing.T, tok string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(p, []byte(tok+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// The HTTP heartbeat endpoint of a running arbiter (leader, embedded
// JetStream): every malformed, unauthenticated, unknown or oversized
// request is a clear 4xx and puts nothing on the bus; a good one becomes a
// node.heartbeat that the leader's registry records, which GET lists.
func TestHTTPHeartbeat(t *testing.T) {
	l := newLab(t, "n1", "n2")
	addr := porttest.Addr(t)
	cfg := l.cfg("ctlA")
	// Every case comes from one address: a rate limit above them all
	// (TestHTTPHeartbeatEdge attacks the limit).
	cfg.HTTPHeartbeat = HTTPHeartbeatConfig{Listen: addr, Token: testToken, MaxBody: 512, Nodes: []string{"legacy1", "legacy2"},
		NodeTokenFiles: map[string]string{"legacy2": tokenFile(t, nodeToken)},
		RateLimit:      HTTPHeartbeatRateLimit{PerSecond: 1000, Burst: 10000}}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	svc, err := New(cfg, slog.New(slog.DiscardHandler), "test")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = svc.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })

	var mu sync.Mutex
	var beats []*events.NodeHeartbeat
	watcher := bustest.Connect(t, l.s, bus.Identity{Cluster: "lab", Service: "test", Node: "w"})
	go func() {
		_ = watcher.Watch(ctx, bus.WatchOptions{Subjects: []string{events.AllHeartbeats("lab")}, All: true},
			func(_ events.Envelope, p events.Decoded, _ uint64) {
				mu.Lock()
				beats = append(beats, p.(*events.NodeHeartbeat))
				mu.Unlock()
			})
	}()

	base := "http://" + addr
	do := func(method, path, token, ctype, body string) (int, string) {
		t.Helper()
		var resp *http.Response
		// The arbiter may still be starting.
		waittest.Succeeds(t, 10*time.Second, method+" "+path+" answered", func() error {
			req, _ := http.NewRequest(method, base+path, strings.NewReader(body))
			if token != "" {
				req.Header.Set("Authorization", "Bearer "+token)
			}
			if ctype != "" {
				req.Header.Set("Content-Type", ctype)
			}
			var err error
			resp, err = http.DefaultClient.Do(req)
			return err
		})
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	good := `{"node":"legacy1","cpu_percent":12.5,"mem_available_bytes":700,"mem_total_bytes":1000,"active_channels":3}`
	cases := []struct {
		name, method, path, token, ctype, body string
		code                                   int
		msg                                    string
	}{
		{"no token", "POST", "/api/servers/heartbeat", "", "", good, 401, "bearer token"},
		{"wrong token", "POST", "/api/servers/heartbeat", "wrong-token-wrong-token", "", good, 401, "bearer token"},
		{"list without token", "GET", "/api/servers", "", "", "", 401, "bearer token"},
		{"wrong method", "GET", "/api/servers/heartbeat", testToken, "", "", 405, "POST"},
		{"not json content", "POST", "/api/servers/heartbeat", testToken, "text/plain", good, 415, "application/json"},
		{"malformed", "POST", "/api/servers/heartbeat", testToken, "", `{"node":`, 400, "malformed"},
		{"unknown field", "POST", "/api/servers/heartbeat", testToken, "", `{"node":"legacy1","cpu":1}`, 400, "unknown field"},
		{"two values", "POST", "/api/servers/heartbeat", testToken, "", good + good, 400, "more than one"},
		{"oversized", "POST", "/api/servers/heartbeat", testToken, "", `{"node":"legacy1","version":"` + strings.Repeat("x", 600) + `"}`, 413, "larger than 512"},
		{"unknown node", "POST", "/api/servers/heartbeat", testToken, "", strings.Replace(good, "legacy1", "n1", 1), 404, "may not post"},
		{"bad node name", "POST", "/api/servers/heartbeat", testToken, "", strings.Replace(good, "legacy1", "a.b", 1), 422, "node"},
		{"missing figures", "POST", "/api/servers/heartbeat", testToken, "", `{"node":"legacy1"}`, 422, "required"},
		{"cpu out of range", "POST", "/api/servers/heartbeat", testToken, "", strings.Replace(good, "12.5", "250", 1), 422, "cpu_percent"},
		{"more free than total", "POST", "/api/servers/heartbeat", testToken, "", strings.Replace(good, "700", "7000", 1), 422, "mem_available_bytes"},
		{"negative channels", "POST", "/api/servers/heartbeat", testToken, "", strings.Replace(good, `"active_channels":3`, `"active_channels":-1`, 1), 422, "negative"},
		{"interval_ms maxint", "POST", "/api/servers/heartbeat", testToken, "", strings.Replace(good, `"active_channels":3`, `"interval_ms":9223372036854775807`, 1), 422, "interval_ms"},
		{"interval_ms 10^12", "POST", "/api/servers/heartbeat", testToken, "", strings.Replace(good, `"active_channels":3`, `"interval_ms":1000000000000`, 1), 422, "interval_ms"},
		{"interval_ms 1", "POST", "/api/servers/heartbeat", testToken, "", strings.Replace(good, `"active_channels":3`, `"interval_ms":1`, 1), 422, "interval_ms"},
		{"channels 2^40", "POST", "/api/servers/heartbeat", testToken, "", strings.Replace(good, `"active_channels":3`, `"active_channels":1099511627776`, 1), 422, "active_channels"},
		{"no such path", "GET", "/api/nothing", testToken, "", "", 404, "no such endpoint"},
		// legacy2 has a token of its own: it posts with that alone, and
		// that token posts for legacy2 alone and lists nothing.
		{"node token for another node", "POST", "/api/servers/heartbeat", nodeToken, "", good, 401, `may not post node "legacy1"`},
		{"shared token for a node with its own", "POST", "/api/servers/heartbeat", testToken, "", strings.Replace(good, "legacy1", "legacy2", 1), 401, `may not post node "legacy2"`},
		{"node token lists", "GET", "/api/servers", nodeToken, "", "", 401, "posts its heartbeats only"},
	}
	for _, tc := range cases {
		code, body := do(tc.method, tc.path, tc.token, tc.ctype, tc.body)
		var e struct{ Error string }
		if code != tc.code || json.Unmarshal([]byte(body), &e) != nil || !strings.Contains(e.Error, tc.msg) {
			t.Errorf("%s: %d %s, want %d with an error containing %q", tc.name, code, body, tc.code, tc.msg)
		}
	}

	code, body := do("POST", "/api/servers/heartbeat", testToken, "application/json", good)
	if code != http.StatusAccepted {
		t.Fatalf("good heartbeat: %d %s", code, body)
	}
	if code, body := do("POST", "/api/servers/heartbeat", nodeToken, "application/json", strings.Replace(good, "legacy1", "legacy2", 1)); code != http.StatusAccepted {
		t.Fatalf("legacy2's heartbeat with its own token: %d %s", code, body)
	}
	// The good heartbeat is on the bus, and it is the only one: every
	// refused request published nothing.
	waittest.Until(t, 10*time.Second, "the heartbeat on the bus", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(beats) > 0
	})
	waittest.Until(t, 10*time.Second, "legacy2's heartbeat on the bus", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return slices.ContainsFunc(beats, func(hb *events.NodeHeartbeat) bool { return hb.Node == "legacy2" })
	})
	mu.Lock()
	var legacy, legacy2 []*events.NodeHeartbeat
	for _, hb := range beats {
		switch hb.Node {
		case "legacy1":
			legacy = append(legacy, hb)
		case "legacy2":
			legacy2 = append(legacy2, hb)
		}
	}
	mu.Unlock()
	if len(legacy2) != 1 {
		t.Errorf("heartbeats of legacy2 on the bus: %d, want the one posted with its own token", len(legacy2))
	}
	if len(legacy) != 1 || legacy[0].CPUPercent != 12.5 || legacy[0].MemAvailableBytes != 700 || *legacy[0].ActiveChannels != 3 ||
		legacy[0].IntervalMS != 60_000 {
		t.Fatalf("heartbeats of legacy1 on the bus: %+v", legacy)
	}
	// The leader's registry records it; GET lists it.
	waittest.Until(t, 10*time.Second, "legacy1 in GET /api/servers", func() bool {
		code, body := do("GET", "/api/servers", testToken, "", "")
		var r struct{ Servers []events.NodeRecord }
		if code != 200 || json.Unmarshal([]byte(body), &r) != nil {
			return false
		}
		for _, rec := range r.Servers {
			if rec.Node == "legacy1" && rec.Presence == events.PresenceOnline && rec.CPUPercent == 12.5 {
				return true
			}
		}
		return false
	})
}

func TestHTTPHeartbeatConfig(t *testing.T) {
	for name, h := range map[string]HTTPHeartbeatConfig{
		"short token": {Listen: "127.0.0.1:0", Token: "short", Nodes: []string{"x"}},
		"both tokens": {Listen: "127.0.0.1:0", Token: testToken, TokenFile: "/nonexistent", Nodes: []string{"x"}},
		"no file":     {Listen: "127.0.0.1:0", TokenFile: "/nonexistent/token", Nodes: []string{"x"}},
		"no nodes":    {Listen: "127.0.0.1:0", Token: testToken},
		"tiny body":   {Listen: "127.0.0.1:0", Token: testToken, Nodes: []string{"x"}, MaxBody: 10},
		"node token of no node": {Listen: "127.0.0.1:0", Token: testToken, Nodes: []string{"x"},
			NodeTokenFiles: map[string]string{"y": tokenFile(t, nodeToken)}},
		"node token is the shared one": {Listen: "127.0.0.1:0", Token: testToken, Nodes: []string{"x"},
			NodeTokenFiles: map[string]string{"x": tokenFile(t, testToken)}},
		"two nodes, one token": {Listen: "127.0.0.1:0", Token: testToken, Nodes: []string{"x", "y"},
			NodeTokenFiles: map[string]string{"x": tokenFile(t, nodeToken), "y": tokenFile(t, nodeToken)}},
		"short node token": {Listen: "127.0.0.1:0", Token: testToken, Nodes: []string{"x"},
			NodeTokenFiles: map[string]string{"x": tokenFile(t, "short")}},
		"no node token file": {Listen: "127.0.0.1:0", Token: testToken, Nodes: []string{"x"},
			NodeTokenFiles: map[string]string{"x": "/nonexistent/token"}},
	} {
		if err := h.validate(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	off := HTTPHeartbeatConfig{}
	if err := off.validate(); err != nil {
		t.Fatalf("disabled endpoint refused: %v", err)
	}
}
