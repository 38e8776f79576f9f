// Package kamtest runs real Kamailio proxies and UASes and SIPp for tests of
// the dispatcher executor (the same harness as the dispatcher package's own
// tests): the UAS logs a marker line per INVITE, which is what "calls reach
// node X" counts.
package kamtest

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// SkipOrFail skips when a prerequisite is missing locally but fails under CI,
// where a missing Kamailio or SIPp means a broken image.
func SkipOrFail(t testing.TB, why string) {
	t.Helper()
	if os.Getenv("CI") != "" {
		t.Fatalf("prerequisite missing under CI: %s", why)
	}
	t.Skip(why)
}

// Need skips (fails under CI) unless every binary is installed.
func Need(t testing.TB, bins ...string) {
	t.Helper()
	for _, b := range bins {
		if _, err := exec.LookPath(b); err != nil {
			SkipOrFail(t, fmt.Sprintf("%s is not installed (apt-get install kamailio sip-tester)", b))
		}
	}
}

// events records, with arrival times, the marker lines a Kamailio's script
// logs ("FANTEST <METHOD> node=<name>"), and lets a test wait on counts.
type Events struct {
	mu      sync.Mutex
	changed chan struct{}
	at      map[string][]time.Time // key "INVITE a"
	log     strings.Builder
}

func NewEvents() *Events { return &Events{changed: make(chan struct{}), at: map[string][]time.Time{}} }

func (e *Events) consume(r io.Reader) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		now := time.Now()
		e.mu.Lock()
		if e.log.Len() < 1<<20 {
			e.log.WriteString(line + "\n")
		}
		if _, rest, ok := strings.Cut(line, "FANTEST "); ok {
			if method, node, ok := strings.Cut(strings.TrimSpace(rest), " node="); ok {
				k := method + " " + node
				e.at[k] = append(e.at[k], now)
				close(e.changed)
				e.changed = make(chan struct{})
			}
		}
		e.mu.Unlock()
	}
}

func (e *Events) Count(key string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.at[key])
}

func (e *Events) Times(key string) []time.Time {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]time.Time(nil), e.at[key]...)
}

// waitFor waits until cond holds over the counts, or fails after d.
func (e *Events) WaitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.After(d)
	for {
		e.mu.Lock()
		ch := e.changed
		e.mu.Unlock()
		if cond() {
			return
		}
		select {
		case <-ch:
		case <-deadline:
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
	}
}

func (e *Events) String() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.log.String()
}

// freePort returns a loopback port free for both UDP and TCP: the proxy
// listens on both (SIP over UDP, JSON-RPC over HTTP on TCP).
func FreePort(t testing.TB) int {
	t.Helper()
	for range 20 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		u, err := net.ListenPacket("udp", fmt.Sprintf("127.0.0.1:%d", port))
		l.Close()
		if err == nil {
			u.Close()
			return port
		}
	}
	t.Fatal("no free loopback port")
	return 0
}

const modules = `loadmodule "kex.so"
loadmodule "corex.so"
loadmodule "tm.so"
loadmodule "sl.so"
loadmodule "pv.so"
loadmodule "maxfwd.so"
loadmodule "siputils.so"
loadmodule "textops.so"
loadmodule "xlog.so"
`

// UASConfig answers INVITE with 200 and a header naming the node, answers
// OPTIONS probes, and logs a marker line for each, which is what the tests
// count: "calls reaching A" is measured at A.
func UASConfig(name string, port int) string {
	return fmt.Sprintf(`#!KAMAILIO
children=1
auto_aliases=no
listen=udp:127.0.0.1:%[2]d
%[3]s
request_route {
	if (is_method("INVITE")) {
		xlog("L_ALERT", "FANTEST INVITE node=%[1]s\n");
		append_to_reply("X-Node: %[1]s\r\n");
		sl_send_reply("200", "OK");
		exit;
	}
	if (is_method("OPTIONS")) {
		xlog("L_ALERT", "FANTEST OPTIONS node=%[1]s\n");
		sl_send_reply("200", "OK");
		exit;
	}
	if (is_method("ACK")) { exit; }
	sl_send_reply("200", "OK");
}
`, name, port, modules)
}

// ProxyConfig dispatches INVITEs round-robin (algorithm 4) over set 1, probes
// destinations every second (ds_probing_mode=1, so "i" would be overridden but
// "d" sticks), and serves JSON-RPC on the same port over TCP. ACK and BYE of
// SIPp's built-in uac come back to the proxy (no Record-Route, no Contact from
// the UAS) and are absorbed here.
func ProxyConfig(port int, listFile string) string {
	return fmt.Sprintf(`#!KAMAILIO
children=2
auto_aliases=no
listen=udp:127.0.0.1:%[1]d
listen=tcp:127.0.0.1:%[1]d
tcp_accept_no_cl=yes
%[3]s
loadmodule "xhttp.so"
loadmodule "jsonrpcs.so"
loadmodule "dispatcher.so"
modparam("jsonrpcs", "transport", 1)
modparam("tm", "fr_timer", 1000)
modparam("dispatcher", "list_file", "%[2]s")
modparam("dispatcher", "ds_ping_interval", 1)
modparam("dispatcher", "ds_probing_mode", 1)
modparam("dispatcher", "ds_ping_reply_codes", "class=2")
modparam("dispatcher", "reload_delta", 2)
request_route {
	if (!mf_process_maxfwd_header("10")) { sl_send_reply("483", "Too Many Hops"); exit; }
	if (is_method("ACK")) { if (t_check_trans()) { t_relay(); } exit; }
	if (is_method("BYE")) { sl_send_reply("200", "OK"); exit; }
	if (is_method("INVITE")) {
		if (!ds_select_dst("1", "4")) { sl_send_reply("503", "No destination"); exit; }
		t_relay();
		exit;
	}
	sl_send_reply("404", "Not here");
}
event_route[xhttp:request] {
	if ($hu =~ "^/RPC") { jsonrpc_dispatch(); exit; }
	xhttp_reply("404", "Not Found", "text/plain", "");
}
`, port, listFile, modules)
}

// Start runs one Kamailio in its own process group (it forks
// children) and kills that whole group when the test ends.
func Start(t testing.TB, name, cfg string) *Events {
	t.Helper()
	dir := t.TempDir()
	path := filepath.Join(dir, name+".cfg")
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	ev := NewEvents()
	cmd := exec.Command("kamailio", "-f", path, "-DD", "-E", "-Y", dir, "-P", filepath.Join(dir, "pid"), "-m", "32", "-M", "4")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		t.Fatalf("start kamailio %s: %v", name, err)
	}
	done := make(chan struct{})
	go func() { ev.consume(pr); close(done) }()
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); pw.Close(); close(exited) }()
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(5 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-exited
		}
		// Children may outlive the main process briefly; make sure none is left.
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
		if t.Failed() {
			t.Logf("kamailio %s output:\n%s", name, ev.String())
		}
	})
	return ev
}

// sipp places n calls through the proxy with SIPp's built-in uac scenario.
// It reports failures as an error, never t.Fatal, because tests also run it
// from a goroutine.
func SIPp(ctx context.Context, t testing.TB, proxyPort, n, rate int) error {
	u, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	port := u.LocalAddr().(*net.UDPAddr).Port
	u.Close()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "sipp", "-sn", "uac", "-s", "fan", "-nostdin",
		"-i", "127.0.0.1", "-p", fmt.Sprint(port), "-m", fmt.Sprint(n), "-r", fmt.Sprint(rate),
		"-timeout", "20s", "-timeout_error", "-trace_err", "-error_file", filepath.Join(t.TempDir(), "err.log"),
		fmt.Sprintf("127.0.0.1:%d", proxyPort))
	cmd.Dir = t.TempDir()
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("sipp -m %d: %w\n%s", n, err, lastLines(string(out), 30))
	}
	return nil
}

func FreeUDPPort(t testing.TB) int {
	t.Helper()
	u, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	return u.LocalAddr().(*net.UDPAddr).Port
}

func lastLines(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
