package daemon_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/platform/bus/bustest"
	"github.com/fanpbx/fan/pkg/platform/config"
	"github.com/fanpbx/fan/pkg/platform/daemon"
)

// The process tests re-run this test binary as a fan daemon (TestMain), so
// that signals and $NOTIFY_SOCKET are exercised on a real separate process,
// the way systemd drives a service.
const childEnv = "FAN_DAEMON_TEST_CHILD"

func TestMain(m *testing.M) {
	switch os.Getenv(childEnv) {
	case "reloader":
		os.Exit(daemon.Run(os.Args[1:], "fan-testsvc", "v0.1.0", "", buildChild(true)))
	case "plain":
		os.Exit(daemon.Run(os.Args[1:], "fan-testsvc", "v0.1.0", "", buildChild(false)))
	}
	os.Exit(m.Run())
}

type childConfig struct {
	daemon.Common `yaml:",inline"`
	// Beat says whether the service's main loop turns: a stuck loop is
	// simulated by reloading with beat: false.
	Beat bool `yaml:"beat"`
}

func (c *childConfig) Validate() error { return c.Common.Validate() }

type childSvc struct {
	log     *slog.Logger
	path    string
	cfg     childConfig
	beating atomic.Bool
}

type reloadingSvc struct{ *childSvc }

func buildChild(reload bool) daemon.Builder {
	return func(o daemon.Options) (daemon.Service, error) {
		s := &childSvc{path: o.ConfigPath, log: o.Logger}
		if err := config.Load(o.ConfigPath, &s.cfg); err != nil {
			return nil, err
		}
		s.beating.Store(s.cfg.Beat)
		if reload {
			return reloadingSvc{s}, nil
		}
		return s, nil
	}
}

func (s *childSvc) Run(ctx context.Context) error {
	return daemon.Serve(ctx, s.cfg.Common, "testsvc", "v0.1.0", s.log, func(ctx context.Context, rt *daemon.Runtime) error {
		lp := rt.Loop("work", 300*time.Millisecond)
		defer lp.Done()
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return nil
			case <-t.C:
				if s.beating.Load() {
					lp.Alive()
				}
			}
		}
	})
}

func (s reloadingSvc) Reload(context.Context) error {
	var next childConfig
	if err := config.Load(s.path, &next); err != nil {
		return err
	}
	s.beating.Store(next.Beat) // the one live key
	if keys := daemon.CommonRestartKeys(s.cfg.Common, next.Common); len(keys) > 0 {
		return &daemon.RestartRequired{Keys: keys}
	}
	return nil
}

// child is a running fan daemon with its notifications and log lines.
type child struct {
	t      *testing.T
	cmd    *exec.Cmd
	cfg    string
	notify chan string
	logs   chan map[string]any
	exited chan error
}

func startChild(t *testing.T, mode, busURL string) *child {
	t.Helper()
	dir, err := os.MkdirTemp("", "fan-d") // short: sun_path is 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sockPath := filepath.Join(dir, "notify")
	sock, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sockPath, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sock.Close() })
	c := &child{t: t, cfg: filepath.Join(dir, "svc.yaml"), notify: make(chan string, 1024), logs: make(chan map[string]any, 1024), exited: make(chan error, 1)}
	c.writeConfig("n1", busURL, true)

	c.cmd = exec.Command(os.Args[0], "-config", c.cfg)
	c.cmd.Env = append(os.Environ(), childEnv+"="+mode, "NOTIFY_SOCKET="+sockPath, "WATCHDOG_USEC=200000")
	stderr, err := c.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if c.cmd.ProcessState == nil {
			_ = c.cmd.Process.Kill()
			<-c.exited
		}
	})
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := sock.Read(buf)
			if err != nil {
				return
			}
			c.notify <- string(buf[:n])
		}
	}()
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			var m map[string]any
			if json.Unmarshal(sc.Bytes(), &m) == nil {
				c.logs <- m
			}
		}
		c.exited <- c.cmd.Wait()
	}()
	return c
}

func (c *child) writeConfig(node, busURL string, beat bool) {
	c.t.Helper()
	y := fmt.Sprintf("cluster: lab\nnode: %s\nbus:\n  url: %s\nbeat: %v\n", node, busURL, beat)
	if err := os.WriteFile(c.cfg, []byte(y), 0o600); err != nil {
		c.t.Fatal(err)
	}
}

func (c *child) signal(s syscall.Signal) {
	c.t.Helper()
	if err := c.cmd.Process.Signal(s); err != nil {
		c.t.Fatal(err)
	}
}

// waitNotify returns the notifications up to and including the first one
// that equals want, failing if it does not come.
func (c *child) waitNotify(want string) []string {
	c.t.Helper()
	var seen []string
	deadline := time.After(15 * time.Second)
	for {
		select {
		case m := <-c.notify:
			seen = append(seen, m)
			if m == want {
				return seen
			}
		case <-deadline:
			c.t.Fatalf("no notification %q; saw %q", want, seen)
		}
	}
}

// waitLog returns the first log line whose msg starts with prefix.
func (c *child) waitLog(prefix string) map[string]any {
	c.t.Helper()
	deadline := time.After(15 * time.Second)
	for {
		select {
		case m := <-c.logs:
			if msg, _ := m["msg"].(string); strings.HasPrefix(msg, prefix) {
				return m
			}
		case <-deadline:
			c.t.Fatalf("no log line %q", prefix)
		}
	}
}

func (c *child) waitExit() int {
	c.t.Helper()
	select {
	case err := <-c.exited:
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return ee.ExitCode()
		}
		if err != nil {
			c.t.Fatal(err)
		}
		return 0
	case <-time.After(20 * time.Second):
		c.t.Fatal("daemon did not exit")
		return -1
	}
}

func TestProcessNotifiesWatchdogAndReloads(t *testing.T) {
	s := bustest.Server(t)
	c := startChild(t, "reloader", s.ClientURL())

	c.waitNotify("READY=1\nSTATUS=running")
	c.waitNotify(daemon.NotifyWatchdog)

	// The main loop stops turning (a reload that sets beat: false stands
	// in for a deadlock): the watchdog must be withheld, then resume when
	// the loop turns again.
	c.writeConfig("n1", s.ClientURL(), false)
	c.signal(syscall.SIGHUP)
	c.waitNotify(daemon.NotifyReloading)
	c.waitNotify(daemon.NotifyReady)
	if m := c.waitLog("SIGHUP: configuration reloaded"); m["config"] != c.cfg {
		t.Fatalf("reload log %v", m)
	}
	c.waitNotify("STATUS=watchdog withheld: silent loops work")
	c.writeConfig("n1", s.ClientURL(), true)
	c.signal(syscall.SIGHUP)
	withheld := c.waitNotify("STATUS=running")
	for _, m := range withheld {
		if m == daemon.NotifyWatchdog {
			t.Fatalf("watchdog pinged while the loop was silent: %q", withheld)
		}
	}
	c.waitNotify(daemon.NotifyWatchdog)

	// A key only a restart applies: reported by name, process keeps running.
	c.writeConfig("n2", s.ClientURL(), true)
	c.signal(syscall.SIGHUP)
	m := c.waitLog("SIGHUP: safe keys reloaded; restart needed")
	if fmt.Sprint(m["restart_keys"]) != "[node]" || m["restart_needed"] != true {
		t.Fatalf("restart log %v", m)
	}
	c.waitNotify(daemon.NotifyWatchdog)

	c.signal(syscall.SIGTERM)
	c.waitNotify("STOPPING=1\nSTATUS=stopping")
	if code := c.waitExit(); code != 0 {
		t.Fatalf("exit %d", code)
	}
}

func TestProcessWithoutReloaderSurvivesSIGHUP(t *testing.T) {
	s := bustest.Server(t)
	c := startChild(t, "plain", s.ClientURL())
	c.waitNotify("READY=1\nSTATUS=running")

	c.signal(syscall.SIGHUP)
	if m := c.waitLog("SIGHUP: this service cannot reload; restart needed"); m["restart_needed"] != true {
		t.Fatalf("log %v", m)
	}
	// The operator broke the file: told now, not at the next restart.
	if err := os.WriteFile(c.cfg, []byte("cluster: lab\nnode: n1\nfall: 3\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c.signal(syscall.SIGHUP)
	m := c.waitLog("SIGHUP: this service cannot reload and the configuration file is invalid")
	if !strings.Contains(fmt.Sprint(m["err"]), "fall") {
		t.Fatalf("log %v", m)
	}
	// Still running on the old configuration.
	c.waitNotify(daemon.NotifyWatchdog)
	c.signal(syscall.SIGTERM)
	if code := c.waitExit(); code != 0 {
		t.Fatalf("exit %d", code)
	}
}
