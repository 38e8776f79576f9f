package replicate_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/bus/bustest"
	"github.com/fanpbx/fan/pkg/platform/waittest"
	"github.com/fanpbx/fan/services/replicator/internal/fstree"
	"github.com/fanpbx/fan/services/replicator/internal/replicate"
	"github.com/fanpbx/fan/services/replicator/internal/store"
	"github.com/prometheus/client_golang/prometheus"
)

// BenchmarkSpool measures what a change costs once the voicemail tree is
// large: FAN_BENCH_SPOOL_FILES files (default 50,000: 1,000 mailboxes of
// messages, each a .txt and a .wav) holding about FAN_BENCH_SPOOL_BYTES
// (default 500 MiB) are synced, then, with the tree settled, each node's
// replicator (a process of its own, so its CPU and memory are its own) is
// measured quiet for FAN_BENCH_SPOOL_QUIET_S seconds (default 120: a few
// of the default scan_interval), then under one change a second (50
// messages added, 10 deleted, 10 edited), each timed from the write on the
// holder to the same bytes, or the file's absence, on the standby.
// FAN_BENCH_SPOOL_CHANGES_FOR (a duration) makes the changes last that long
// instead, cycling add, edit, delete so the tree keeps its size, and
// memory's least-squares slope over them says whether it stays flat. Both
// replicators run with the service's defaults (debounce, scan_interval).
// make bench-sync runs it after BenchmarkVersusRsync.
func BenchmarkSpool(b *testing.B) {
	files := envInt("FAN_BENCH_SPOOL_FILES", 50000)
	total := envInt("FAN_BENCH_SPOOL_BYTES", 500<<20)
	quiet := time.Duration(envInt("FAN_BENCH_SPOOL_QUIET_S", 120)) * time.Second
	var err error
	var changesFor time.Duration
	if v := os.Getenv("FAN_BENCH_SPOOL_CHANGES_FOR"); v != "" {
		if changesFor, err = time.ParseDuration(v); err != nil || changesFor <= 0 {
			b.Fatalf("FAN_BENCH_SPOOL_CHANGES_FOR=%q: want a positive duration such as 25m", v)
		}
	}
	dir, err := os.MkdirTemp("/tmp", "fan-spool-bench-")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { os.RemoveAll(dir) })
	src, dst := filepath.Join(dir, "n1", "voicemail"), filepath.Join(dir, "n2", "voicemail")
	msgs := genSpool(b, src, files, total)
	srv := bustest.Server(b)
	ctl := bustest.Connect(b, srv, bus.Identity{Cluster: cluster, Service: "test", Node: "ctl"})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute+changesFor)
	defer cancel()

	for b.Loop() {
		caught := make(chan *events.ReplicationStatus, 64)
		wctx, stopWatch := context.WithCancel(ctx)
		go func() {
			_ = ctl.Watch(wctx, bus.WatchOptions{Subjects: []string{events.ClusterEvents(cluster)}, Since: time.Now()},
				func(_ events.Envelope, p events.Decoded, _ uint64) {
					if s, ok := p.(*events.ReplicationStatus); ok && s.CaughtUp && s.Peer == "n2" {
						select {
						case caught <- s:
						default:
						}
					}
				})
		}()
		n1 := startSpoolNode(b, srv.ClientURL(), "n1", src, filepath.Join(dir, "n1", "state"))
		n2 := startSpoolNode(b, srv.ClientURL(), "n2", dst, filepath.Join(dir, "n2", "state"))
		start := time.Now()
		kv, err := ctl.StateKV(ctx)
		if err != nil {
			b.Fatal(err)
		}
		gs, _ := json.Marshal(events.GroupStatus{Group: group, Holder: "n1", Epoch: 1, UpdatedAt: time.Now()})
		if _, err := kv.Put(ctx, events.GroupStatusKey(cluster, group), gs); err != nil {
			b.Fatal(err)
		}
		select {
		case <-caught:
		case <-time.After(20 * time.Minute):
			b.Fatal("standby not caught up within 20 minutes")
		}
		initial := time.Since(start)
		stopWatch()
		if err := same(src, dst); err != nil {
			b.Fatalf("standby differs after the initial sync: %v", err)
		}
		fmt.Printf("\nspool: %d files, %.0f MiB, initial sync %.1fs (%s)\n", files, float64(total)/(1<<20), initial.Seconds(), loadavg())

		// Settle: let the initial sync's garbage be collected before the quiet baseline.
		time.Sleep(5 * time.Second)
		rssQuiet0 := [2]float64{n1.rss(), n2.rss()}
		// Resident memory every 10 s from here to the end: flat or not.
		var series [2][]float64
		var at []time.Time
		sampled := make(chan struct{})
		sctx, stopSampling := context.WithCancel(ctx)
		go func() {
			defer close(sampled)
			t := time.NewTicker(10 * time.Second)
			defer t.Stop()
			for {
				series[0], series[1] = append(series[0], n1.rss()), append(series[1], n2.rss())
				at = append(at, time.Now())
				select {
				case <-sctx.Done():
					return
				case <-t.C:
				}
			}
		}()
		c1, c2, t0 := n1.cpu(), n2.cpu(), time.Now()
		time.Sleep(quiet)
		qd := time.Since(t0)
		quietPct := [2]float64{pctOf(n1.cpu()-c1, qd), pctOf(n2.cpu()-c2, qd)}
		fmt.Printf("spool quiet %.0fs: CPU n1 %.2f%% n2 %.2f%%, RSS n1 %.1f MiB n2 %.1f MiB (%s)\n",
			qd.Seconds(), quietPct[0], quietPct[1], rssQuiet0[0], rssQuiet0[1], loadavg())

		// One change a second. The short run (the default) adds, then
		// deletes and edits messages the tree already had; a long one
		// (FAN_BENCH_SPOOL_CHANGES_FOR) cycles add, edit, delete so the
		// tree keeps its size, and its memory can be judged flat or not.
		var adds, dels, edits []time.Duration
		rssChange0 := [2]float64{n1.rss(), n2.rss()}
		heapProfile(b, n1, n2)
		c1, c2, t0 = n1.cpu(), n2.cpu(), time.Now()
		tick := time.NewTicker(time.Second)
		// Deletes take the oldest of the tree's .wav files first, then
		// the ones this phase added, so no path is deleted twice.
		doomed := make([]string, 0, len(msgs))
		for j := range msgs {
			doomed = append(doomed, msgs[j*97%len(msgs)]+".wav")
		}
		wavSize := len(mustRead(b, filepath.Join(src, msgs[0]+".wav")))
		for i := 0; changesFor == 0 && i < 70 || changesFor > 0 && time.Since(t0) < changesFor; i++ {
			<-tick.C
			switch {
			case changesFor == 0 && i < 50:
				rel := fmt.Sprintf("default/%d/INBOX/new%04d.wav", 5000+i, i)
				data := random(48 << 10)
				w0 := time.Now()
				write(b, src, rel, data)
				adds = append(adds, waitFile(b, filepath.Join(dst, rel), len(data), w0))
			case changesFor == 0 && i < 60:
				rel := msgs[(i-50)*97%len(msgs)] + ".wav"
				w0 := time.Now()
				if err := os.Remove(filepath.Join(src, rel)); err != nil {
					b.Fatal(err)
				}
				dels = append(dels, waitGone(b, filepath.Join(dst, rel), w0))
			case changesFor == 0:
				rel := msgs[(i-60)*89%len(msgs)+1] + ".txt"
				data := random(300 + i)
				w0 := time.Now()
				write(b, src, rel, data)
				edits = append(edits, waitFile(b, filepath.Join(dst, rel), len(data), w0))
			case i%3 == 0:
				rel := fmt.Sprintf("default/%d/INBOX/cyc%06d.wav", i/3%1000, i/3)
				data := random(wavSize)
				w0 := time.Now()
				write(b, src, rel, data)
				adds = append(adds, waitFile(b, filepath.Join(dst, rel), len(data), w0))
				doomed = append(doomed, rel)
			case i%3 == 1:
				rel := msgs[(i/3*89+1)%len(msgs)] + ".txt"
				data := random(300 + i/3%1000)
				w0 := time.Now()
				write(b, src, rel, data)
				edits = append(edits, waitFile(b, filepath.Join(dst, rel), len(data), w0))
			default:
				rel := doomed[0]
				doomed = doomed[1:]
				w0 := time.Now()
				if err := os.Remove(filepath.Join(src, rel)); err != nil {
					b.Fatal(err)
				}
				dels = append(dels, waitGone(b, filepath.Join(dst, rel), w0))
			}
		}
		tick.Stop()
		heapProfile(b, n1, n2)
		cd := time.Since(t0)
		changePct := [2]float64{pctOf(n1.cpu()-c1, cd), pctOf(n2.cpu()-c2, cd)}
		rss := [2]float64{n1.rss(), n2.rss()}
		peak := [2]float64{n1.peak(), n2.peak()}
		stopSampling()
		<-sampled
		for i, name := range []string{"n1", "n2"} {
			var f []string
			for _, v := range series[i] {
				f = append(f, fmt.Sprintf("%.0f", v))
			}
			fmt.Printf("spool RSS %s every 10s (MiB): %s\n", name, strings.Join(f, " "))
		}
		// The figure is the most either node held once the initial sync
		// settled (its own peak is printed apart).
		most := max(rss[0], rss[1])
		for i := range series {
			for _, v := range series[i] {
				most = max(most, v)
			}
		}
		// Flat or not, as a number: each node's least-squares slope over
		// the samples of the change phase.
		var slope [2]float64
		for i, name := range []string{"n1", "n2"} {
			var hs, vs []float64
			most := 0.0
			for j, v := range series[i] {
				if !at[j].Before(t0) {
					hs, vs = append(hs, at[j].Sub(t0).Hours()), append(vs, v)
					most = max(most, v)
				}
			}
			slope[i] = lsSlope(hs, vs)
			last := rss[i]
			fmt.Printf("spool RSS %s over %.0fs of changes: start %.1f MiB, max %.1f MiB, last %.1f MiB, slope %+.2f MiB/h (%d samples)\n",
				name, cd.Seconds(), rssChange0[i], max(most, last), last, slope[i], len(vs))
		}
		p99 := max(pct(adds, 99), pct(dels, 99), pct(edits, 99))
		fmt.Printf("spool changes %.0fs: CPU n1 %.2f%% n2 %.2f%%, RSS n1 %.1f MiB (peak %.1f) n2 %.1f MiB (peak %.1f) (%s)\n",
			cd.Seconds(), changePct[0], changePct[1], rss[0], peak[0], rss[1], peak[1], loadavg())
		fmt.Printf("spool_files=%d spool_bytes=%d spool_initial_s=%.1f spool_add_p50_ms=%.1f spool_add_p99_ms=%.1f spool_delete_p50_ms=%.1f spool_delete_p99_ms=%.1f spool_edit_p50_ms=%.1f spool_edit_p99_ms=%.1f spool_change_p99_ms=%.1f spool_cpu_quiet_pct=%.2f spool_cpu_changes_pct=%.2f spool_rss_mib=%.1f spool_n1_cpu_quiet_pct=%.2f spool_n2_cpu_quiet_pct=%.2f spool_n1_cpu_changes_pct=%.2f spool_n2_cpu_changes_pct=%.2f spool_n1_rss_quiet_mib=%.1f spool_n2_rss_quiet_mib=%.1f spool_n1_rss_mib=%.1f spool_n2_rss_mib=%.1f spool_n1_peak_rss_mib=%.1f spool_n2_peak_rss_mib=%.1f spool_changes_s=%.0f spool_rss_slope_mib_per_h=%.2f spool_n1_rss_slope_mib_per_h=%.2f spool_n2_rss_slope_mib_per_h=%.2f\n",
			files, total, initial.Seconds(), ms(pct(adds, 50)), ms(pct(adds, 99)), ms(pct(dels, 50)), ms(pct(dels, 99)),
			ms(pct(edits, 50)), ms(pct(edits, 99)), ms(p99), max(quietPct[0], quietPct[1]), max(changePct[0], changePct[1]),
			most, quietPct[0], quietPct[1], changePct[0], changePct[1], rssQuiet0[0], rssQuiet0[1],
			rss[0], rss[1], peak[0], peak[1], cd.Seconds(), max(slope[0], slope[1]), slope[0], slope[1])
		b.ReportMetric(ms(p99), "spool_change_p99_ms")
		b.ReportMetric(most, "spool_rss_mib")
		// Each change was timed by its size or its absence alone; the
		// whole tree, modes and times included, must match as well.
		waittest.Succeeds(b, 10*time.Second, "the standby the same as the source after the changes", func() error { return same(src, dst) })
		n2.stop(b)
		n1.stop(b)
	}
}

// genSpool writes a voicemail spool of files files (a .txt of a few
// hundred bytes and a .wav for each message, in 1,000 mailboxes) holding
// about total bytes, and returns each message's path without extension.
func genSpool(b *testing.B, root string, files, total int) []string {
	b.Helper()
	n := max(files/2, 1)
	wav := max(total/n-300, 1)
	buf := random(wav)
	var msgs []string
	for i := range n {
		stem := fmt.Sprintf("default/%d/INBOX/msg%04d", i%1000, i/1000)
		// Distinct contents, cheaply: the first bytes differ.
		copy(buf, fmt.Sprintf("%08d", i))
		write(b, root, stem+".wav", buf)
		write(b, root, stem+".txt", []byte(fmt.Sprintf("[message]\norigmailbox=%d\ncallerid=\"%d\" <%d>\norigtime=%d\nduration=%d\n", i%1000, i, i, 1700000000+i, i%120)))
		msgs = append(msgs, stem)
	}
	return msgs
}

// lsSlope is the least-squares slope of ys over xs (0 under two points).
func lsSlope(xs, ys []float64) float64 {
	n := float64(len(xs))
	if len(xs) < 2 {
		return 0
	}
	var sx, sy, sxx, sxy float64
	for i := range xs {
		sx, sy, sxx, sxy = sx+xs[i], sy+ys[i], sxx+xs[i]*xs[i], sxy+xs[i]*ys[i]
	}
	d := n*sxx - sx*sx
	if d == 0 {
		return 0
	}
	return (n*sxy - sx*sy) / d
}

func mustRead(b *testing.B, p string) []byte {
	b.Helper()
	data, err := os.ReadFile(p)
	if err != nil {
		b.Fatal(err)
	}
	return data
}

// heapProfile asks each node for a heap profile (SIGUSR1) when
// FAN_BENCH_SPOOL_HEAP names a directory: one at each end of the change
// phase, so go tool pprof -base shows what the changes left behind.
func heapProfile(b *testing.B, nodes ...*spoolNode) {
	b.Helper()
	if os.Getenv("FAN_BENCH_SPOOL_HEAP") == "" {
		return
	}
	for _, n := range nodes {
		if err := n.cmd.Process.Signal(syscall.SIGUSR1); err != nil {
			b.Fatal(err)
		}
	}
}

func pctOf(cpu, wall time.Duration) float64 { return 100 * cpu.Seconds() / wall.Seconds() }

func loadavg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "load unknown"
	}
	return "load " + strings.Join(f[:3], " ")
}

// spoolNode is one replicator in a process of its own (this test binary,
// running TestSpoolNode).
type spoolNode struct {
	cmd  *exec.Cmd
	done chan error
}

func startSpoolNode(b *testing.B, url, name, root, state string) *spoolNode {
	b.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestSpoolNode$", "-test.timeout=0")
	cmd.Env = append(os.Environ(), "FAN_SPOOL_NODE="+name, "FAN_SPOOL_URL="+url, "FAN_SPOOL_ROOT="+root, "FAN_SPOOL_STATE="+state)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	n := &spoolNode{cmd: cmd, done: make(chan error, 1)}
	go func() { n.done <- cmd.Wait() }()
	b.Cleanup(func() { n.stop(b) })
	return n
}

func (n *spoolNode) stop(b *testing.B) {
	if n.cmd.ProcessState != nil {
		return
	}
	_ = n.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-n.done:
	case <-time.After(20 * time.Second):
		_ = n.cmd.Process.Kill()
		<-n.done
	}
}

// cpu is the process's CPU time (user and system) from /proc.
func (n *spoolNode) cpu() time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", n.cmd.Process.Pid))
	if err != nil {
		return 0
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * time.Second / 100 // USER_HZ
}

func (n *spoolNode) rss() float64  { return n.status("VmRSS:") }
func (n *spoolNode) peak() float64 { return n.status("VmHWM:") }

// status reads a kB figure of /proc/pid/status, in MiB.
func (n *spoolNode) status(key string) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", n.cmd.Process.Pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, key); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			return kb / 1024
		}
	}
	return 0
}

// TestSpoolNode is BenchmarkSpool's replicator process; it does nothing
// unless the benchmark started it.
func TestSpoolNode(t *testing.T) {
	name := os.Getenv("FAN_SPOOL_NODE")
	if name == "" {
		t.Skip("run by BenchmarkSpool")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})).With("node", name)
	b, err := bus.Connect(ctx, bus.Config{URL: os.Getenv("FAN_SPOOL_URL")}, bus.Identity{Cluster: cluster, Service: "replicator", Node: name}, log)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if err := b.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	st, err := store.Open(ctx, b.JS, 1)
	if err != nil {
		t.Fatal(err)
	}
	if dir := os.Getenv("FAN_BENCH_SPOOL_HEAP"); dir != "" {
		// Caught before the benchmark can send one: SIGUSR1 kills by default.
		usr1 := make(chan os.Signal, 1)
		signal.Notify(usr1, syscall.SIGUSR1)
		defer signal.Stop(usr1)
		go dumpHeaps(ctx, t, usr1, dir, name)
	}
	ex, _ := fstree.NewExcluder([]string{"tmp/"})
	cfg := replicate.Config{
		Cluster: cluster, Group: group, Node: name, StateDir: os.Getenv("FAN_SPOOL_STATE"),
		Trees:          []replicate.Tree{{Name: "voicemail", Root: os.Getenv("FAN_SPOOL_ROOT"), Exclude: ex}},
		MaxDeleteShare: 0.10, AllowDeletes: 2, Workers: 4, Owner: os.Geteuid() == 0, StorePassBytes: 64 << 20,
	}
	e, err := replicate.New(cfg, b, st, prometheus.NewRegistry(), log)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Run(ctx); err != nil {
		t.Fatal(err)
	}
}

// dumpHeaps writes dir/name-N.heap on each SIGUSR1.
func dumpHeaps(ctx context.Context, t *testing.T, usr1 <-chan os.Signal, dir, name string) {
	for n := 1; ; n++ {
		select {
		case <-ctx.Done():
			return
		case <-usr1:
		}
		f, err := os.Create(filepath.Join(dir, fmt.Sprintf("%s-%d.heap", name, n)))
		if err != nil {
			t.Log(err)
			continue
		}
		runtime.GC()
		if err := pprof.WriteHeapProfile(f); err != nil {
			t.Log(err)
		}
		f.Close()
	}
}
