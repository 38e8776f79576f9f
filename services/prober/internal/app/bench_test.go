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
	"github.com/fanpbx/fan/lab/probefloor"
	"github.com/fanpbx/fan/lab/procstat"
	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/bus/bustest"
	"github.com/fanpbx/fan/pkg/platform/porttest"
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

// proberByKind, when set, also runs each kind of the mix alone, fan and the
// floor, for the CPU per probe by kind.
var proberByKind = flag.Bool("prober.bykind", true, "also measure each kind of the mix alone (fan and the floor)")

// proberExec, when set, also runs the process-per-check reference.
var proberExec = flag.Bool("prober.exec", true, "also measure the process-per-check reference")

const benchInterval = 200 * time.Millisecond

// benchPeers are what the checks probe, all in this process.
type benchPeers struct {
	ami, udp, tcpSIP, tcp, web string
}

// mix is the benchmark's checks of the given kinds: count, kind and the
// prober's extra YAML per kind, in the mix's order.
func (p benchPeers) mix(kinds []string) []benchKind {
	all := []benchKind{
		{50, "ami", fmt.Sprintf("kind: ami, address: %q, username: fan, secret: s", p.ami), p.ami},
		{50, "sip", fmt.Sprintf("kind: sip, address: %q", p.udp), p.udp},
		{25, "siptcp", fmt.Sprintf("kind: sip, transport: tcp, address: %q", p.tcpSIP), p.tcpSIP},
		{25, "tcp", fmt.Sprintf("kind: tcp, address: %q", p.tcp), p.tcp},
		{50, "http", fmt.Sprintf("kind: http, address: %q", p.web), p.web},
	}
	var out []benchKind
	for _, k := range all {
		if slices.Contains(kinds, k.kind) {
			out = append(out, k)
		}
	}
	return out
}

type benchKind struct {
	n          int
	kind, yaml string
	addr       string // the floor's address for it
}

func total(mix []benchKind) int {
	n := 0
	for _, k := range mix {
		n += k.n
	}
	return n
}

// benchBus is the embedded JetStream the prober publishes to.
type benchBus struct {
	url     string
	connect func() *bus.Bus
}

// fanRun is one measured window of the prober.
type fanRun struct {
	cpu, rss, switches, evs, res, peers float64
	perProbe                            float64 // CPU µs per probe at the nominal rate
}

// BenchmarkProber200Checks measures what the prober costs: the real
// fan-prober binary, built here, runs 200 checks at 200 ms intervals (50 AMI
// sessions, 50 SIP over UDP, 25 SIP over TCP, 25 TCP, 50 HTTP) against peers
// in this process, publishing to an embedded JetStream. Only the prober's
// process is measured, from /proc: CPU share of one core over a 10 s window
// after every check is up (-prober.window), and resident memory at its end.
//
// The same checks at the same rate then run in two references
// (lab/probefloor, the fan-probefloor program): the floor, a loop doing only
// the probes' socket work (TCP connect and close, one SIP OPTIONS exchange,
// one AMI action and one HTTP GET on a kept connection), and the process-
// per-check way of keepalived's vrrp_script (a new process per check per
// interval). fan's CPU per probe is printed as a ratio to each
// (ratio_to_floor=, ratio_to_process_per_check=), and, each kind run
// alone, per kind (-prober.bykind).
//
//	go test -run '^$' -bench Prober200 -benchtime 1x ./internal/app
func BenchmarkProber200Checks(b *testing.B) {
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
	floorBin := filepath.Join(dir, "fan-probefloor")
	if out, err := exec.Command("go", "build", "-o", floorBin, "github.com/fanpbx/fan/lab/cmd/fan-probefloor").CombinedOutput(); err != nil {
		b.Fatalf("build fan-probefloor: %v\n%s", err, out)
	}
	peer, err := amipeer.Start(amipeer.Config{Username: "fan", Secret: "s"})
	if err != nil {
		b.Fatal(err)
	}
	defer peer.Close()
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
	peers := benchPeers{ami: peer.Addr(), udp: startSIPUDP(b).addr(), tcpSIP: benchSIPTCP(b), tcp: ln.Addr().String(), web: web.URL + "/"}
	srv := bustest.Server(b)
	s := benchBus{url: srv.ClientURL(), connect: func() *bus.Bus {
		return bustest.Connect(b, srv, bus.Identity{Cluster: "bench", Service: "bench", Node: "w"})
	}}
	mix := peers.mix(strings.Split(*proberKinds, ","))

	b.ResetTimer()
	for range b.N {
		fan := measureFan(b, s, bin, dir, mix, window, *proberProfile)
		n := total(mix)
		fmt.Printf("checks=%d interval_ms=%d cpu_pct_of_one_core=%.2f rss_mib=%.1f (ctx_switches_per_s=%.0f events_per_s=%.1f results_per_s=%.1f; peers and bus, not counted: %.2f)\n",
			n, benchInterval.Milliseconds(), fan.cpu, fan.rss, fan.switches, fan.evs, fan.res, fan.peers)
		// The machine's yardstick: a probe's CPU in loopback UDP round
		// trips (both ends, as the calibration measures them). It moves
		// with the prober's code, much less with the VM it runs on.
		fmt.Printf("calib_udp_rtt_cpu_us=%.1f cpu_us_per_probe=%.1f probe_cost_rtts=%.2f\n", calib, fan.perProbe, fan.perProbe/calib)

		// The references, the same checks at the same rate, measured over
		// the same window; per probe over the runs they completed.
		floor := runFloor(b, floorBin, "floor", mix, window)
		floorPer := probefloor.PerProbeUS(floor.CPU, floor.Total())
		line := fmt.Sprintf("floor_cpu_pct_of_one_core=%.2f floor_cpu_us_per_probe=%.1f ratio_to_floor=%.2f",
			100*floor.CPU.Seconds()/floor.Window.Seconds(), floorPer, probefloor.Ratio(fan.perProbe, floorPer))
		if *proberExec {
			ppc := runFloor(b, floorBin, "exec", mix, window)
			ppcPer := probefloor.PerProbeUS(ppc.CPU, ppc.Total())
			// A process per check may not keep the rate on a small
			// machine (a check still running skips its tick, as
			// keepalived's does): the rate it kept is printed.
			line += fmt.Sprintf(" process_per_check_cpu_pct_of_one_core=%.2f process_per_check_cpu_us_per_probe=%.1f process_per_check_rate_kept=%.2f process_per_check_failed=%d ratio_to_process_per_check=%.4f",
				100*ppc.CPU.Seconds()/ppc.Window.Seconds(), ppcPer,
				float64(ppc.Total())/ppc.Window.Seconds()/(float64(n)/benchInterval.Seconds()), ppc.Failed, probefloor.Ratio(fan.perProbe, ppcPer))
		}
		// Runs that timed out (a loaded machine) are counted as runs: printed,
		// so that a figure with many of them is read as such.
		fmt.Println(line + fmt.Sprintf(" floor_failed=%d floor_runs=%d", floor.Failed, floor.Total()))
		if !*proberByKind {
			continue
		}
		// Each kind alone: fan's per-probe figure carries its fixed costs
		// (heartbeats, the bus), spread over fewer probes than in the mix.
		var kinds []string
		for _, k := range mix {
			f := measureFan(b, s, bin, dir, []benchKind{k}, window, "")
			fl := runFloor(b, floorBin, "floor", []benchKind{k}, window)
			flPer := probefloor.PerProbeUS(fl.CPU, fl.Total())
			kinds = append(kinds, fmt.Sprintf("cpu_us_per_probe_%[1]s=%.1[2]f floor_cpu_us_per_probe_%[1]s=%.1[3]f ratio_to_floor_%[1]s=%.2[4]f",
				k.kind, f.perProbe, flPer, probefloor.Ratio(f.perProbe, flPer)))
		}
		fmt.Println(strings.Join(kinds, " "))
	}
}

// runFloor runs fan-probefloor in mode over mix at the benchmark's rate and
// returns what it measured of itself.
func runFloor(b *testing.B, bin, mode string, mix []benchKind, window time.Duration) probefloor.Result {
	args := []string{"-mode", mode, "-interval", benchInterval.String(), "-timeout", "150ms", "-warmup", "2s",
		"-window", window.String(), "-user", "fan", "-secret", "s"}
	for _, k := range mix {
		args = append(args, "-check", fmt.Sprintf("%s,%d,%s", k.kind, k.n, k.addr))
	}
	out, err := exec.Command(bin, args...).CombinedOutput()
	if err != nil {
		b.Fatalf("fan-probefloor %s: %v\n%s", mode, err, out)
	}
	r, err := probefloor.ParseResult(string(out))
	if err != nil {
		b.Fatalf("fan-probefloor %s: %v\n%s", mode, err, out)
	}
	return r
}

// measureFan starts the prober on mix, waits until a heartbeat shows every
// check up, measures it over window and stops it.
func measureFan(b *testing.B, s benchBus, bin, dir string, mix []benchKind, window time.Duration, profileDir string) fanRun {
	var cfg strings.Builder
	fmt.Fprintf(&cfg, "cluster: bench\nnode: n1\nbus:\n  url: %s\nheartbeat_interval: 2s\nchecks:\n", s.url)
	for _, k := range mix {
		for i := range k.n {
			fmt.Fprintf(&cfg, "  - {name: %s%d, %s, interval: %v, timeout: 150ms, jitter: 40ms, rise: 2, fall: 3}\n", k.kind, i, k.yaml, benchInterval)
		}
	}
	totalChecks := total(mix)
	names := map[string]bool{}
	for _, k := range mix {
		for i := range k.n {
			names[fmt.Sprintf("%s%d", k.kind, i)] = true
		}
	}
	path := filepath.Join(dir, "prober.yaml")
	if err := os.WriteFile(path, []byte(cfg.String()), 0o644); err != nil {
		b.Fatal(err)
	}
	var logs bytes.Buffer
	cmd := exec.Command(bin, "-config", path, "-log-level", "warn")
	cmd.Stderr = &logs
	var pprofAddr string
	if profileDir != "" {
		pprofAddr = porttest.Addr(b)
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
	w := s.connect()
	defer w.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	allUp := make(chan struct{})
	var published, results atomic.Int64
	go func() {
		_ = w.Watch(ctx, bus.WatchOptions{Subjects: []string{events.ClusterEvents("bench"), events.ClusterLiveState("bench")}}, func(_ events.Envelope, p events.Decoded, _ uint64) {
			published.Add(1)
			if _, ok := p.(*events.ProbeResult); ok {
				results.Add(1)
			}
			hb, ok := p.(*events.NodeHeartbeat)
			if !ok || len(hb.Checks) != totalChecks {
				return
			}
			// By name too: an earlier run's prober (a kind alone) may have
			// had as many checks.
			for name, c := range hb.Checks {
				if !names[name] || c.Health != events.HealthUp {
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
		b.Fatalf("not all %d checks up within 30 s; prober log:\n%s", totalChecks, logs.String())
	}

	profiled := make(chan error, 2)
	if pprofAddr != "" {
		for _, p := range []string{"profile", "allocs"} {
			go func() {
				profiled <- procstat.FetchProfile(pprofAddr, p, window, filepath.Join(profileDir, p+".pprof"))
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
	var r fanRun
	r.cpu = 100 * (c1 - c0).Seconds() / secs
	r.peers = 100 * (p1 - p0).Seconds() / secs
	// Context switches of the prober's threads: each is a thread going
	// to sleep or being preempted, which is most of what a mostly idle
	// prober pays for. Unlike CPU time it does not grow when other
	// processes compete for the CPUs, so it compares versions on a busy
	// machine.
	r.switches = float64(s1-s0) / secs
	// Stored events the prober published in the window (results,
	// transitions, heartbeats; beacons are not stored), and raw results
	// alone: with every check steady, about checks / results_every.
	r.evs, r.res = float64(published.Load()-e0)/secs, float64(results.Load()-r0)/secs
	r.rss = procRSS(b, cmd.Process.Pid)
	r.perProbe = r.cpu / 100 * 1e6 / (float64(totalChecks) / benchInterval.Seconds())
	if pprofAddr != "" {
		for range 2 {
			if err := <-profiled; err != nil {
				b.Error(err)
			}
		}
	}
	return r
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
