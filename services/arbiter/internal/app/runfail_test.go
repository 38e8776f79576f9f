package app

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/config"
	"github.com/fanpbx/fan/pkg/platform/waittest"
	"github.com/fanpbx/fan/services/arbiter/internal/notify"
	"github.com/nats-io/nats-server/v2/server"
)

// runPatience bounds a Run that is meant to fail while it starts. It is far
// above what starting and failing takes on a loaded machine, so a Run that
// returns only when its context ends was waiting for something the failure
// should already have stopped (presence, the steward, the usage report).
const runPatience = 30 * time.Second

// runFailing runs svc under a context that ends after runPatience and
// returns its error. It fails the test when Run returned nothing, or only
// because its context ended, or left behind a goroutine that it started.
func runFailing(t *testing.T, svc *Service) error {
	t.Helper()
	before := ownGoroutines()
	ctx, cancel := context.WithTimeout(context.Background(), runPatience)
	defer cancel()
	start := time.Now()
	err := svc.Run(ctx)
	took := time.Since(start)
	if ctx.Err() != nil {
		t.Fatalf("Run returned after %v, when its context had ended (%v), with %v: it waited for what the failure should have stopped",
			took.Round(time.Millisecond), ctx.Err(), err)
	}
	if err == nil {
		t.Fatalf("Run returned nil after %v, want the start's failure", took.Round(time.Millisecond))
	}
	t.Logf("Run failed after %v: %v", took.Round(time.Millisecond), err)
	// The NATS client's and the runtime's goroutines end a moment after
	// their Close: wait for them rather than look once.
	waittest.Succeeds(t, 10*time.Second, "the goroutines Run started to end", func() error {
		return leftSince(before)
	})
	return err
}

// ownGoroutines are the goroutines whose stacks pass through fan's code or
// the NATS client (whose symbols escape the dot in nats.go), by id, the
// caller's aside. The embedded server's own are left out: its streams'
// goroutines outlive any client by design.
func ownGoroutines() map[string]string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	out := map[string]string{}
	for i, g := range strings.Split(string(buf), "\n\n") {
		if i == 0 || !strings.Contains(g, "github.com/fanpbx/fan/") && !strings.Contains(g, "github.com/nats-io/nats%2ego.") {
			continue
		}
		id, _, _ := strings.Cut(strings.TrimPrefix(g, "goroutine "), " ")
		out[id] = g
	}
	return out
}

// leftSince names the goroutines running now that were not in before
// (the stacks of the first few).
func leftSince(before map[string]string) error {
	var left []string
	for id, g := range ownGoroutines() {
		if _, ok := before[id]; !ok {
			left = append(left, g)
		}
	}
	if len(left) == 0 {
		return nil
	}
	slices.Sort(left)
	return fmt.Errorf("%d still running:\n%s", len(left), strings.Join(left[:min(len(left), 4)], "\n\n"))
}

// withSystemAccount has the arbiter open the system account's connection
// too: the one thing it acquires that closing the runtime's bus does not
// release. The test server has no accounts, so any user is let in.
func withSystemAccount(cfg *Config) {
	cfg.Bus.System = &bus.SystemAccount{User: "sys", Password: "sys"}
}

// systemConnClosed waits until the server has seen node's system account
// connection, and closed it (the server keeps closed connections a while).
func systemConnClosed(t *testing.T, s *server.Server, node string) {
	t.Helper()
	name := "fan-arbiter-" + node + "-system"
	waittest.Succeeds(t, 10*time.Second, "the system account's connection closed", func() error {
		cz, err := s.Connz(&server.ConnzOptions{State: server.ConnAll})
		if err != nil {
			return err
		}
		var seen, open int
		for _, c := range cz.Conns {
			if c.Name == name {
				seen++
				if c.Stop == nil {
					open++
				}
			}
		}
		if seen == 0 || open > 0 {
			return fmt.Errorf("%d connections named %s, %d of them open", seen, name, open)
		}
		return nil
	})
}

// An HTTP heartbeat endpoint whose address is taken fails Run at once with
// the key and the listen error, and leaves nothing of the arbiter running:
// the arbiter was built (its system account connection open) when the
// endpoint failed, and is closed.
func TestRunFailsAtOnceWhenTheHeartbeatAddressIsTaken(t *testing.T) {
	l := newLab(t, "n1")
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	cfg := l.cfg("ctl")
	cfg.HTTPHeartbeat = HTTPHeartbeatConfig{Listen: taken.Addr().String(), Token: testToken, Nodes: []string{"legacy1"}}
	withSystemAccount(&cfg)
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	svc, err := New(cfg, testLogger("ctl"), "test")
	if err != nil {
		t.Fatal(err)
	}
	err = runFailing(t, svc)
	if !errors.Is(err, syscall.EADDRINUSE) || !strings.HasPrefix(err.Error(), "http_heartbeat.listen: ") ||
		!strings.Contains(err.Error(), taken.Addr().String()) {
		t.Fatalf("error %q: want http_heartbeat.listen wrapping EADDRINUSE and naming %s", err, taken.Addr())
	}
	systemConnClosed(t, l.s, "ctl")
}

// A notify webhook whose secret cannot be used (validation does not read
// files: only the notifier's construction does) fails Run at once with the
// hook's key. By then newArbiter holds presence subscriptions and the
// system account's connection: it lets them go before returning.
func TestRunFailsAtOnceWhenANotifySecretIsRefused(t *testing.T) {
	dir := t.TempDir()
	short := filepath.Join(dir, "short")
	if err := os.WriteFile(short, []byte("too short\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct{ secret, want string }{
		"missing": {filepath.Join(dir, "missing"), "no such file or directory"},
		"short":   {short, "a secret of at least"},
	} {
		t.Run(name, func(t *testing.T) {
			l := newLab(t, "n1")
			cfg := l.cfg("ctl")
			withSystemAccount(&cfg)
			cfg.Notify = notify.Config{Hooks: []notify.HookConfig{{Name: "receiver",
				Webhook: &notify.WebhookConfig{URL: "http://127.0.0.1:9/fan", SecretFile: tc.secret}}}}
			if err := cfg.Validate(); err != nil {
				t.Fatal(err)
			}
			svc, err := New(cfg, testLogger("ctl"), "test")
			if err != nil {
				t.Fatal(err)
			}
			err = runFailing(t, svc)
			var fe *config.FieldError
			if !errors.As(err, &fe) || fe.Key != "notify.hooks[0].webhook.secret_file" ||
				!strings.Contains(err.Error(), tc.secret) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q: want the hook's secret_file key, %s and %q", err, tc.secret, tc.want)
			}
			systemConnClosed(t, l.s, "ctl")
		})
	}
}

// What a constructor acquired is released last first: a later step may
// depend on an earlier one (a subscription on a connection).
func TestUndoRunsLastFirst(t *testing.T) {
	var rel undo
	var order []int
	for i := range 3 {
		rel.add(func() { order = append(order, i) })
	}
	rel.run()
	if !slices.Equal(order, []int{2, 1, 0}) {
		t.Fatalf("released in order %v, want [2 1 0]", order)
	}
}
