package main

import (
	"bufio"
	"bytes"
	"context"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fanpbx/fan/lab/amipeer"
	"github.com/fanpbx/fan/pkg/platform/logtest"
)

// TestServeAndCtl runs the program in-process: serve, steer it with the ctl
// form over the unix socket, then stop it as SIGTERM would (ctx cancel).
func TestServeAndCtl(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "peer.sock")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ready := make(chan *amipeer.Peer, 1)
	done := make(chan error, 1)
	var logs logtest.Buffer
	go func() {
		done <- run(ctx, []string{"-listen", "127.0.0.1:0", "-user", "u", "-secret", "pw", "-control", sock, "-channels", "3", "-calls", "1"},
			&bytes.Buffer{}, &logs, func(p *amipeer.Peer) { ready <- p })
	}()
	var p *amipeer.Peer
	select {
	case p = <-ready:
	case err := <-done:
		t.Fatalf("run ended early: %v", err)
	case <-time.After(5 * time.Second):
		t.Fatal("peer did not start")
	}

	ctl := func(args ...string) string {
		t.Helper()
		var out bytes.Buffer
		if err := run(ctx, append([]string{"ctl", "-control", sock}, args...), &out, &bytes.Buffer{}, nil); err != nil {
			t.Fatalf("ctl %v: %v", args, err)
		}
		return out.String()
	}
	if out := ctl("status"); !strings.Contains(out, `"channels":3`) || !strings.Contains(out, `"mode":"normal"`) {
		t.Errorf("status: %q", out)
	}
	if out := ctl("slow", "500ms"); out != "ok mode slow 500ms\n" {
		t.Errorf("slow: %q", out)
	}
	if out := ctl("dead"); out != "ok mode dead\n" {
		t.Errorf("dead: %q", out)
	}
	if _, err := net.DialTimeout("tcp", p.Addr(), time.Second); err == nil {
		t.Error("dial succeeded while dead")
	}
	ctl("normal")
	c, err := net.DialTimeout("tcp", p.Addr(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	if line, err := bufio.NewReader(c).ReadString('\n'); err != nil || line != "Asterisk Call Manager/11.0.0\r\n" {
		t.Errorf("banner %q, %v", line, err)
	}
	if err := run(ctx, []string{"ctl", "-control", sock, "bogus"}, &bytes.Buffer{}, &bytes.Buffer{}, nil); err == nil {
		t.Error("ctl bogus succeeded")
	}

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("run did not stop on cancel")
	}
	if !strings.Contains(logs.String(), "amipeer closed") {
		t.Errorf("no clean-stop log line in %q", logs.String())
	}
}

func TestFlags(t *testing.T) {
	if err := run(context.Background(), []string{"-listen", "127.0.0.1:0"}, &bytes.Buffer{}, &bytes.Buffer{}, nil); err == nil {
		t.Error("started without -secret")
	}
	if err := run(context.Background(), []string{"ctl", "status"}, &bytes.Buffer{}, &bytes.Buffer{}, nil); err == nil {
		t.Error("ctl without -control succeeded")
	}
}
