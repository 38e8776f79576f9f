package amipeer

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fanpbx/fan/lab/ctlsock"
)

func TestControlSocket(t *testing.T) {
	p := startPeer(t, Config{})
	path := filepath.Join(t.TempDir(), "ctl.sock")
	cs, err := ListenControl(p, path, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ctl := func(args ...string) string {
		t.Helper()
		out, err := ctlsock.Call(ctx, path, args...)
		if err != nil {
			t.Fatalf("ctl %v: %v", args, err)
		}
		return out
	}

	for _, m := range []string{"frozen", "failing", "dead", "normal"} {
		if out := ctl(m); out != "ok mode "+m+"\n" {
			t.Errorf("ctl %s: %q", m, out)
		}
		if p.Mode() != Mode(m) {
			t.Errorf("after ctl %s mode is %s", m, p.Mode())
		}
	}
	if out := ctl("slow", "250ms"); out != "ok mode slow 250ms\n" || p.Mode() != ModeSlow {
		t.Errorf("ctl slow: %q, mode %s", out, p.Mode())
	}
	if out := ctl("channels", "5", "2"); out != "ok channels 5 calls 2 processed 0\n" {
		t.Errorf("ctl channels: %q", out)
	}
	// The channels are the peer's own, in its channel list as in its count.
	countChannels := func() (listed, counted int) {
		p.mu.Lock()
		defer p.mu.Unlock()
		return len(p.book.channels), p.liveFiguresLocked().Channels
	}
	if listed, counted := countChannels(); listed != 5 || counted != 5 {
		t.Errorf("after ctl channels 5: %d channels listed, %d counted", listed, counted)
	}

	r := dialRaw(t, p.Addr())
	r.login()
	var st Status
	if err := json.Unmarshal([]byte(ctl("status")), &st); err != nil {
		t.Fatal(err)
	}
	if st.Mode != ModeSlow || st.Figures.Channels != 5 || st.Figures.Calls != 2 || st.Sessions != 1 || st.Addr != p.Addr() || st.SlowDelay != "250ms" {
		t.Errorf("status: %+v", st)
	}
	if out := ctl("channels", "1", "0"); out != "ok channels 1 calls 0 processed 0\n" {
		t.Errorf("ctl channels: %q", out)
	}
	if listed, counted := countChannels(); listed != 1 || counted != 1 {
		t.Errorf("after ctl channels 1: %d channels listed, %d counted", listed, counted)
	}
	lines := strings.Split(strings.TrimSpace(ctl("actions")), "\n")
	var a Action
	if len(lines) != 1 || json.Unmarshal([]byte(lines[0]), &a) != nil || a.Name != "Login" {
		t.Errorf("actions: %q", lines)
	}

	for _, bad := range [][]string{{"explode"}, {"slow", "soon"}, {"channels", "1"}, {"normal", "now"}} {
		if out, err := ctlsock.Call(ctx, path, bad...); err == nil {
			t.Errorf("ctl %v accepted: %q", bad, out)
		}
	}
	if err := cs.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := ctlsock.Call(ctx, path, "status"); err == nil {
		t.Error("control socket still answers after Close")
	}
}
