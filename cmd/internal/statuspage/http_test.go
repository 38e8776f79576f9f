package statuspage_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fanpbx/fan/cmd/internal/statuspage"
	"github.com/fanpbx/fan/pkg/events"
)

// TestLoginIsRequired: every API answer needs the token or a session made
// with it; a missing or wrong one is 401, a forwarded-for header counts
// for nothing, and the page's headers are the safe ones.
func TestLoginIsRequired(t *testing.T) {
	p := startPage(t, statuspage.Config{PathPrefix: "/fan/"})
	p.putStatus(group("n1", 1, time.Now()))

	for name, h := range map[string]map[string]string{
		"no token":          nil,
		"wrong token":       bearer("not-the-token-at-all-but-long"),
		"token prefix":      bearer(testToken[:20]),
		"token and more":    bearer(testToken + "x"),
		"basic scheme":      {"Authorization": "Basic " + testToken},
		"forwarded from lo": {"X-Forwarded-For": "127.0.0.1", "X-Forwarded-User": "admin", "X-Real-IP": "127.0.0.1"},
		"forged cookie":     {"Cookie": "fan_session=" + strings.Repeat("a", 64)},
	} {
		for _, rel := range []string{"api/status", "api/events", "api/explain?id=x", "api/history"} {
			resp := p.get(rel, h)
			if resp.StatusCode != http.StatusUnauthorized {
				t.Errorf("%s, %s: %s, want 401", name, rel, resp.Status)
			}
			if resp.Header.Get("Cache-Control") != "no-store" || resp.Header.Get("WWW-Authenticate") == "" {
				t.Errorf("%s, %s: headers %v", name, rel, resp.Header)
			}
		}
	}
	if resp := p.get("api/status", bearer(testToken)); resp.StatusCode != http.StatusOK {
		t.Fatalf("the right token: %s", resp.Status)
	}

	// The page itself carries no data and loads without a login, with a
	// policy that allows no inline script.
	resp := p.get("", nil)
	body, _ := io.ReadAll(resp.Body)
	csp := resp.Header.Get("Content-Security-Policy")
	if resp.StatusCode != http.StatusOK || !bytes.Contains(body, []byte(`src="app.js"`)) || !strings.Contains(csp, "script-src 'self'") ||
		strings.Contains(csp, "unsafe-inline") || resp.Header.Get("X-Content-Type-Options") != "nosniff" ||
		resp.Header.Get("X-Frame-Options") != "DENY" {
		t.Fatalf("index: %s %v\n%s", resp.Status, resp.Header, body)
	}
	if bytes.Contains(body, []byte("<script>")) || bytes.Contains(body, []byte(` href="/`)) || bytes.Contains(body, []byte(` src="/`)) {
		t.Fatal("index has an inline script or an absolute URL (breaks the path prefix)")
	}
	if resp := p.get("app.js", nil); resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/javascript") {
		t.Fatalf("app.js: %s %v", resp.Status, resp.Header)
	}
	// Under the prefix only; the prefix without its slash is redirected.
	if resp := p.get("../api/status", bearer(testToken)); resp.StatusCode != http.StatusNotFound {
		t.Fatalf("outside the prefix: %s", resp.Status)
	}
	root := strings.TrimSuffix(p.base, "fan/")
	if resp := p.getURL(root+"fan", nil); resp.StatusCode != http.StatusPermanentRedirect || resp.Header.Get("Location") != "/fan/" {
		t.Fatalf("/fan: %s %q", resp.Status, resp.Header.Get("Location"))
	}

	// A login with the token opens a session; a wrong one does not, and
	// logging out ends it.
	if resp := p.login("wrong-token-but-long-enough"); resp.StatusCode != http.StatusUnauthorized || len(resp.Cookies()) != 0 {
		t.Fatalf("wrong login: %s %v", resp.Status, resp.Cookies())
	}
	resp = p.login(testToken)
	if resp.StatusCode != http.StatusNoContent || len(resp.Cookies()) != 1 {
		t.Fatalf("login: %s %v", resp.Status, resp.Cookies())
	}
	c := resp.Cookies()[0]
	if !c.HttpOnly || !c.Secure || c.SameSite != http.SameSiteStrictMode || c.Path != "/fan/" {
		t.Fatalf("session cookie %+v", c)
	}
	session := map[string]string{"Cookie": c.Name + "=" + c.Value}
	if resp := p.get("api/status", session); resp.StatusCode != http.StatusOK {
		t.Fatalf("with the session: %s", resp.Status)
	}
	req, _ := http.NewRequest(http.MethodPost, p.base+"api/logout", nil)
	req.Header.Set("Cookie", session["Cookie"])
	if resp, err := noRedirect.Do(req); err != nil || resp.StatusCode != http.StatusNoContent {
		t.Fatalf("logout: %v %v", resp, err)
	} else {
		_ = resp.Body.Close()
	}
	if resp := p.get("api/status", session); resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("after logout: %s", resp.Status)
	}
	// Each address takes its one method.
	if resp := p.get("api/login", nil); resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Allow") != "POST" {
		t.Fatalf("GET api/login: %s %v", resp.Status, resp.Header)
	}
	req, _ = http.NewRequest(http.MethodDelete, p.base+"api/status", nil)
	req.Header.Set("Authorization", "Bearer "+testToken)
	if resp, err := noRedirect.Do(req); err != nil || resp.StatusCode != http.StatusMethodNotAllowed {
		t.Fatalf("DELETE api/status: %v %v", resp, err)
	} else {
		_ = resp.Body.Close()
	}
	// A login form on another site cannot post JSON without asking first.
	req, _ = http.NewRequest(http.MethodPost, p.base+"api/login", strings.NewReader("token="+testToken))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if resp, err := noRedirect.Do(req); err != nil || resp.StatusCode != http.StatusUnsupportedMediaType {
		t.Fatalf("form login: %v %v", resp, err)
	} else {
		_ = resp.Body.Close()
	}
}

func (p *page) getURL(url string, header map[string]string) *http.Response {
	p.t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		p.t.Fatal(err)
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := noRedirect.Do(req)
	if err != nil {
		p.t.Fatal(err)
	}
	p.t.Cleanup(func() { _ = resp.Body.Close() })
	return resp
}

func (p *page) login(token string) *http.Response {
	p.t.Helper()
	body, _ := json.Marshal(map[string]string{"token": token})
	resp, err := noRedirect.Post(p.base+"api/login", "application/json", bytes.NewReader(body))
	if err != nil {
		p.t.Fatal(err)
	}
	p.t.Cleanup(func() { _ = resp.Body.Close() })
	return resp
}

// sse reads server-sent events from a live stream.
type sse struct {
	r *bufio.Reader
}

// next returns the next event's name and data.
func (s *sse) next() (string, []byte, error) {
	var name string
	var data []byte
	for {
		line, err := s.r.ReadBytes('\n')
		if err != nil {
			return "", nil, err
		}
		line = bytes.TrimRight(line, "\n")
		switch {
		case len(line) == 0 && name != "":
			return name, data, nil
		case bytes.HasPrefix(line, []byte("event: ")):
			name = string(line[len("event: "):])
		case bytes.HasPrefix(line, []byte("data: ")):
			data = append(data, line[len("data: "):]...)
		}
	}
}

// TestLiveStreamDelivers: the stream starts with the status and the
// timeline so far, then carries a failover published while it is open: the
// decision, and the status with the new holder and epoch.
func TestLiveStreamDelivers(t *testing.T) {
	p := startPage(t, statuspage.Config{})
	now := time.Now()
	p.putStatus(group("n1", 1, now))
	p.heartbeat("n1", map[string]events.CheckState{"ami": {TargetNode: "n1", Role: events.RoleSelf, Health: events.HealthUp, Since: now}})
	p.heartbeat("n2", map[string]events.CheckState{
		"ami":     {TargetNode: "n2", Role: events.RoleSelf, Health: events.HealthUp, Since: now},
		"peer-n1": {TargetNode: "n1", Role: events.RolePeer, Health: events.HealthUp, Since: now}})
	before, err := p.arb.Emit(context.Background(), events.ArbiterDecision{Group: "pbx", Action: events.ActionPlace, To: "n1",
		Reason: "first placement", CausedBy: []string{"0193a1b2-0000-7000-8000-000000000001"}}, events.WithEpoch(1))
	if err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, p.base+"api/events", nil)
	req.Header.Set("Authorization", "Bearer "+testToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" || resp.Header.Get("Cache-Control") != "no-store" {
		t.Fatalf("events: %s %v", resp.Status, resp.Header)
	}
	stream := &sse{r: bufio.NewReader(resp.Body)}
	var (
		snap    statuspage.Snapshot
		sawOld  bool
		dec     events.Envelope
		sawNew  bool
		newHold bool
	)
	for !(sawOld && sawNew && newHold) {
		name, data, err := stream.next()
		if err != nil {
			t.Fatalf("stream ended: %v (old %v, new %v, holder %v)", err, sawOld, sawNew, newHold)
		}
		switch name {
		case "status":
			if err := json.Unmarshal(data, &snap); err != nil {
				t.Fatal(err)
			}
			if len(snap.Groups) == 1 && snap.Groups[0].Status.Holder == "n2" && snap.Groups[0].Status.Epoch == 2 {
				newHold = true
			}
		case "event":
			var ev statuspage.EventView
			if err := json.Unmarshal(data, &ev); err != nil {
				t.Fatal(err)
			}
			if ev.ID == before.ID {
				sawOld = true
				// The failover is published once the stream has
				// delivered what was there before it.
				dec = p.failover(2)
			}
			if dec.ID != "" && ev.ID == dec.ID {
				if !ev.Decision || ev.Epoch != 2 || !strings.Contains(ev.Summary, "pbx FAILOVER n1->n2") || len(ev.Causes) != 1 {
					t.Fatalf("the failover as sent: %+v", ev)
				}
				sawNew = true
			}
		}
	}
	// The nodes come with their checks from every prober's heartbeat.
	g := snap.Groups[0]
	if g.Cluster != "lab" || len(g.Nodes) != 2 || g.Nodes[0].Name != "n1" || len(g.Nodes[0].Checks) != 2 || g.Nodes[0].LastHeard.IsZero() {
		t.Fatalf("nodes %+v", g.Nodes)
	}
	if c := g.Nodes[0].Checks[1]; c.Check != "peer-n1" || c.Prober != "n2" || c.Role != events.RolePeer {
		t.Fatalf("n1's peer check %+v", c)
	}
	if len(snap.Notes) != 2 || !strings.Contains(strings.Join(snap.Notes, "\n"), "pbx: holding n2: n1 is down (ami)") {
		t.Fatalf("situation lines %q", snap.Notes)
	}
}

// TestExplainShowsTheChain: the decision's causes, down to the probe
// evidence, as fanctl explain walks them; a bad id is 400, one the trail
// does not hold 404.
func TestExplainShowsTheChain(t *testing.T) {
	p := startPage(t, statuspage.Config{})
	dec := p.failover(3)
	resp := p.get("api/explain?id="+dec.ID, bearer(testToken))
	var got struct {
		Links []statuspage.LinkView `json:"links"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&got); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("explain: %s %v", resp.Status, err)
	}
	if len(got.Links) != 2 || got.Links[0].ID != dec.ID || got.Links[0].Event.Type != events.TypeArbiterDecision ||
		got.Links[1].Depth != 1 || got.Links[1].Event.Type != events.TypeHealthTransition || len(got.Links[1].Probes) != 1 ||
		got.Links[1].Probes[0].ErrorClass != events.ErrorRefused {
		t.Fatalf("chain %+v", got.Links)
	}
	if resp := p.get("api/explain?id=nope", bearer(testToken)); resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("bad id: %s", resp.Status)
	}
	if resp := p.get("api/explain?id=0193a1b2-0000-7000-8000-000000000001", bearer(testToken)); resp.StatusCode != http.StatusNotFound {
		t.Fatalf("unknown id: %s", resp.Status)
	}
}

// TestTokenFileChecks: no file, one anyone may read, and a short token are
// refused before the page serves, naming the key.
func TestTokenFileChecks(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string, mode os.FileMode) string {
		f := filepath.Join(dir, name)
		if err := os.WriteFile(f, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(f, mode); err != nil {
			t.Fatal(err)
		}
		return f
	}
	for name, file := range map[string]string{
		"none":          "",
		"missing":       filepath.Join(dir, "absent"),
		"world":         write("world", testToken, 0o644),
		"short":         write("short", "abc", 0o600),
		"inner spaces":  write("spaces", "a token with spaces inside", 0o600),
		"control chars": write("ctl", "token\x01token\x01token\x01", 0o600),
	} {
		_, err := statuspage.New(statuspage.Config{TokenFile: file}, "lab", nil)
		if err == nil || !strings.Contains(err.Error(), "serve.token_file") {
			t.Errorf("%s: %v", name, err)
		}
		if err != nil && strings.Contains(err.Error(), testToken) {
			t.Errorf("%s: the error quotes the token: %v", name, err)
		}
	}
	if _, err := statuspage.New(statuspage.Config{TokenFile: write("ok", fmt.Sprintf(" %s \n", testToken), 0o640)}, "lab", nil); err != nil {
		t.Fatalf("a good token file: %v", err)
	}
}
