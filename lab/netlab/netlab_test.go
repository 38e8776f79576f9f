package netlab

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/platform/waittest"
	"github.com/fanpbx/fan/pkg/sipoptions"
	"github.com/vishvananda/netns"
)

func requireRoot(t *testing.T, tools ...string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root for network namespaces")
	}
	for _, tool := range append([]string{"ip"}, tools...) {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("needs %s: %v", tool, err)
		}
	}
}

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(b), "\n"))
	return len(b), nil
}

// newLab builds a lab whose Close runs pass or fail; on failure the logs of procs are
// printed first, since Close removes them.
func newLab(t *testing.T, procs *[]*Proc) *Lab {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := Build(ctx, Spec{Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := l.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	t.Cleanup(func() {
		if t.Failed() && procs != nil {
			for _, p := range *procs {
				t.Logf("--- %s on %s (%s) ---\n%s", p.Name, p.Host, p.LogPath, p.Tail(4096))
			}
		}
	})
	return l
}

func rootLinks(t *testing.T) []string {
	t.Helper()
	out, err := exec.Command("ip", "-j", "link", "show").Output()
	if err != nil {
		t.Fatal(err)
	}
	var links []struct {
		Name string `json:"ifname"`
	}
	if err := json.Unmarshal(out, &links); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, l := range links {
		names = append(names, l.Name)
	}
	return names
}

func namespacesWith(t *testing.T, prefix string) []string {
	t.Helper()
	ents, err := os.ReadDir(netnsDir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), prefix+"-") {
			out = append(out, e.Name())
		}
	}
	return out
}

// alive treats zombies as dead: the container's init may never reap orphans.
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || !strings.HasPrefix(strings.TrimSpace(s[i+1:]), "Z")
}

func TestBuildTopologyAndClose(t *testing.T) {
	requireRoot(t)
	before := rootLinks(t)
	start := time.Now()
	l := newLab(t, nil)
	t.Logf("build took %v", time.Since(start))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	if !prefixRE.MatchString(l.Prefix()) || len(l.Hosts()) != 4 || len(l.Nodes()) != 2 {
		t.Fatalf("prefix %q, hosts %v", l.Prefix(), l.Hosts())
	}
	if after := rootLinks(t); strings.Join(after, ",") != strings.Join(before, ",") {
		t.Errorf("root namespace links changed: %v -> %v", before, after)
	}
	for _, h := range l.Hosts() {
		if len(h.Port) > 15 || len(h.NS) == 0 || h.MAC == "" {
			t.Errorf("host %+v", h)
		}
		mac, err := ifMAC(ctx, h.NS, hostIf)
		if err != nil || mac != h.MAC {
			t.Errorf("%s eth0 MAC %q (%v), Host says %q", h.Name, mac, err, h.MAC)
		}
		want := "0"
		if h.Role == RoleNode {
			want = "1"
		}
		for _, fam := range []string{"ipv4", "ipv6"} {
			out, err := l.Exec(ctx, h.Name, "cat", "/proc/sys/net/"+fam+"/ip_nonlocal_bind")
			if err != nil || strings.TrimSpace(string(out)) != want {
				t.Errorf("%s %s ip_nonlocal_bind = %q (%v), want %s", h.Name, fam, out, err, want)
			}
		}
		out, err := l.Exec(ctx, h.Name, "ip", "-br", "addr", "show", "dev", "eth0")
		if err != nil || !strings.Contains(string(out), h.Addr.String()) || !strings.Contains(string(out), "UP") {
			t.Errorf("%s eth0: %q (%v)", h.Name, out, err)
		}
	}
	out, err := runIP(ctx, "-n", l.LANNS(), "-br", "link", "show", "master", bridgeName)
	if err != nil || strings.Count(string(out), portPrefix) != 4 {
		t.Errorf("bridge ports in %s: %q (%v)", l.LANNS(), out, err)
	}
	if _, err := os.Stat(markerPath(l.Prefix())); err != nil {
		t.Errorf("marker: %v", err)
	}

	// Do: the socket made inside fn stays in ctl's namespace after fn returns, and the
	// caller's thread is never moved.
	origNS, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer origNS.Close()
	ctlAddr := l.byName[ControlHost].Addr.Addr()
	var srv *net.UDPConn
	err = l.Do(ControlHost, func() error {
		var err error
		srv, err = net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(ctlAddr, 0)))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	var cli *net.UDPConn
	if err := l.Do(ClientHost, func() error {
		var err error
		cli, err = net.DialUDP("udp", nil, srv.LocalAddr().(*net.UDPAddr))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	if _, err := cli.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	_ = srv.SetReadDeadline(time.Now().Add(2 * time.Second))
	buf := make([]byte, 16)
	n, from, err := srv.ReadFromUDPAddrPort(buf)
	if err != nil || string(buf[:n]) != "hello" || from.Addr() != l.byName[ClientHost].Addr.Addr() {
		t.Fatalf("ctl socket got %q from %s (%v)", buf[:n], from, err)
	}
	if cur, err := netns.Get(); err != nil || !cur.Equal(origNS) {
		t.Errorf("caller thread namespace changed")
	} else {
		cur.Close()
	}
	if err := l.Do("nope", func() error { return nil }); err == nil {
		t.Error("Do on unknown host succeeded")
	}
	sentinel := errors.New("from fn")
	if err := l.Do(ClientHost, func() error { return sentinel }); !errors.Is(err, sentinel) {
		t.Errorf("Do error = %v", err)
	}

	// Close is idempotent and safe to race (a signal handler and a deferred Close).
	errc := make(chan error, 3)
	for range 3 {
		go func() { errc <- l.Close() }()
	}
	for range 3 {
		if err := <-errc; err != nil {
			t.Fatalf("close: %v", err)
		}
	}
	if left := namespacesWith(t, l.Prefix()); len(left) > 0 {
		t.Errorf("namespaces left after Close: %v", left)
	}
	if _, err := os.Stat(l.Dir()); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("temp dir left: %v", err)
	}
	if _, err := os.Stat(markerPath(l.Prefix())); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("marker left: %v", err)
	}
	if _, err := l.Start(ClientHost, "late", []string{"true"}, nil); err == nil {
		t.Error("Start after Close succeeded")
	}
}

func TestBuildRejectsUnsafeAddresses(t *testing.T) {
	for _, spec := range []Spec{
		{FloatingIP: netip.MustParsePrefix("10.0.0.10/24")},
		{Nodes: []HostSpec{{Name: "n1", Addr: netip.MustParsePrefix("192.168.1.1/24")}}},
		{Client: HostSpec{Name: "c", Addr: netip.MustParsePrefix("127.0.0.2/8")}},
		{Nodes: []HostSpec{{Name: "averylonghostname", Addr: netip.MustParsePrefix("192.0.2.1/24")}}},
		{Prefix: "foo1"},
	} {
		if _, err := normalise(&spec); err == nil {
			t.Errorf("spec %+v accepted", spec)
		}
	}
}

func pingUntil(t *testing.T, p *sipoptions.Pinger, node string, within time.Duration) sipoptions.Reply {
	t.Helper()
	var r sipoptions.Reply
	waittest.Succeeds(t, within, "a 200 from "+node, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		var err error
		r, err = p.Ping(ctx)
		if err == nil && r.Status == 200 && r.ServerNode == node {
			return nil
		}
		return fmt.Errorf("last reply %+v, err %v", r, err)
	})
	return r
}

// TestHotStandbyFailover walks the scenario fan's e2e test and benchmark rely on: two
// Kamailio nodes bound to the floating IP, the address moving between them, a cut link
// and a killed node, all observed from the client namespace.
func TestHotStandbyFailover(t *testing.T) {
	requireRoot(t, "kamailio")
	t0 := time.Now()
	var procs []*Proc
	l := newLab(t, &procs)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	fip := l.FloatingIP()

	for _, n := range []string{"n1", "n2"} {
		ks := time.Now()
		k, err := l.StartKamailio(n, n, fip.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		procs = append(procs, k)
		t.Logf("kamailio on %s ready in %v", n, time.Since(ks))
	}
	if err := l.AddrAdd(ctx, "n1", fip); err != nil {
		t.Fatal(err)
	}
	var p *sipoptions.Pinger
	if err := l.Do(ClientHost, func() error {
		var err error
		p, err = sipoptions.NewPinger(netip.AddrPortFrom(fip.Addr(), SIPPort).String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if got, want := p.LocalAddr().Addr(), l.byName[ClientHost].Addr.Addr(); got != want {
		t.Fatalf("pinger local address %s, want the client's %s", got, want)
	}

	r := pingUntil(t, p, "n1", 3*time.Second)
	t.Logf("n1 answered in %v", r.RTT)
	if mac, state, err := l.Neigh(ClientHost, fip.Addr()); err != nil || mac != l.MAC("n1") {
		t.Fatalf("client neigh for %s = %q %q (%v), want n1 %s", fip.Addr(), mac, state, err, l.MAC("n1"))
	}

	// Move the address; the flush stands in for the gratuitous ARP a mover sends.
	if err := l.AddrDel(ctx, "n1", fip); err != nil {
		t.Fatal(err)
	}
	if err := l.AddrAdd(ctx, "n2", fip); err != nil {
		t.Fatal(err)
	}
	if err := l.FlushNeigh(ClientHost); err != nil {
		t.Fatal(err)
	}
	if mac, _, err := l.Neigh(ClientHost, fip.Addr()); err != nil || mac != "" {
		t.Fatalf("neigh after flush = %q (%v)", mac, err)
	}
	pingUntil(t, p, "n2", 3*time.Second)
	if mac, state, err := l.Neigh(ClientHost, fip.Addr()); err != nil || mac != l.MAC("n2") {
		t.Fatalf("client neigh after move = %q %q (%v), want n2 %s", mac, state, err, l.MAC("n2"))
	}

	if err := l.LinkDown("n2"); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		pctx, pcancel := context.WithTimeout(ctx, 150*time.Millisecond)
		r, err := p.Ping(pctx)
		pcancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("ping %d with n2's link down: %+v, %v; want timeout", i, r, err)
		}
	}
	if err := l.LinkUp("n2"); err != nil {
		t.Fatal(err)
	}
	pingUntil(t, p, "n2", 3*time.Second)

	k1 := procs[0]
	pids, err := l.PIDs("n1")
	if err != nil || len(pids) < 2 || !containsInt(pids, k1.Pid()) {
		t.Fatalf("n1 pids %v (%v), want kamailio %d and its children", pids, err, k1.Pid())
	}
	n, err := l.KillAll("n1")
	if err != nil || n != len(pids) {
		t.Fatalf("KillAll(n1) killed %d of %v: %v", n, pids, err)
	}
	select {
	case <-k1.Done():
	case <-time.After(2 * time.Second):
		t.Fatal("kamailio on n1 survived KillAll")
	}
	if left, _ := l.PIDs("n1"); len(left) != 0 {
		t.Fatalf("n1 still runs %v", left)
	}
	if err := k1.Stop(); err != nil {
		t.Errorf("Stop after KillAll: %v", err)
	}

	// Everything still running in the lab must be gone after Close.
	var all []int
	for _, h := range l.Hosts() {
		ps, err := l.PIDs(h.Name)
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, ps...)
	}
	if len(all) == 0 {
		t.Fatal("expected n2's kamailio to be running before Close")
	}
	cs := time.Now()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	t.Logf("close took %v", time.Since(cs))
	for _, pid := range all {
		if alive(pid) {
			t.Errorf("pid %d survived Close", pid)
		}
	}
	if !procs[1].Exited() {
		t.Error("n2's kamailio Proc not reaped after Close")
	}
	out, err := exec.Command("ip", "netns", "list").CombinedOutput()
	if err != nil || strings.Contains(string(out), l.Prefix()) {
		t.Errorf("ip netns list after Close: %q (%v)", out, err)
	}
	t.Logf("whole scenario took %v", time.Since(t0))
}

func containsInt(s []int, v int) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

func TestProcStopAndLogs(t *testing.T) {
	requireRoot(t)
	l := newLab(t, nil)
	// The shell ignores SIGTERM, so Stop has to escalate; its child sleep shares the
	// process group and must die too.
	p, err := l.Start("n1", "stubborn", []string{"sh", "-c", `trap "" TERM; echo started; sleep 30 & wait`}, []string{"FAN_X=1"})
	if err != nil {
		t.Fatal(err)
	}
	waittest.Until(t, 3*time.Second, "output in "+p.LogPath, func() bool { return strings.Contains(p.Tail(100), "started") })
	pids, _ := l.PIDs("n1")
	if len(pids) != 2 {
		t.Fatalf("n1 pids %v, want sh and sleep", pids)
	}
	l.stopTimeout = 200 * time.Millisecond
	p.stopTimeout = 200 * time.Millisecond
	start := time.Now()
	if err := p.Stop(); err != nil {
		t.Fatal(err)
	}
	if el := time.Since(start); el < 200*time.Millisecond || el > 3*time.Second {
		t.Errorf("Stop took %v, want SIGTERM grace then SIGKILL", el)
	}
	var ee *exec.ExitError
	if err := p.Wait(); !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Errorf("Wait = %v, want killed by SIGKILL", err)
	}
	for _, pid := range pids {
		if alive(pid) {
			t.Errorf("pid %d survived Stop", pid)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	out, err := l.Exec(ctx, "n1", "sh", "-c", "echo $FAN_X; exit 3")
	if err == nil || !strings.Contains(err.Error(), "exit status 3") {
		t.Errorf("Exec error = %v (output %q)", err, out)
	}
	if _, err := l.StartKamailio("n1", "bad node", "198.51.100.10"); err == nil {
		t.Error("StartKamailio accepted a node name that would break the config")
	}
}

// TestSweepRemovesCrashedLab kills a helper process that owns a lab (no Close runs) and
// checks that Sweep removes its namespaces, its orphaned processes, temp dir and marker.
func TestSweepRemovesCrashedLab(t *testing.T) {
	requireRoot(t)
	if os.Getenv("FAN_NETLAB_HELPER") == "1" {
		t.Skip("helper mode")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestSweepHelper$", "-test.count=1")
	cmd.Env = append(os.Environ(), "FAN_NETLAB_HELPER=1")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var prefix, dir string
	var orphan int
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		if _, err := fmt.Sscanf(sc.Text(), "LAB %s %s %d", &prefix, &dir, &orphan); err == nil {
			break
		}
	}
	// The helper's namespaces must be swept even if this test fails below.
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		_, _ = Sweep(nil)
	})
	if prefix == "" {
		t.Fatal("helper printed no lab")
	}
	if removed, err := Sweep(testLogger(t)); err != nil || len(namespacesWith(t, prefix)) == 0 {
		t.Fatalf("sweep touched a live owner's lab: removed %v, err %v", removed, err)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	if !alive(orphan) {
		t.Fatalf("orphan %d did not outlive its owner; the test proves nothing", orphan)
	}
	removed, err := Sweep(testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	// Another test binary's Build may sweep the same leftovers first, so only check that
	// what this Sweep removed of that lab is among its namespaces.
	var ours int
	for _, ns := range removed {
		if strings.HasPrefix(ns, prefix+"-") {
			ours++
		}
	}
	if ours > 5 {
		t.Errorf("removed %v, more than the 5 namespaces of %s", removed, prefix)
	}
	t.Logf("sweep removed %d of %s's namespaces: %v", ours, prefix, removed)
	if left := namespacesWith(t, prefix); len(left) > 0 {
		t.Errorf("left %v", left)
	}
	if alive(orphan) {
		t.Errorf("orphan %d survived Sweep", orphan)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("temp dir %s: %v", dir, err)
	}
	if _, err := os.Stat(markerPath(prefix)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("marker: %v", err)
	}
}

// TestSweepHelper is the lab-owning child process of TestSweepRemovesCrashedLab and
// TestCloseOnSignal.
func TestSweepHelper(t *testing.T) {
	if os.Getenv("FAN_NETLAB_HELPER") != "1" {
		t.Skip("run as a child by TestSweepRemovesCrashedLab and TestCloseOnSignal")
	}
	l, err := Build(context.Background(), Spec{})
	if err != nil {
		t.Fatal(err)
	}
	if os.Getenv("FAN_NETLAB_SIGNAL") == "1" {
		l.CloseOnSignal()
	}
	// Backgrounded by the shell, the sleep is re-parented and no longer tied to us: the
	// kind of process a crash leaves behind.
	out, err := l.Exec(context.Background(), "n1", "sh", "-c", "sleep 60 >/dev/null 2>&1 & echo $!")
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("LAB %s %s %s\n", l.Prefix(), l.Dir(), strings.TrimSpace(string(out)))
	os.Stdout.Sync()
	select {}
}

// TestCloseOnSignal sends SIGTERM to a helper that owns a lab: the lab must be gone with
// no Sweep, and the helper must still die of the signal.
func TestCloseOnSignal(t *testing.T) {
	requireRoot(t)
	if os.Getenv("FAN_NETLAB_HELPER") == "1" {
		t.Skip("helper mode")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestSweepHelper$", "-test.count=1")
	cmd.Env = append(os.Environ(), "FAN_NETLAB_HELPER=1", "FAN_NETLAB_SIGNAL=1")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		_, _ = Sweep(nil)
	})
	var prefix, dir string
	var orphan int
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		if _, err := fmt.Sscanf(sc.Text(), "LAB %s %s %d", &prefix, &dir, &orphan); err == nil {
			break
		}
	}
	if prefix == "" {
		t.Fatal("helper printed no lab")
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	err = cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGTERM {
		t.Errorf("helper exit = %v, want death by SIGTERM", err)
	}
	if left := namespacesWith(t, prefix); len(left) > 0 {
		t.Errorf("namespaces left after SIGTERM: %v", left)
	}
	if alive(orphan) {
		t.Errorf("orphan %d survived", orphan)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("temp dir %s: %v", dir, err)
	}
}

func TestMarkerPaths(t *testing.T) {
	if got := markerPath("fan0a1b"); got != filepath.Join(MarkerDir, "fan0a1b.json") {
		t.Fatal(got)
	}
	if !nsNameRE.MatchString("fan0a1b-ctl") || nsNameRE.MatchString("fanx-ctl") || nsNameRE.MatchString("fan0a1b") {
		t.Fatal("nsNameRE")
	}
}
