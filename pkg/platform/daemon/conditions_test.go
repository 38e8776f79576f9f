package daemon_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/platform/bus/bustest"
	"github.com/fanpbx/fan/pkg/platform/daemon"
)

// TestConditionsContract: a raised condition makes /healthz answer 503
// naming it with its reason, shows on /metrics as fan_condition 1 and in
// the status; cleared, /healthz is 200 again and the metric stays at 0.
func TestConditionsContract(t *testing.T) {
	s := bustest.Server(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	rt, addr := startRuntime(t, ctx, s.ClientURL(), "arbiter", "ctl")
	defer rt.Close(ctx)
	get := func(path string) (int, string) {
		t.Helper()
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	rt.Conditions.Declare("state_unwritable")
	if code, body := get("/healthz"); code != 200 {
		t.Fatalf("healthz %d %s", code, body)
	}
	if _, m := get("/metrics"); !strings.Contains(m, `fan_condition{name="state_unwritable"} 0`) {
		t.Fatalf("declared condition missing from metrics:\n%s", grepLines(m, "fan_condition"))
	}

	rt.Conditions.Raise("restore_failed", "read arbiter state: no responders")
	rt.Conditions.Raise("bus_isolated", "no peer heard for 3s")
	code, body := get("/healthz")
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "restore_failed (read arbiter state: no responders)") ||
		!strings.Contains(body, "bus_isolated") {
		t.Fatalf("healthz %d %q", code, body)
	}
	_, m := get("/metrics")
	for _, want := range []string{`fan_condition{name="restore_failed"} 1`, `fan_condition{name="bus_isolated"} 1`, `fan_condition{name="state_unwritable"} 0`} {
		if !strings.Contains(m, want) {
			t.Fatalf("metrics lack %q:\n%s", want, grepLines(m, "fan_condition"))
		}
	}
	if st := rt.Status(); st.Healthy || len(st.Conditions) != 2 || st.Conditions[0].Name != "bus_isolated" {
		t.Fatalf("status %+v", st)
	}

	// Raising again keeps the first time: the age is how long it lasted.
	since := rt.Conditions.Raised()[1].Since
	rt.Conditions.Raise("restore_failed", "decode arbiter state: bad json")
	if r := rt.Conditions.Raised()[1]; !r.Since.Equal(since) || r.Reason != "decode arbiter state: bad json" {
		t.Fatalf("re-raised %+v, since %v", r, since)
	}

	rt.Conditions.Clear("restore_failed")
	rt.Conditions.Set("bus_isolated", false, "")
	if code, body := get("/healthz"); code != 200 {
		t.Fatalf("after clearing: healthz %d %s", code, body)
	}
	if _, m := get("/metrics"); !strings.Contains(m, `fan_condition{name="restore_failed"} 0`) {
		t.Fatalf("cleared condition not 0:\n%s", grepLines(m, "fan_condition"))
	}
	if !rt.Status().Healthy {
		t.Fatal("status unhealthy after clearing")
	}
}

func TestConditionsNilAndNames(t *testing.T) {
	var c *daemon.Conditions
	c.Raise("restore_failed", "x") // a component built without a runtime
	c.Clear("restore_failed")
	if c.Is("restore_failed") || c.Raised() != nil {
		t.Fatal("nil conditions reported something")
	}
	defer func() {
		if recover() == nil {
			t.Fatal("a name that is not snake_case was accepted")
		}
	}()
	daemon.NewConditions(slog.New(slog.DiscardHandler)).Raise("Restore Failed", "x")
}

// TestGroupContract: an essential goroutine that returns while the service
// runs, with or without an error, ends the others and the group, and Run
// turns that into a non-zero exit; a stop signal ends it cleanly.
func TestGroupContract(t *testing.T) {
	t.Run("early return ends the group", func(t *testing.T) {
		g, ctx := daemon.NewGroup(context.Background())
		otherSaw := make(chan struct{})
		g.Go("watch", func(ctx context.Context) error { <-ctx.Done(); close(otherSaw); return ctx.Err() })
		g.Go("registry", func(context.Context) error { return nil })
		err := g.Wait()
		if !errors.Is(err, daemon.ErrEssentialExited) || !strings.Contains(err.Error(), "registry") {
			t.Fatalf("Wait = %v", err)
		}
		<-otherSaw
		if ctx.Err() == nil {
			t.Fatal("group context still open")
		}
	})
	t.Run("error is kept", func(t *testing.T) {
		g, _ := daemon.NewGroup(context.Background())
		boom := errors.New("consumer deleted")
		g.Go("commands", func(context.Context) error { return boom })
		g.Go("loop", func(ctx context.Context) error { <-ctx.Done(); return errors.New("later, ignored") })
		if err := g.Wait(); !errors.Is(err, boom) || !strings.Contains(err.Error(), "commands") {
			t.Fatalf("Wait = %v", err)
		}
	})
	t.Run("Fail from outside", func(t *testing.T) {
		g, _ := daemon.NewGroup(context.Background())
		g.Go("loop", func(ctx context.Context) error { <-ctx.Done(); return nil })
		g.Fail(errors.New("cannot restore for 10s"))
		if err := g.Wait(); err == nil || err.Error() != "cannot restore for 10s" {
			t.Fatalf("Wait = %v", err)
		}
	})
	t.Run("stop is clean", func(t *testing.T) {
		parent, cancel := context.WithCancel(context.Background())
		g, _ := daemon.NewGroup(parent)
		g.Go("a", func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() })
		g.Go("b", func(ctx context.Context) error { <-ctx.Done(); return nil })
		cancel()
		if err := g.Wait(); err != nil {
			t.Fatalf("Wait after stop = %v", err)
		}
	})
	t.Run("non-zero exit", func(t *testing.T) {
		build := func(daemon.Options) (daemon.Service, error) {
			return svcFunc(func(ctx context.Context) error {
				g, _ := daemon.NewGroup(ctx)
				g.Go("watch", func(context.Context) error { return nil })
				return g.Wait()
			}), nil
		}
		if got := daemon.Run(nil, "fan-test", "t", "/nonexistent", build); got != 1 {
			t.Fatalf("exit %d, want 1", got)
		}
	})
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
