package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/platform/bus"
)

// notifySocket is a real unix datagram socket standing in for systemd's.
type notifySocket struct {
	t    *testing.T
	conn *net.UnixConn
	Addr string
}

func listenNotify(t *testing.T, addr string) *notifySocket {
	t.Helper()
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: addr, Net: "unixgram"})
	if err != nil {
		t.Fatalf("listen %s: %v", addr, err)
	}
	t.Cleanup(func() { c.Close() })
	return &notifySocket{t: t, conn: c, Addr: addr}
}

// next returns the next datagram, failing the test if none comes.
func (n *notifySocket) next() string {
	n.t.Helper()
	buf := make([]byte, 4096)
	_ = n.conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	k, err := n.conn.Read(buf)
	if err != nil {
		n.t.Fatalf("no notification: %v", err)
	}
	return string(buf[:k])
}

func shortDir(t *testing.T) string {
	// sun_path holds 108 bytes; t.TempDir can be longer than that.
	d, err := os.MkdirTemp("", "fan-sd")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

func TestNotifierFromEnv(t *testing.T) {
	sock := listenNotify(t, filepath.Join(shortDir(t), "notify"))
	cases := []struct {
		name     string
		usec     string
		pid      string
		watchdog time.Duration
	}{
		{"no watchdog", "", "", 0},
		{"watchdog for us", "2000000", strconv.Itoa(os.Getpid()), 2 * time.Second},
		{"watchdog without pid", "500000", "", 500 * time.Millisecond},
		// Inherited from a parent the watchdog was meant for.
		{"watchdog for another pid", "2000000", "1", 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("NOTIFY_SOCKET", sock.Addr)
			t.Setenv("WATCHDOG_USEC", tc.usec)
			t.Setenv("WATCHDOG_PID", tc.pid)
			n, err := NotifierFromEnv()
			if err != nil {
				t.Fatal(err)
			}
			if !n.Enabled() || n.WatchdogInterval() != tc.watchdog {
				t.Fatalf("enabled %v watchdog %v, want true %v", n.Enabled(), n.WatchdogInterval(), tc.watchdog)
			}
			for _, k := range []string{"NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"} {
				if v, ok := os.LookupEnv(k); ok {
					t.Fatalf("%s=%q left in the environment for children", k, v)
				}
			}
			if err := n.Send(NotifyReady, "STATUS=hello"); err != nil {
				t.Fatal(err)
			}
			if got := sock.next(); got != "READY=1\nSTATUS=hello" {
				t.Fatalf("datagram %q", got)
			}
		})
	}
}

func TestNotifierAbstractSocket(t *testing.T) {
	addr := fmt.Sprintf("@fan-daemon-test-%d-%d", os.Getpid(), time.Now().UnixNano())
	sock := listenNotify(t, addr)
	t.Setenv("NOTIFY_SOCKET", addr)
	n, err := NotifierFromEnv()
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Send(NotifyStopping); err != nil {
		t.Fatal(err)
	}
	if got := sock.next(); got != NotifyStopping {
		t.Fatalf("datagram %q", got)
	}
}

func TestNotifierDisabled(t *testing.T) {
	t.Setenv("NOTIFY_SOCKET", "")
	n, err := NotifierFromEnv()
	if err != nil || n.Enabled() || n.WatchdogInterval() != 0 {
		t.Fatalf("enabled %v err %v", n.Enabled(), err)
	}
	if err := n.Send(NotifyReady); err != nil {
		t.Fatalf("disabled notifier must drop silently: %v", err)
	}
	t.Setenv("NOTIFY_SOCKET", "relative/path")
	if _, err := NotifierFromEnv(); err == nil {
		t.Fatal("relative NOTIFY_SOCKET accepted")
	}
	t.Setenv("NOTIFY_SOCKET", "/run/x")
	t.Setenv("WATCHDOG_USEC", "soon")
	if _, err := NotifierFromEnv(); err == nil {
		t.Fatal("malformed WATCHDOG_USEC accepted")
	}
}

// fakeClock lets the watchdog's staleness rule be driven exactly.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func TestWatchdogPingsOnlyWhileLoopsAreFresh(t *testing.T) {
	sock := listenNotify(t, filepath.Join(shortDir(t), "notify"))
	clk := &fakeClock{t: time.Unix(1000, 0)}
	sup := newSupervisor(&Notifier{addr: &net.UnixAddr{Name: sock.Addr, Net: "unixgram"}, watchdog: time.Second}, slog.New(slog.DiscardHandler))
	sup.now, sup.base = clk.now, clk.now()

	marker := func() {
		t.Helper()
		// Datagrams on one socket keep their order: if the marker is next,
		// nothing was sent before it.
		sup.send("STATUS=marker")
		if got := sock.next(); got != "STATUS=marker" {
			t.Fatalf("unexpected notification %q", got)
		}
	}

	// No loop registered yet (the bus is still connecting): the process is
	// alive and has nothing to prove.
	if !sup.watchdogTick() || sock.next() != NotifyWatchdog {
		t.Fatal("no ping without loops")
	}
	checks := sup.loop("checks", time.Second)
	beats := sup.loop("heartbeat", 3*time.Second)
	clk.add(900 * time.Millisecond)
	if !sup.watchdogTick() || sock.next() != NotifyWatchdog {
		t.Fatal("no ping while both loops are fresh")
	}

	clk.add(200 * time.Millisecond) // checks silent 1.1s > 1s
	beats.Alive()
	if sup.watchdogTick() {
		t.Fatal("pinged with a stale loop")
	}
	if got := sock.next(); got != "STATUS=watchdog withheld: silent loops checks" {
		t.Fatalf("stale report %q", got)
	}
	clk.add(10 * time.Second)
	if sup.watchdogTick() {
		t.Fatal("pinged with two stale loops")
	}
	if got := sock.next(); got != "STATUS=watchdog withheld: silent loops checks,heartbeat" {
		t.Fatalf("stale report %q", got)
	}
	if sup.watchdogTick() {
		t.Fatal("pinged with two stale loops")
	}
	marker() // the same stale set is reported once, not every tick

	st := sup.loopStatus()
	if len(st) != 2 || !st[0].Stale || st[0].Name != "checks" || st[0].SilentSeconds < 11 {
		t.Fatalf("status %+v", st)
	}

	checks.Alive()
	beats.Done() // ended on purpose: no longer expected to turn
	if !sup.watchdogTick() {
		t.Fatal("no ping after the loops recovered")
	}
	if got := sock.next(); got != "STATUS=running" {
		t.Fatalf("recovery report %q", got)
	}
	if got := sock.next(); got != NotifyWatchdog {
		t.Fatalf("after recovery %q", got)
	}
}

func TestRunWatchdogTicks(t *testing.T) {
	sock := listenNotify(t, filepath.Join(shortDir(t), "notify"))
	sup := newSupervisor(&Notifier{addr: &net.UnixAddr{Name: sock.Addr, Net: "unixgram"}, watchdog: 40 * time.Millisecond}, slog.New(slog.DiscardHandler))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { sup.runWatchdog(ctx); close(done) }()
	for range 3 {
		if got := sock.next(); got != NotifyWatchdog {
			t.Fatalf("got %q", got)
		}
	}
	cancel()
	<-done
}

func TestMicroVersion(t *testing.T) {
	for in, want := range map[string]string{
		"v1.2.3":                "1.2.3",
		"1.2.3-rc.1":            "1.2.3-rc.1",
		"v1.2.3-4-gabcdef0":     "1.2.3-4-gabcdef0",
		"cc39c56-dirty":         "0.0.0+cc39c56-dirty",
		"dev":                   "0.0.0+dev",
		"":                      "0.0.0",
		"v1.2.3-4-gabc0-dirty~": "0.0.0+v1-2-3-4-gabc0-dirty",
	} {
		if got := microVersion(in); got != want {
			t.Errorf("microVersion(%q) = %q, want %q", in, got, want)
		}
		if !semver.MatchString(microVersion(in)) {
			t.Errorf("microVersion(%q) is not semver", in)
		}
	}
}

func TestCommonRestartKeys(t *testing.T) {
	a := Common{Cluster: "lab", Node: "n1", HTTPListen: ":9100"}
	a.Bus.URL = "nats://a:4222"
	b := a
	if k := CommonRestartKeys(a, b); len(k) != 0 {
		t.Fatalf("identical: %v", k)
	}
	b.Bus.URL = "nats://b:4222"
	b.HTTPListen = ":9200"
	got := CommonRestartKeys(a, b)
	if fmt.Sprint(got) != "[bus http_listen]" {
		t.Fatalf("keys %v", got)
	}
	var rr *RestartRequired
	if err := error(&RestartRequired{Keys: got}); !errors.As(errors.Join(errors.New("x"), err), &rr) || rr.Error() != "restart needed to apply: bus, http_listen" {
		t.Fatalf("RestartRequired %v", err)
	}
}

func TestVersionLine(t *testing.T) {
	Commit = "0123456789ab"
	defer func() { Commit = "" }()
	got := VersionLine("fan-arbiter", "v0.1.0-3-g0123456")
	if !strings.HasPrefix(got, "fan-arbiter v0.1.0-3-g0123456 (commit 0123456789ab, go") || !strings.HasSuffix(got, runtime.GOOS+"/"+runtime.GOARCH+")") {
		t.Fatalf("VersionLine = %q", got)
	}
	Commit = ""
	if got := VersionLine("fan-prober", "dev"); !strings.Contains(got, "(commit unknown,") {
		t.Fatalf("without a commit: %q", got)
	}
}

// TestCommonRefusesMissingBusFiles: every credential and certificate the
// bus section names must be there; the error names the key.
func TestCommonRefusesMissingBusFiles(t *testing.T) {
	dir := t.TempDir()
	seed := writeUserSeed(t, dir, "svc.nk")
	certPath, keyPath := writeCertPair(t, dir, "svc", time.Now().Add(365*24*time.Hour))
	base := func() Common {
		return Common{Cluster: "lab", Node: "n1"}
	}
	c := base()
	c.Bus.URL, c.Bus.NKeySeed = "nats://127.0.0.1:4222", seed
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if err := c.CheckFiles(); err != nil {
		t.Fatalf("present seed refused: %v", err)
	}
	for key, set := range map[string]func(*Common, string){
		"bus.nkey_seed":        func(c *Common, p string) { c.Bus.NKeySeed = p },
		"bus.creds":            func(c *Common, p string) { c.Bus.Creds = p },
		"bus.tls.ca":           func(c *Common, p string) { c.Bus.TLS.CA = p },
		"bus.tls.cert":         func(c *Common, p string) { c.Bus.TLS.Cert, c.Bus.TLS.Key = p, keyPath },
		"bus.tls.key":          func(c *Common, p string) { c.Bus.TLS.Cert, c.Bus.TLS.Key = certPath, p },
		"bus.system.nkey_seed": func(c *Common, p string) { c.Bus.System = &bus.SystemAccount{NKeySeed: p} },
	} {
		c := base()
		c.Bus.URL = "nats://127.0.0.1:4222"
		missing := filepath.Join(dir, "missing-"+key)
		set(&c, missing)
		if err := c.Validate(); err != nil {
			t.Fatalf("%s: %v", key, err)
		}
		err := c.CheckFiles()
		if err == nil || !hasLine(err, key+": "+missing+": no such file") {
			t.Errorf("%s missing: %v", key, err)
		}
	}
}
