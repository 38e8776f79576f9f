package replicate_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"runtime/trace"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus/bustest"
	"github.com/fanpbx/fan/services/replicator/internal/fstree"
	"github.com/fanpbx/fan/services/replicator/internal/replicate"
)

// BenchmarkVersusRsync compares the replicator with rsync on the same data on
// this machine: an initial sync of FAN_BENCH_FILES files (default 10,000)
// holding FAN_BENCH_BYTES bytes (default 1 GiB), a pass with no changes, and
// change-to-visible latency. rsync runs locally (directory to directory, no
// SSH), which is its best case. Each run also times the plain checked copy
// (plaincopy_test.go) with no hop, through the bus and over a direct TLS
// connection, so the replicator's figure can be read against what checking
// the copy and moving the bytes cost here. As root with OpenSSH installed,
// each run also times rsync -az --delete over SSH between two network
// namespaces (sshrsync_test.go), the way the spool was synced before the
// replicator, for the initial sync and a no-change pass. Run:
//
//	cd services/replicator && go test -run '^$' -bench VersusRsync -benchtime 1x -timeout 30m ./internal/replicate
//
// Data lives under /tmp and is deleted at the end. FAN_BENCH_PROFILE=dir
// writes a CPU profile and an execution trace of the last run's initial
// sync alone;
// FAN_BENCH_STORE_PASS_MIB sets store_pass_mib (default 64; 0 turns direct
// transfer off);
// FAN_BENCH_WORKERS sets workers (default 4); FAN_BENCH_RUNS sets how many
// alternated runs of both tools the initial-sync figures are the medians of
// (default 3);
// FAN_BENCH_ROUNDS sets the latency rounds (default 100); FAN_TEST_DEBUG=1
// logs every pass.
func BenchmarkVersusRsync(b *testing.B) {
	rsync, err := exec.LookPath("rsync")
	if err != nil {
		b.Skip("rsync not installed (apt-get install rsync)")
	}
	files := envInt("FAN_BENCH_FILES", 10000)
	// The replicator's default (store_pass_mib: 64); FAN_BENCH_STORE_PASS_MIB=0
	// stores every content (direct_transfer: false).
	storePass := int64(64) << 20
	if v, err := strconv.Atoi(os.Getenv("FAN_BENCH_STORE_PASS_MIB")); err == nil {
		storePass = int64(max(v, 0)) << 20
	}
	total := envInt("FAN_BENCH_BYTES", 1<<30)
	workers := envInt("FAN_BENCH_WORKERS", 4) // the replicator's default
	dir, err := os.MkdirTemp("/tmp", "fan-repl-bench-")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { os.RemoveAll(dir) })
	src, rdst := filepath.Join(dir, "src"), filepath.Join(dir, "rsync-dst")
	fdst, n1State, n2State := filepath.Join(dir, "fan-dst"), filepath.Join(dir, "n1-state"), filepath.Join(dir, "n2-state")
	plainDst := filepath.Join(dir, "plain-dst")
	sshDst := filepath.Join(dir, "rsync-ssh-dst")
	genData(b, src, files, total)
	dropCaches()
	// rsync -az --delete over SSH between two namespaces (sshrsync_test.go),
	// as the spool was synced before the replicator.
	ssh, noSSH := startSSHRsync(b)
	if ssh == nil {
		fmt.Printf("rsync over SSH: skipped, %s\n", noSSH)
	}

	// rsyncCPU is the CPU time of the last run (its processes together).
	var rsyncCPU time.Duration
	runRsync := func() time.Duration {
		start := time.Now()
		cmd := exec.Command(rsync, "-a", "--delete", src+"/", rdst+"/")
		if out, err := cmd.CombinedOutput(); err != nil {
			b.Fatalf("rsync: %v: %s", err, out)
		}
		rsyncCPU = cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
		return time.Since(start)
	}
	// Runs (FAN_BENCH_RUNS, default 3), each rsync then the replicator,
	// both into empty destinations and reading the source cold. One run's
	// ratio is hostage to the kernel: on these VMs writing the same
	// gigabyte into new files costs 0.4 to 4.9 s of system time from one
	// run to the next, whichever program writes it. The medians of the
	// alternated runs are the figures; every run is printed.
	runs := envInt("FAN_BENCH_RUNS", 3)
	var rInits, rInitCPUs, rFlushes, fInits, fInitCPUs, sInits, sInitCPUs []time.Duration
	var sNoop time.Duration
	// The plain checked copy (plaincopy_test.go) in the same runs, with no
	// hop, through the bus and over a direct TLS connection: what the
	// checks cost here, and what each way of moving the bytes adds.
	plains := []struct {
		name, key string
		hop       plainHop
		walls     []time.Duration
		cpus      []time.Duration
	}{
		{name: "no hop", key: "memory", hop: memoryHop{}},
		{name: "bus hop", key: "bus", hop: busHop{srv: bustest.Server(b)}},
		{name: "TLS hop", key: "tls", hop: tlsHop{}},
	}
	runPlain := func(hop plainHop) (time.Duration, time.Duration) {
		if err := os.RemoveAll(plainDst); err != nil {
			b.Fatal(err)
		}
		dropCaches()
		cpu0, start := selfCPU(), time.Now()
		if err := plainCopy(src, plainDst, hop); err != nil {
			b.Fatal(err)
		}
		wall, cpu := time.Since(start), selfCPU()-cpu0
		if err := same(src, plainDst); err != nil {
			b.Fatalf("plain copy differs: %v", err)
		}
		return wall, cpu
	}
	n1 := &node{name: "n1", root: src, state: n1State}
	n2 := &node{name: "n2", root: fdst, state: n2State}
	cfg := func(c *replicate.Config) {
		c.ScanInterval = time.Hour
		c.Workers = workers
		c.StorePassBytes = storePass
	}
	var rNoop time.Duration
	for b.Loop() {
		for run := range runs {
			last := run == runs-1
			for _, d := range []string{rdst, fdst, n1State, n2State, sshDst} {
				if err := os.RemoveAll(d); err != nil {
					b.Fatal(err)
				}
			}
			dropCaches()
			rInit := runRsync()
			rCPU := rsyncCPU
			rInits, rInitCPUs = append(rInits, rInit), append(rInitCPUs, rCPU)
			// rsync leaves its copy in the page cache; the replicator's
			// apply flushes its file system before it confirms, which
			// would write rsync's gigabyte too. Written back first, each
			// pays for its own: rsync's flush is timed, so that its time
			// to a copy on disk (what a replicator's confirmation
			// promises) is printed beside its own.
			t0 := time.Now()
			_ = exec.Command("sync").Run()
			rFlushes = append(rFlushes, time.Since(t0))
			if last {
				rNoop = runRsync()
				_ = exec.Command("sync").Run()
			}
			if ssh != nil {
				dropCaches()
				wall, cpu := ssh.rsync(b, src, sshDst)
				_ = exec.Command("sync").Run()
				sInits, sInitCPUs = append(sInits, wall), append(sInitCPUs, cpu)
				fmt.Printf("\nrun %d: rsync -az over SSH %.2fs (CPU of the sending end %.2fs)\n", run+1, wall.Seconds(), cpu.Seconds())
				if err := same(src, sshDst); err != nil {
					b.Fatalf("rsync over SSH copy differs: %v", err)
				}
				if last {
					sNoop, _ = ssh.rsync(b, src, sshDst)
				}
			}
			// rsync read the source from disk; so does the replicator.
			dropCaches()

			l := newLab(b)
			mark := l.mark()
			stopProfile := func() {}
			if last {
				stopProfile = profileIf(b, os.Getenv("FAN_BENCH_PROFILE"))
			}
			cpu0 := selfCPU()
			start := time.Now()
			stop1 := l.start(n1, cfg)
			stop2 := l.start(n2, cfg)
			l.setHolder("n1", 1)
			l.patient = true
			st := l.waitCaughtUp(mark, "n1", "n2", "voicemail", 1)
			fInit := time.Since(start)
			// Both replicators and the JetStream server run in this process.
			fInitCPU := selfCPU() - cpu0
			stopProfile()
			fInits, fInitCPUs = append(fInits, fInit), append(fInitCPUs, fInitCPU)
			var apply time.Duration
			if _, p, i := l.find(mark, func(_ events.Envelope, p events.Payload) bool {
				a, ok := p.(*events.ReplicationApplied)
				return ok && a.Node == "n2" && a.Generation == st.Generation
			}); i >= 0 {
				apply = time.Duration(p.(*events.ReplicationApplied).DurationMS * float64(time.Millisecond))
			}
			// The source's pass is what the target's apply did not take.
			fmt.Printf("\nrun %d: rsync %.2fs (CPU %.2fs), fan %.2fs (CPU %.2fs; target apply %v, source pass and hand-over %v), fan/rsync %.2f\n",
				run+1, rInit.Seconds(), rCPU.Seconds(), fInit.Seconds(), fInitCPU.Seconds(),
				apply.Round(time.Millisecond), (fInit - apply).Round(time.Millisecond), fInit.Seconds()/rInit.Seconds())
			if err := same(src, n2.root); err != nil {
				b.Fatalf("fan copy differs: %v", err)
			}
			if !last {
				stop2()
				stop1()
			}
			line := fmt.Sprintf("run %d: plain checked copy", run+1)
			for i := range plains {
				p := &plains[i]
				wall, cpu := runPlain(p.hop)
				p.walls, p.cpus = append(p.walls, wall), append(p.cpus, cpu)
				line += fmt.Sprintf(", %s %.2fs (CPU %.2fs)", p.name, wall.Seconds(), cpu.Seconds())
			}
			fmt.Println(line)
		}
		rInit, rInitCPU, rFlush := median(rInits), median(rInitCPUs), median(rFlushes)
		fInit, fInitCPU := median(fInits), median(fInitCPUs)

		// No change: what the periodic pass costs on both sides (stat
		// every entry, hash nothing, send nothing).
		ex, _ := fstree.NewExcluder([]string{"tmp/"})
		s1, s2 := &fstree.Scanner{Root: src, Exclude: ex}, &fstree.Scanner{Root: n2.root, Exclude: ex}
		_, _ = s1.Scan(context.Background())
		_, _ = s2.Scan(context.Background())
		t0 := time.Now()
		if _, err := s1.Scan(context.Background()); err != nil {
			b.Fatal(err)
		}
		if _, err := s2.Scan(context.Background()); err != nil {
			b.Fatal(err)
		}
		fNoop := time.Since(t0)

		// Change to visible: write a 16 KiB message on the source, time
		// until the same bytes are on the target under the final name.
		rounds := envInt("FAN_BENCH_ROUNDS", 100)
		var fLat, rLat []time.Duration
		for i := range rounds {
			rel := fmt.Sprintf("bench/%d/INBOX/msg%04d.txt", i%10, i)
			data := make([]byte, 16<<10)
			_, _ = rand.Read(data)
			t0 := time.Now()
			write(b, src, rel, data)
			fLat = append(fLat, waitFile(b, filepath.Join(n2.root, rel), len(data), t0))
			// rsync's latency for the same change is one run (a cron
			// adds up to its period on top).
			rLat = append(rLat, runRsync())
		}
		fp50, fp99 := pct(fLat, 50), pct(fLat, 99)
		rp50, rp99 := pct(rLat, 50), pct(rLat, 99)
		b.ReportMetric(fInit.Seconds(), "fan_initial_s")
		b.ReportMetric(rInit.Seconds(), "rsync_initial_s")
		b.ReportMetric(fNoop.Seconds()*1000, "fan_nochange_ms")
		b.ReportMetric(rNoop.Seconds()*1000, "rsync_nochange_ms")
		b.ReportMetric(float64(fp99.Microseconds())/1000, "fan_latency_p99_ms")
		b.ReportMetric(float64(rp99.Microseconds())/1000, "rsync_latency_p99_ms")
		fmt.Printf("\nreplicator vs rsync, %d files, %.0f MiB, %d CPUs (initial sync: medians of %d runs)\n", files, float64(total)/(1<<20), nprocs(), runs)
		fmt.Printf("  initial sync     fan %8.2fs   rsync %8.2fs   fan/rsync %.2f\n", fInit.Seconds(), rInit.Seconds(), fInit.Seconds()/rInit.Seconds())
		for _, p := range plains {
			wall := median(p.walls)
			fmt.Printf("  plain copy, %-8s%8.2fs   plain/rsync %.2f   fan/plain %.2f\n", p.name, wall.Seconds(), wall.Seconds()/rInit.Seconds(), fInit.Seconds()/wall.Seconds())
		}
		fmt.Printf("  no-change pass   fan %8.1fms  rsync %8.1fms  fan/rsync %.2f\n", ms(fNoop), ms(rNoop), fNoop.Seconds()/rNoop.Seconds())
		var sshKV string
		if ssh != nil {
			sInit := median(sInits)
			fmt.Printf("  initial sync     fan %8.2fs   rsync -az over SSH %8.2fs   fan/rsync-ssh %.2f\n", fInit.Seconds(), sInit.Seconds(), fInit.Seconds()/sInit.Seconds())
			fmt.Printf("  no-change pass   fan %8.1fms  rsync -az over SSH %8.1fms  fan/rsync-ssh %.2f\n", ms(fNoop), ms(sNoop), fNoop.Seconds()/sNoop.Seconds())
			sshKV = fmt.Sprintf("initial_rsync_ssh_s=%.2f initial_rsync_ssh_cpu_s=%.2f initial_ratio_rsync_ssh=%.2f nochange_rsync_ssh_ms=%.1f nochange_ratio_rsync_ssh=%.3f",
				sInit.Seconds(), median(sInitCPUs).Seconds(), fInit.Seconds()/sInit.Seconds(), ms(sNoop), fNoop.Seconds()/sNoop.Seconds())
		}
		fmt.Printf("  change latency   fan p50 %6.1fms p99 %6.1fms   rsync run p50 %6.1fms p99 %6.1fms   p99 fan/rsync %.2f\n",
			ms(fp50), ms(fp99), ms(rp50), ms(rp99), fp99.Seconds()/rp99.Seconds())
		// CPU time beside wall time: on a machine shared with other jobs
		// the wall time of either tool grows with the others' load, the
		// CPU each used much less.
		// initial_rsync_durable_s: rsync and then sync(1), its copy on
		// disk; the ratio against it is printed beside, not instead of,
		// the ratio against rsync alone.
		rDurable := rInit + rFlush
		fmt.Printf("files=%d bytes=%d store_pass_mib=%d workers=%d runs=%d initial_fan_s=%.2f initial_rsync_s=%.2f initial_ratio=%.2f initial_rsync_durable_s=%.2f initial_durable_ratio=%.2f initial_fan_cpu_s=%.2f initial_rsync_cpu_s=%.2f initial_cpu_ratio=%.2f nochange_fan_ms=%.1f nochange_rsync_ms=%.1f change_fan_p50_ms=%.1f change_fan_p99_ms=%.1f change_rsync_p99_ms=%.1f\n",
			files, total, storePass>>20, workers, runs, fInit.Seconds(), rInit.Seconds(), fInit.Seconds()/rInit.Seconds(),
			rDurable.Seconds(), fInit.Seconds()/rDurable.Seconds(),
			fInitCPU.Seconds(), rInitCPU.Seconds(), fInitCPU.Seconds()/rInitCPU.Seconds(),
			ms(fNoop), ms(rNoop), ms(fp50), ms(fp99), ms(rp99))
		var kv []string
		for _, p := range plains {
			wall, cpu := median(p.walls), median(p.cpus)
			kv = append(kv, fmt.Sprintf("plain_%[1]s_s=%.2[2]f plain_%[1]s_cpu_s=%.2[3]f plain_%[1]s_ratio=%.2[4]f fan_over_plain_%[1]s=%.2[5]f",
				p.key, wall.Seconds(), cpu.Seconds(), wall.Seconds()/rInit.Seconds(), fInit.Seconds()/wall.Seconds()))
		}
		fmt.Println(strings.Join(kv, " "))
		if sshKV != "" {
			fmt.Println(sshKV)
		}
	}
}

// profileIf writes a CPU profile and an execution trace of the initial
// sync alone into dir (FAN_BENCH_PROFILE=dir), without the data generation,
// rsync and the latency rounds the whole-benchmark flags would mix in.
func profileIf(b *testing.B, dir string) (stop func()) {
	if dir == "" {
		return func() {}
	}
	cpu, err := os.Create(filepath.Join(dir, "initial.cpu"))
	if err != nil {
		b.Fatal(err)
	}
	tr, err := os.Create(filepath.Join(dir, "initial.trace"))
	if err != nil {
		b.Fatal(err)
	}
	if err := pprof.StartCPUProfile(cpu); err != nil {
		b.Fatal(err)
	}
	if err := trace.Start(tr); err != nil {
		b.Fatal(err)
	}
	return func() {
		trace.Stop()
		pprof.StopCPUProfile()
		cpu.Close()
		tr.Close()
	}
}

// median is the middle value, or the mean of the two middle ones.
func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	n := len(s)
	if n == 0 {
		return 0
	}
	return (s[(n-1)/2] + s[n/2]) / 2
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// selfCPU is the CPU time this process has used (user and system).
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func nprocs() int {
	n, _ := strconv.Atoi(os.Getenv("GOMAXPROCS"))
	if n == 0 {
		out, _ := exec.Command("nproc").Output()
		n, _ = strconv.Atoi(string(out[:max(len(out)-1, 0)]))
	}
	return n
}

func envInt(k string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(k)); err == nil && v > 0 {
		return v
	}
	return def
}

// genData writes files files totalling about total bytes: 1 % large media
// files holding 90 % of the bytes, the rest small, as a voicemail spool.
func genData(b *testing.B, root string, files, total int) {
	b.Helper()
	large := max(files/100, 1)
	small := files - large
	smallSize := total / 10 / max(small, 1)
	largeSize := (total - smallSize*small) / large
	buf := make([]byte, largeSize)
	for i := range files {
		size := smallSize
		rel := fmt.Sprintf("default/%d/INBOX/msg%04d.txt", i%200, i)
		if i < large {
			size = largeSize
			rel = fmt.Sprintf("default/%d/INBOX/msg%04d.wav", i%200, i)
		}
		_, _ = rand.Read(buf[:size])
		write(b, root, rel, buf[:size])
	}
}

// dropCaches is best effort: both tools then start from the same state.
func dropCaches() {
	_ = exec.Command("sync").Run()
	_ = os.WriteFile("/proc/sys/vm/drop_caches", []byte("3"), 0o200)
}

// visibleAfter is how long after since the standby showed a change:
// cond, given what stat says of p, holds. It is a measurement, not a wait
// for a test to go on: it looks every half millisecond, where
// waittest.Until's 20 ms poll would be the floor of figures of a few
// milliseconds.
func visibleAfter(b *testing.B, p string, since time.Time, cond func(os.FileInfo, error) bool) time.Duration {
	b.Helper()
	const within = 10 * time.Second
	deadline := time.Now().Add(within)
	for !cond(os.Lstat(p)) {
		if time.Now().After(deadline) {
			b.Fatalf("%s: change not on the standby within %v", p, within)
		}
		time.Sleep(500 * time.Microsecond)
	}
	return time.Since(since)
}

// waitFile times a file of size bytes appearing (or taking that size) at p.
func waitFile(b *testing.B, p string, size int, since time.Time) time.Duration {
	b.Helper()
	return visibleAfter(b, p, since, func(fi os.FileInfo, err error) bool { return err == nil && fi.Size() == int64(size) })
}

// waitGone times p's deletion.
func waitGone(b *testing.B, p string, since time.Time) time.Duration {
	b.Helper()
	return visibleAfter(b, p, since, func(_ os.FileInfo, err error) bool { return os.IsNotExist(err) })
}

func pct(ds []time.Duration, p float64) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(math.Ceil(p/100*float64(len(s)))) - 1
	return s[max(i, 0)]
}
