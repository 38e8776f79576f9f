package answer

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fanpbx/fan/lab/amipeer"
	"github.com/fanpbx/fan/lab/netlab/netlabtest"
	"github.com/fanpbx/fan/pkg/ami"
	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/sipoptions"
)

// fakeSystemctl puts a script named systemctl in a directory of its own
// that records its arguments and behaves as body says.
func fakeSystemctl(t *testing.T, body string) (path, argsFile string) {
	t.Helper()
	dir := t.TempDir()
	argsFile = filepath.Join(dir, "args")
	path = filepath.Join(dir, "systemctl")
	script := "#!/bin/sh\nprintf '%s\\n' \"$@\" > " + argsFile + "\n" + body + "\n"
	if err := os.WriteFile(path, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return path, argsFile
}

func TestRestartRunsSystemctl(t *testing.T) {
	path, argsFile := fakeSystemctl(t, "exit 0")
	s := Systemctl{Path: path, Unit: "asterisk.service"}
	if err := (Answerer{Restart: &s}).Answer(t.Context(), events.AnswerRestart, nil); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(argsFile)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := strings.Fields(string(b)), []string{"restart", "--no-ask-password", "--", "asterisk.service"}; strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("systemctl called with %q, want %q", got, want)
	}
}

// The fake found through PATH, as on a real node where Path is empty.
func TestRestartFailureCarriesOutput(t *testing.T) {
	path, _ := fakeSystemctl(t, "echo 'Job for asterisk.service failed because the control process exited with error code.' >&2; exit 1")
	t.Setenv("PATH", filepath.Dir(path)+":"+os.Getenv("PATH"))
	err := Systemctl{Unit: "asterisk.service"}.Restart(t.Context())
	if err == nil || !strings.Contains(err.Error(), "control process exited") || !strings.Contains(err.Error(), "exit status 1") {
		t.Fatalf("Restart = %v; want the exit status and systemctl's message", err)
	}
}

func TestRestartDeadline(t *testing.T) {
	path, _ := fakeSystemctl(t, "exec sleep 30")
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := Systemctl{Path: path, Unit: "asterisk.service"}.Restart(ctx)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Restart past its deadline = %v, want DeadlineExceeded", err)
	}
	if time.Since(start) > 10*time.Second {
		t.Fatalf("Restart waited %v for a killed systemctl", time.Since(start))
	}
}

func TestRestartMissingBinary(t *testing.T) {
	err := Systemctl{Path: filepath.Join(t.TempDir(), "nope"), Unit: "asterisk.service"}.Restart(t.Context())
	if err == nil {
		t.Fatal("missing systemctl was not an error")
	}
}

func TestUnconfiguredModes(t *testing.T) {
	for _, m := range []events.AnswerMode{events.AnswerReload, events.AnswerRestart, "telepathy"} {
		if err := (Answerer{}).Answer(t.Context(), m, []string{"res_pjsip.so"}); !errors.Is(err, ErrNotConfigured) {
			t.Errorf("mode %s without configuration: %v", m, err)
		}
	}
	if err := (Answerer{}).Answer(t.Context(), events.AnswerHot, nil); err != nil {
		t.Errorf("hot: %v", err)
	}
}

// Reload against the AMI peer that follows docs/asterisk22.md: Success is
// success, and a Response: Error (a failing Asterisk) is a failure.
func TestReloadOverAMI(t *testing.T) {
	peer, err := amipeer.Start(amipeer.Config{Username: "fan", Secret: "s3cret"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { peer.Close() })
	sess := ami.NewSession(ami.Config{Addr: peer.Addr(), Username: "fan", Secret: "s3cret"}, nil)
	t.Cleanup(func() { sess.Close() })
	a := Answerer{Reload: sess}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if err := a.Answer(ctx, events.AnswerReload, []string{"res_pjsip.so"}); err != nil {
		t.Fatalf("reload on a healthy peer: %v", err)
	}
	if err := a.Answer(ctx, events.AnswerReload, []string{"res_nothing.so"}); err == nil {
		t.Fatal("reload of an unknown module succeeded")
	}
	if err := peer.SetMode(amipeer.ModeFailing); err != nil {
		t.Fatal(err)
	}
	err = a.Answer(ctx, events.AnswerReload, []string{"res_pjsip.so"})
	var ae *ami.ActionError
	if !errors.As(err, &ae) {
		t.Fatalf("reload on a failing peer = %v, want an ami.ActionError", err)
	}
}

// sipResponder answers OPTIONS with 200 after dropping the first drop requests.
func sipResponder(t *testing.T, drop int) string {
	t.Helper()
	c, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	go netlabtest.ServeOPTIONS(c, drop)
	return c.LocalAddr().String()
}

func TestVerifyRetriesUntilAnswered(t *testing.T) {
	p, err := sipoptions.NewPinger(sipResponder(t, 2))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	r, n, err := Verify(ctx, p, 100*time.Millisecond)
	if err != nil || r.Status != 200 || n != 3 {
		t.Fatalf("Verify = %+v after %d attempts, %v; want 200 on the third", r, n, err)
	}
}

func TestVerifyGivesUpAtDeadline(t *testing.T) {
	p, err := sipoptions.NewPinger(sipResponder(t, 1<<30))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	if _, n, err := Verify(ctx, p, 100*time.Millisecond); !errors.Is(err, context.DeadlineExceeded) || n < 2 {
		t.Fatalf("Verify against silence = %v after %d attempts; want DeadlineExceeded after retries", err, n)
	}
}
