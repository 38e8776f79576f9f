package app

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fanpbx/fan/lab/amipeer"
	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/bus/bustest"
)

// BenchmarkProber200Checks measures what the prober costs: the real
// fan-prober binary, built here, runs 200 checks at 200 ms intervals (50 AMI
// sessions, 50 SIP over UDP, 25 SIP over TCP, 25 TCP, 50 HTTP) against peers
// in this process, publishing to an embedded JetStream. Only the prober's
// process is measured, from /proc: CPU share of one core over a 10 s window
// after every check is up, and resident memory at its end.
//
//	go test -run '^$' -bench Prober200 -benchtime 1x ./internal/app
func BenchmarkProber200Checks(b *testing.B) {
	const interval, window = 200 * time.Millisecond, 10 * time.Second
	dir := b.TempDir()
	bin := filepath.Join(dir, "fan-prober")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/fanpbx/fan/services/prober/cmd/fan-prober").CombinedOutput(); err != nil {
		b.Fatalf("build fan-prober: %v\n%s", err, out)
	}
	peer, err := amipeer.Start(amipeer.Config{Username: "fan", Secret: "s"})
	if err != nil {
		b.Fatal(err)
	}
	defer peer.Close()
	udp := benchSIPUDP(b)
	tcpSIP := benchSIPTCP(b)
	web := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, "ok") }))
	defer web.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()

	s := bustest.Server(b)
	var cfg strings.Builder
	fmt.Fprintf(&cfg, "cluster: bench\nnode: n1\nbus:\n  url: %s\nheartbeat_interval: 2s\nchecks:\n", s.ClientURL())
	add := func(n int, kind, extra string) {
		for i := range n {
			fmt.Fprintf(&cfg, "  - {name: %s%d, kind: %s, %s, interval: %v, timeout: 150ms, jitter: 40ms, rise: 2, fall: 3}\n", kind, i, kind, extra, interval)
		}
	}
	add(50, "ami", fmt.Sprintf("address: %q, username: fan, secret: s", peer.Addr()))
	add(50, "sip", fmt.Sprintf("address: %q", udp))
	for i := range 25 {
		fmt.Fprintf(&cfg, "  - {name: siptcp%d, kind: sip, transport: tcp, address: %q, interval: %v, timeout: 150ms, jitter: 40ms, rise: 2, fall: 3}\n", i, tcpSIP, interval)
	}
	add(25, "tcp", fmt.Sprintf("address: %q", ln.Addr()))
	add(50, "http", fmt.Sprintf("address: %q", web.URL+"/"))
	path := filepath.Join(dir, "prober.yaml")
	if err := os.WriteFile(path, []byte(cfg.String()), 0o644); err != nil {
		b.Fatal(err)
	}
	var logs bytes.Buffer
	cmd := exec.Command(bin, "-config", path, "-log-level", "warn")
	cmd.Stderr = &logs
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}()

	// Wait until a heartbeat shows all 200 checks up.
	w := bustest.Connect(b, s, bus.Identity{Cluster: "bench", Service: "bench", Node: "w"})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	allUp := make(chan struct{})
	go func() {
		_ = w.Watch(ctx, bus.WatchOptions{Subjects: []string{events.ClusterEvents("bench")}}, func(_ events.Envelope, p events.Payload, _ uint64) {
			hb, ok := p.(*events.NodeHeartbeat)
			if !ok || len(hb.Checks) != 200 {
				return
			}
			for _, c := range hb.Checks {
				if c.Health != events.HealthUp {
					return
				}
			}
			select {
			case <-allUp:
			default:
				close(allUp)
			}
		})
	}()
	select {
	case <-allUp:
	case <-ctx.Done():
		cancel()
		b.Fatalf("not all 200 checks up within 30 s; prober log:\n%s", logs.String())
	}
	cancel()

	b.ResetTimer()
	for range b.N {
		t0, c0 := time.Now(), procCPU(b, cmd.Process.Pid)
		time.Sleep(window) // measuring a rate over a fixed window, not waiting for a condition
		t1, c1 := time.Now(), procCPU(b, cmd.Process.Pid)
		cpu := 100 * (c1 - c0).Seconds() / t1.Sub(t0).Seconds()
		rss := procRSS(b, cmd.Process.Pid)
		b.ReportMetric(cpu, "cpu_pct_of_one_core")
		b.ReportMetric(rss, "rss_mib")
		fmt.Printf("checks=200 interval_ms=%d cpu_pct_of_one_core=%.2f rss_mib=%.1f\n", interval.Milliseconds(), cpu, rss)
	}
}

// procCPU is the user plus system time pid has used (/proc/PID/stat, in
// clock ticks of 1/100 s on Linux).
func procCPU(b *testing.B, pid int) time.Duration {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatal(err)
	}
	// The command name may hold spaces: fields start after its closing ')'.
	f := strings.Fields(string(raw[bytes.LastIndexByte(raw, ')')+2:]))
	ut, _ := strconv.ParseUint(f[11], 10, 64)
	st, _ := strconv.ParseUint(f[12], 10, 64)
	return time.Duration(ut+st) * 10 * time.Millisecond
}

func procRSS(b *testing.B, pid int) float64 {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatal(err)
	}
	for _, l := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			kb, _ := strconv.ParseFloat(strings.Fields(v)[0], 64)
			return kb / 1024
		}
	}
	b.Fatal("no VmRSS")
	return 0
}

// sipAnswer echoes the headers a response needs from a request's header.
func sipAnswer(req []byte) []byte {
	var out bytes.Buffer
	out.WriteString("SIP/2.0 200 OK\r\n")
	for _, l := range strings.Split(string(req), "\r\n") {
		name, _, _ := strings.Cut(l, ":")
		switch strings.ToLower(name) {
		case "via", "from", "call-id", "cseq":
			out.WriteString(l + "\r\n")
		case "to":
			out.WriteString(l + ";tag=b\r\n")
		}
	}
	out.WriteString("Content-Length: 0\r\n\r\n")
	return out.Bytes()
}

func benchSIPUDP(b *testing.B) string {
	c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() })
	go func() {
		buf := make([]byte, 65535)
		for {
			n, from, err := c.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			_, _ = c.WriteToUDPAddrPort(sipAnswer(buf[:n]), from)
		}
	}()
	return c.LocalAddr().String()
}

func benchSIPTCP(b *testing.B) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				var head []byte
				for {
					line, err := br.ReadBytes('\n')
					if err != nil {
						return
					}
					head = append(head, line...)
					if string(line) == "\r\n" {
						if _, err := c.Write(sipAnswer(head)); err != nil {
							return
						}
						head = head[:0]
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}
