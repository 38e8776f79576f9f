package check

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fanpbx/fan/lab/stack"
)

// Real peers for the check tests: Kamailio, SIPp and BIND from Debian, each
// on a free loopback port, each killed when its test ends.

// freePort finds a port free for both UDP and TCP on 127.0.0.1.
func freePort(t *testing.T) int {
	t.Helper()
	for range 20 {
		u, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := u.LocalAddr().(*net.UDPAddr).Port
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		u.Close()
		if err == nil {
			l.Close()
			return port
		}
	}
	t.Fatal("no free port")
	return 0
}

// proc is a started peer process.
type proc struct {
	cmd  *exec.Cmd
	out  *lockedBuffer
	done chan struct{} // closed once the process has exited
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func startProc(t *testing.T, argv ...string) *proc {
	t.Helper()
	cmd := exec.Command(argv[0], argv[1:]...)
	out := &lockedBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", argv[0], err)
	}
	p := &proc{cmd: cmd, out: out, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		// The group, so that Kamailio's children go too; SIGCONT first in
		// case a test left it stopped.
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGCONT)
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	})
	return p
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// signal sends sig to the whole process group (SIGSTOP freezes a peer: the
// kernel still accepts TCP connections, nothing answers).
func (p *proc) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	pgid := p.cmd.Process.Pid
	if err := syscall.Kill(-pgid, sig); err != nil {
		t.Fatal(err)
	}
	// kill returns before the stop takes effect: on a busy machine the
	// server could still answer one more probe. Wait until every thread of
	// the group is stopped (or running again, for SIGCONT).
	if sig != syscall.SIGSTOP && sig != syscall.SIGCONT {
		return
	}
	want := sig == syscall.SIGSTOP
	deadline := time.Now().Add(5 * time.Second)
	for groupStopped(pgid) != want {
		if time.Now().After(deadline) {
			t.Fatalf("process group %d: stopped=%v not reached", pgid, want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// groupStopped reports whether every thread of every process in the group
// is stopped (or already dead: a zombie answers nothing either).
func groupStopped(pgid int) bool {
	procs, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, statPath := range procs {
		b, err := os.ReadFile(statPath)
		if err != nil {
			continue
		}
		// Fields after the command name "(...)": state, ppid, pgrp.
		rest := string(b[strings.LastIndexByte(string(b), ')')+2:])
		f := strings.Fields(rest)
		if len(f) < 3 || f[2] != strconv.Itoa(pgid) {
			continue
		}
		tasks, _ := filepath.Glob(filepath.Join(filepath.Dir(statPath), "task", "*", "stat"))
		for _, tp := range tasks {
			tb, err := os.ReadFile(tp)
			if err != nil {
				continue
			}
			tf := strings.Fields(string(tb[strings.LastIndexByte(string(tb), ')')+2:]))
			if len(tf) == 0 || !strings.Contains("TtZX", tf[0]) {
				return false
			}
		}
	}
	return true
}

func need(t *testing.T, bin string) {
	t.Helper()
	if _, err := exec.LookPath(bin); err != nil {
		stack.SkipOrFail(t, bin+" is not installed (make deps)")
	}
}

// waitFor polls cond until it holds.
func waitFor(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, within)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// kamailioCfg answers OPTIONS 200 on its first port and 503 (Asterisk's
// answer while shutting down) on its second, over UDP and TCP.
const kamailioCfg = `#!KAMAILIO
children=2
auto_aliases=no
listen=udp:127.0.0.1:%[1]d
listen=tcp:127.0.0.1:%[1]d
listen=udp:127.0.0.1:%[2]d
tcp_accept_no_cl=yes
loadmodule "kex.so"
loadmodule "corex.so"
loadmodule "tm.so"
loadmodule "sl.so"
loadmodule "pv.so"
loadmodule "maxfwd.so"
loadmodule "textops.so"
request_route {
  if (!mf_process_maxfwd_header("10")) { sl_send_reply("483","Too Many Hops"); exit; }
  if ($Rp == %[2]d) { sl_send_reply("503","Shutting Down"); exit; }
  if (is_method("OPTIONS")) { append_to_reply("Server-Node: kam\r\n"); sl_send_reply("200","OK"); exit; }
  sl_send_reply("404","Not here"); exit;
}
`

// startKamailio returns the process and its "200" and "503" ports.
func startKamailio(t *testing.T) (*proc, int, int) {
	t.Helper()
	need(t, "kamailio")
	ok, busy := freePort(t), freePort(t)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "kamailio.cfg")
	if err := os.WriteFile(cfg, fmt.Appendf(nil, kamailioCfg, ok, busy), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("kamailio", "-c", "-f", cfg).CombinedOutput(); err != nil {
		t.Fatalf("kamailio -c: %v\n%s", err, out)
	}
	p := startProc(t, "kamailio", "-f", cfg, "-DD", "-E", "-Y", dir, "-P", filepath.Join(dir, "k.pid"), "-m", "32", "-M", "8")
	waitFor(t, 10*time.Second, "kamailio listening", func() bool {
		c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", ok))
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	return p, ok, busy
}

// sippUAS answers every OPTIONS the way Asterisk answers an unknown source:
// 401 with a digest challenge (facts/asterisk22.md).
const sippUAS = `<?xml version="1.0" encoding="ISO-8859-1" ?>
<scenario name="asterisk-like OPTIONS 401">
  <recv request="OPTIONS"/>
  <send><![CDATA[
SIP/2.0 401 Unauthorized
[last_Via:]
[last_Call-ID:]
[last_From:]
[last_To:];tag=[pid]SIPpTag01[call_number]
[last_CSeq:]
WWW-Authenticate: Digest realm="asterisk",nonce="1a2b3c",opaque="4d5e",algorithm=MD5,qop="auth"
Server: Asterisk PBX 22.10.1
Content-Length: 0

]]></send>
</scenario>
`

func startSIPp(t *testing.T) int {
	t.Helper()
	need(t, "sipp")
	port := freePort(t)
	sf := filepath.Join(t.TempDir(), "uas.xml")
	if err := os.WriteFile(sf, []byte(sippUAS), 0o644); err != nil {
		t.Fatal(err)
	}
	p := startProc(t, "sipp", "-sf", sf, "-i", "127.0.0.1", "-p", fmt.Sprint(port), "-nostdin", "-trace_err",
		"-error_file", filepath.Join(t.TempDir(), "err.log"), "-bind_local")
	waitFor(t, 10*time.Second, "sipp listening", func() bool {
		if p.exited() {
			t.Fatalf("sipp exited: %s", p.out)
		}
		b, _ := os.ReadFile("/proc/net/udp")
		return bytes.Contains(b, fmt.Appendf(nil, "0100007F:%04X", port))
	})
	return port
}

// startNamed runs BIND authoritative for voip.test on a free loopback port
// (configured as docs/bind.md says) and waits until it answers.
func startNamed(t *testing.T) (*proc, string) {
	t.Helper()
	need(t, "named")
	dir := t.TempDir()
	port := freePort(t)
	conf := fmt.Sprintf(`options {
    directory "%s";
    pid-file "named.pid";
    session-keyfile "session.key";
    listen-on port %d { 127.0.0.1; };
    listen-on-v6 { none; };
    recursion no;
    dnssec-validation no;
    notify no;
    allow-transfer { none; };
};
controls { };
zone "voip.test" { type primary; file "voip.test.zone"; };
`, dir, port)
	zone := `$TTL 60
@    IN SOA ns1.voip.test. hostmaster.voip.test. ( 1 3600 600 86400 30 )
     IN NS  ns1.voip.test.
ns1  IN A   127.0.0.1
sip 30 IN A 192.0.2.10
`
	if err := os.WriteFile(filepath.Join(dir, "named.conf"), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "voip.test.zone"), []byte(zone), 0o644); err != nil {
		t.Fatal(err)
	}
	argv := []string{"named", "-4", "-g", "-c", filepath.Join(dir, "named.conf")}
	p := startProc(t, argv...)
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	d, err := NewDNS(addr, "voip.test", "SOA", false)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 15*time.Second, "named answering", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		if p.exited() || strings.Contains(p.out.String(), "exiting (due to fatal error)") {
			t.Fatalf("named failed: %s", p.out)
		}
		return d.Run(ctx).OK
	})
	return p, addr
}
