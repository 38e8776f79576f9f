package bustest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/platform/natsserver"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// memberEnv carries the configuration of the member a re-executed test
// binary runs (see RunMemberIfAsked).
const memberEnv = "FAN_BUSTEST_MEMBER"

// RunMemberIfAsked must be the first call of TestMain in a package that uses
// CrashCluster: when the test binary was started as a cluster member, it
// runs that member's nats-server until it is killed and never returns.
func RunMemberIfAsked() {
	spec := os.Getenv(memberEnv)
	if spec == "" {
		return
	}
	var e natsserver.Config
	if err := json.Unmarshal([]byte(spec), &e); err != nil {
		fmt.Fprintln(os.Stderr, "bustest member:", err)
		os.Exit(2)
	}
	if _, err := natsserver.Start(e, slog.New(slog.DiscardHandler)); err != nil {
		fmt.Fprintln(os.Stderr, "bustest member:", err)
		os.Exit(1)
	}
	select {} // until killed
}

// CrashCluster is a JetStream cluster on loopback whose members run in
// processes of their own (the test binary, re-executed), so that Kill is a
// real SIGKILL: no shutdown announcement reaches the other members, which
// must notice the loss themselves, as after a host's crash. A server shut
// down in-process announces itself, and the survivors mark it offline at
// once, which hides what a crash costs.
type CrashCluster struct {
	t     testing.TB
	specs map[string]natsserver.Config
	Names []string
	mu    sync.Mutex
	procs map[string]*exec.Cmd
}

// NewCrashCluster starts len(names) members (the package's TestMain must
// call RunMemberIfAsked) and returns once each of them reaches a JetStream
// meta leader. They are killed when the test ends.
func NewCrashCluster(t testing.TB, names ...string) *CrashCluster {
	t.Helper()
	c := &CrashCluster{t: t, specs: memberSpecs(t, t.TempDir(), names), Names: names, procs: map[string]*exec.Cmd{}}
	t.Cleanup(func() {
		for _, n := range c.Names {
			c.Kill(n)
		}
	})
	for _, n := range names {
		if err := c.start(n); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.WaitMetaLeader(60 * time.Second); err != nil {
		t.Fatal(err)
	}
	return c
}

func (c *CrashCluster) start(name string) error {
	spec, err := json.Marshal(c.specs[name])
	if err != nil {
		return fmt.Errorf("member %s: %w", name, err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), memberEnv+"="+string(spec))
	cmd.Stderr = os.Stderr
	// A member outlives no test binary that dies without its cleanup.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("member %s: %w", name, err)
	}
	c.mu.Lock()
	c.procs[name] = cmd
	c.mu.Unlock()
	return nil
}

// URL lists every member's client address, in the order of names given
// (all members, in order, when none are).
func (c *CrashCluster) URL(names ...string) string { return clusterURL(c.specs, c.Names, names) }

// Kill ends a member with SIGKILL, as a crash would; its store stays for
// Restart. Killing a member that is not running does nothing.
func (c *CrashCluster) Kill(name string) {
	c.mu.Lock()
	cmd := c.procs[name]
	delete(c.procs, name)
	c.mu.Unlock()
	if cmd != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}
}

// Restart starts a killed member again on its addresses and store.
func (c *CrashCluster) Restart(name string) {
	c.t.Helper()
	if err := c.start(name); err != nil {
		c.t.Fatal(err)
	}
}

// WaitMetaLeader waits until every running member answers a JetStream API
// request, which needs a meta leader it can reach.
func (c *CrashCluster) WaitMetaLeader(within time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	c.mu.Lock()
	var running []string
	for n := range c.procs {
		running = append(running, n)
	}
	c.mu.Unlock()
	var errs []error
	for _, n := range running {
		if err := waitJetStream(ctx, c.URL(n)); err != nil {
			errs = append(errs, fmt.Errorf("member %s: %w", n, err))
		}
	}
	return errors.Join(errs...)
}

func waitJetStream(ctx context.Context, url string) error {
	var last error
	for ctx.Err() == nil {
		last = func() error {
			nc, err := nats.Connect(url, nats.Timeout(time.Second))
			if err != nil {
				return err
			}
			defer nc.Close()
			js, err := jetstream.New(nc)
			if err != nil {
				return err
			}
			actx, cancel := context.WithTimeout(ctx, 2*time.Second)
			defer cancel()
			_, err = js.AccountInfo(actx)
			return err
		}()
		if last == nil {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("no JetStream meta leader reached: %w", last)
}
