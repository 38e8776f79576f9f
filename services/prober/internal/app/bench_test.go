package app

import (
	"bufio"
	"bytes"
	"context"
	"flag"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fanpbx/fan/lab/amipeer"
	"github.com/fanpbx/fan/lab/procstat"
	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/bus/bustest"
)

// proberProfile, when set, makes the benchmark build the prober with the
// pprof tag and save the prober process's CPU profile and allocations over
// the measured window in this directory (profile.pprof, allocs.pprof):
//
//	go test -run '^$' -bench Prober200 -benchtime 1x ./internal/app -args -prober.profile=/tmp/prof
//
// Profiling costs the prober a little CPU itself: take figures without it.
var proberProfile = flag.String("prober.profile", "", "directory for the prober's CPU and allocation profiles over the measured window")

// proberWindow is how long the benchmark measures; a profile wants more
// than the default 10 s (the CPU profiler samples at 100 Hz).
// proberBin, when set, is a fan-prober binary to measure instead of building
// one (to compare two versions under the same conditions).
var proberBin = flag.String("prober.bin", "", "prebuilt fan-prober to measure")

// proberKinds limits the mix to some of its parts (ami, sip, siptcp, tcp,
// http), to see what each costs; the figures then are not the 200-check ones.
var proberKinds = flag.String("prober.kinds", "ami,sip,siptcp,tcp,http", "parts of the check mix to run")

var proberWindow = flag.Duration("prober.window", 10*time.Second, "measured window")

// BenchmarkProber200Checks measures what the prober costs: the real
// fan-prober binary, built here, runs 200 checks at 200 ms intervals (50 AMI
// sessions, 50 SIP over UDP, 25 SIP over TCP, 25 TCP, 50 HTTP) against peers
// in this process, publishing to an embedded JetStream. Only the prober's
// process is measured, from /proc: CPU share of one core over a 10 s window
// after every check is up (-prober.window), and resident memory at its end.
//
//	go test -run '^$' -bench Prober200 -benchtime 1x ./internal/app
func BenchmarkProber200Checks(b *testing.B) {
	const interval = 200 * time.Millisecond
	window := *proberWindow
	// First, with nothing else started: what one loopback round trip costs
	// this machine, so that figures from different machines compare.
	calib := udpRoundTripCPU(b, 20000)
	dir := b.TempDir()
	bin := filepath.Join(dir, "fan-prober")
	build := []string{"build", "-o", bin}
	if *proberProfile != "" {
		build = append(build, "-tags", "pprof")
	}
	if *proberBin != "" {
		bin = *proberBin
	} else if out, err := exec.Command("go", append(build, "github.com/fanpbx/fan/services/prober/cmd/fan-prober")...).CombinedOutput(); err != nil {
		b.Fatalf("build fan-prober: %v\n%s", err, out)
	}
	peer, err := amipeer.Start(amipeer.Config{Username: "fan", Secret: "s"})
	if err != nil {
		b.Fatal(err)
	}
	defer peer.Close()
	udp := startSIPUDP(b).addr()
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
	kinds, total := strings.Split(*proberKinds, ","), 0
	add := func(n int, kind, extra string) {
		if !slices.Contains(kinds, kind) {
			return
		}
		total += n
		for i := range n {
			fmt.Fprintf(&cfg, "  - {name: %s%d, kind: %s, %s, interval: %v, timeout: 150ms, jitter: 40ms, rise: 2, fall: 3}\n", kind, i, kind, extra, interval)
		}
	}
	add(50, "ami", fmt.Sprintf("address: %q, username: fan, secret: s", peer.Addr()))
	add(50, "sip", fmt.Sprintf("address: %q", udp))
	for i := range 25 {
		if !slices.Contains(kinds, "siptcp") {
			break
		}
		total++
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
	var pprofAddr string
	if *proberProfile != "" {
		pprofAddr = freeAddr(b)
		cmd.Env = append(os.Environ(), "FAN_PPROF="+pprofAddr)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}()

	// Wait until a heartbeat shows every check up; then count what the
	// prober publishes, to show the raw results' rate limit holds.
	w := bustest.Connect(b, s, bus.Identity{Cluster: "bench", Service: "bench", Node: "w"})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	allUp := make(chan struct{})
	var published, results atomic.Int64
	go func() {
		_ = w.Watch(ctx, bus.WatchOptions{Subjects: []string{events.ClusterEvents("bench"), events.ClusterLiveState("bench")}}, func(_ events.Envelope, p events.Payload, _ uint64) {
			published.Add(1)
			if _, ok := p.(*events.ProbeResult); ok {
				results.Add(1)
			}
			hb, ok := p.(*events.NodeHeartbeat)
			if !ok || len(hb.Checks) != total {
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
	case <-time.After(30 * time.Second):
		b.Fatalf("not all %d checks up within 30 s; prober log:\n%s", total, logs.String())
	}

	b.ResetTimer()
	for range b.N {
		profiled := make(chan error, 2)
		if pprofAddr != "" {
			for _, p := range []string{"profile", "allocs"} {
				go func() {
					profiled <- procstat.FetchProfile(pprofAddr, p, window, filepath.Join(*proberProfile, p+".pprof"))
				}()
			}
		}
		// The peers, the JetStream server and the watcher run in this
		// process: its CPU is reported apart, never added to the prober's.
		e0, r0 := published.Load(), results.Load()
		t0, c0, p0, s0 := time.Now(), procCPU(b, cmd.Process.Pid), procCPU(b, os.Getpid()), procstat.Switches(cmd.Process.Pid)
		time.Sleep(window) // measuring a rate over a fixed window, not waiting for a condition
		t1, c1, p1, s1 := time.Now(), procCPU(b, cmd.Process.Pid), procCPU(b, os.Getpid()), procstat.Switches(cmd.Process.Pid)
		secs := t1.Sub(t0).Seconds()
		cpu := 100 * (c1 - c0).Seconds() / secs
		peers := 100 * (p1 - p0).Seconds() / secs
		// Context switches of the prober's threads: each is a thread going
		// to sleep or being preempted, which is most of what a mostly idle
		// prober pays for. Unlike CPU time it does not grow when other
		// processes compete for the CPUs, so it compares versions on a busy
		// machine.
		switches := float64(s1-s0) / secs
		// Stored events the prober published in the window (results,
		// transitions, heartbeats; beacons are not stored), and raw results
		// alone: with every check steady, about checks / results_every.
		evs, res := float64(published.Load()-e0)/secs, float64(results.Load()-r0)/secs
		rss := procRSS(b, cmd.Process.Pid)
		b.ReportMetric(cpu, "cpu_pct_of_one_core")
		b.ReportMetric(rss, "rss_mib")
		b.ReportMetric(switches, "ctx_switches/s")
		fmt.Printf("checks=%d interval_ms=%d cpu_pct_of_one_core=%.2f rss_mib=%.1f (ctx_switches_per_s=%.0f events_per_s=%.1f results_per_s=%.1f; peers and bus, not counted: %.2f)\n",
			total, interval.Milliseconds(), cpu, rss, switches, evs, res, peers)
		// The machine's yardstick: a probe's CPU in loopback UDP round
		// trips (both ends, as the calibration measures them). It moves
		// with the prober's code, much less with the VM it runs on.
		perProbe := cpu / 100 * 1e6 / (float64(total) / interval.Seconds())
		fmt.Printf("calib_udp_rtt_cpu_us=%.1f cpu_us_per_probe=%.1f probe_cost_rtts=%.2f\n", calib, perProbe, perProbe/calib)
		if pprofAddr != "" {
			for range 2 {
				if err := <-profiled; err != nil {
					b.Error(err)
				}
			}
		}
	}
}

// udpRoundTripCPU is the CPU, in microseconds, that this process spends
// on one loopback UDP round trip (a datagram out, echoed back by a
// goroutine, read), over n of them: the machine's price of the simplest
// probe, measured with the same counter as the prober's CPU.
func udpRoundTripCPU(b *testing.B, n int) float64 {
	echo, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		b.Fatal(err)
	}
	defer echo.Close()
	go func() {
		buf := make([]byte, 512)
		for {
			m, from, err := echo.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			_, _ = echo.WriteToUDPAddrPort(buf[:m], from)
		}
	}()
	c, err := net.DialUDP("udp", nil, echo.LocalAddr().(*net.UDPAddr))
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	msg, buf := bytes.Repeat([]byte("x"), 300), make([]byte, 512)
	roundTrip := func() {
		if _, err := c.Write(msg); err != nil {
			b.Fatal(err)
		}
		_ = c.SetReadDeadline(time.Now().Add(time.Second))
		if _, err := c.Read(buf); err != nil {
			b.Fatal(err)
		}
	}
	for range 1000 {
		roundTrip() // warm up
	}
	c0 := procCPU(b, os.Getpid())
	for range n {
		roundTrip()
	}
	return float64((procCPU(b, os.Getpid()) - c0).Microseconds()) / float64(n)
}

func freeAddr(b *testing.B) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// procCPU and procRSS read the prober process's cost (lab/procstat).
func procCPU(b *testing.B, pid int) time.Duration {
	c, err := procstat.CPU(pid)
	if err != nil {
		b.Fatal(err)
	}
	return c
}

func procRSS(b *testing.B, pid int) float64 {
	m, err := procstat.RSS(pid)
	if err != nil {
		b.Fatal(err)
	}
	return m
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
