package nodesim

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/fanpbx/fan/lab/procstat"
	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/logtest"
	"github.com/fanpbx/fan/pkg/platform/porttest"
	"github.com/fanpbx/fan/services/arbiter/internal/decide"
)

var (
	scaleNodes   = flag.Int("scale.nodes", 1000, "simulated nodes (groups of two and three)")
	scaleWindow  = flag.Duration("scale.window", time.Minute, "measured window")
	scaleRate    = flag.Float64("scale.rate", 4, "health transitions per second over all nodes (half of them take a holder down)")
	scaleRecover = flag.Duration("scale.recover", 3*time.Second, "how long a node taken down stays down")
	scaleBin     = flag.String("scale.bin", "", "directory with fan-arbiter and fan-nats (default $FAN_BIN; unset: built here)")
	scaleProfile = flag.String("scale.profile", "", "directory for the arbiter's CPU and allocation profiles over the window (builds fan-arbiter with the pprof tag)")
)

// benchPolicy is the policy's defaults but for the flap cap, which would
// freeze the groups a small run (-scale.nodes) churns many times an hour.
const benchPolicy = "policy:\n  max_moves_per_hour: -1\n"

// BenchmarkScale runs the arbiter against a thousand simulated nodes
// through a real NATS server: fan-nats and fan-arbiter as processes of
// their own (so their CPU time and memory are theirs, read from /proc),
// and the nodes in this process, each with its own connection, speaking
// the prober's protocol (heartbeat every second, beacon every 100 ms) and
// answering commands as executors do. After every group is placed it
// churns health transitions for the window and prints name=value lines:
// the arbiter's and the server's CPU in cores, the arbiter's resident
// memory, and the time from a transition's post to its first command
// stored in FAN_CMD.
//
//	make bench-scale                       (1,000 nodes, 60 s)
//	make bench-scale NODES=100 SCALE_WINDOW=15s
func BenchmarkScale(b *testing.B) {
	if *scaleNodes < 2 {
		b.Fatalf("-scale.nodes %d: at least 2", *scaleNodes)
	}
	dir := b.TempDir()
	arbiterBin, natsBin := binaries(b, dir)
	natsAddr := porttest.Addr(b)
	nats := startProcess(b, natsBin, nil, "-listen", natsAddr, "-store", filepath.Join(dir, "nats"), "-name", "scale")
	url := "nats://" + natsAddr

	nodes, groups := Layout(*scaleNodes)
	cfgPath := filepath.Join(dir, "arbiter.yaml")
	if err := os.WriteFile(cfgPath, []byte(ArbiterConfig("scale", "arb1", url, "pbx", groups, benchPolicy)), 0o600); err != nil {
		b.Fatal(err)
	}
	var env []string
	var pprofAddr string
	if *scaleProfile != "" {
		pprofAddr = porttest.Addr(b)
		env = append(os.Environ(), "FAN_PPROF="+pprofAddr)
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	start := time.Now()
	sctx, scancel := context.WithTimeout(ctx, 2*time.Minute)
	sim, err := Start(sctx, Config{Cluster: "scale", URL: url, Nodes: nodes, Check: "pbx", Log: log})
	scancel()
	if err != nil {
		b.Fatal(err)
	}
	defer sim.Close()
	connected := time.Since(start)
	arbiter := startProcess(b, arbiterBin, env, "-config", cfgPath, "-log-level", "error")
	if err := sim.SetAll(events.HealthUp); err != nil {
		b.Fatal(err)
	}
	pctx, pcancel := context.WithTimeout(ctx, 5*time.Minute)
	err = sim.WaitPlaced(pctx, groups)
	pcancel()
	if err != nil {
		b.Fatalf("%v\narbiter log:\n%s", err, arbiter.logs.String())
	}
	placed := time.Since(start) - connected
	b.Logf("%d nodes connected in %v, %d groups placed %v later", len(nodes), connected.Round(time.Millisecond), len(groups), placed.Round(time.Millisecond))

	b.ResetTimer()
	for range b.N {
		profiled := make(chan error, 2)
		if pprofAddr != "" {
			for _, p := range []string{"profile", "allocs"} {
				go func() {
					profiled <- procstat.FetchProfile(pprofAddr, p, *scaleWindow, filepath.Join(*scaleProfile, p+".pprof"))
				}()
			}
		}
		sim.Reset()
		a0, n0, s0 := sample(b, arbiter.pid()), sample(b, nats.pid()), sample(b, os.Getpid())
		wctx, wcancel := context.WithTimeout(ctx, *scaleWindow)
		err := sim.Churn(wctx, Churn{Groups: groups, Rate: *scaleRate, RecoverAfter: *scaleRecover})
		wcancel()
		if err != nil {
			b.Fatal(err)
		}
		a1, n1, s1 := sample(b, arbiter.pid()), sample(b, nats.pid()), sample(b, os.Getpid())
		// Commands caused by the last transitions are still on their way:
		// a moment for them, outside the CPU window.
		time.Sleep(200 * time.Millisecond)
		st := sim.Stats()
		rss, err := procstat.RSS(arbiter.pid())
		if err != nil {
			b.Fatal(err)
		}
		hwm, _ := procstat.HWM(arbiter.pid())
		lat := slices.Clone(st.Latencies)
		slices.Sort(lat)
		fmt.Printf("config nodes=%d groups=%d group_sizes=2,3 heartbeat_ms=1000 beacon_ms=100 transitions_per_s=%g recover_after_s=%g window_s=%g policy=defaults,max_moves_per_hour=-1\n",
			len(nodes), len(groups), *scaleRate, scaleRecover.Seconds(), scaleWindow.Seconds())
		fmt.Printf("placement_s=%.1f\n", placed.Seconds())
		fmt.Printf("arbiter_cpu_share=%.3f\n", procstat.Share(a0, a1))
		fmt.Printf("arbiter_rss_mb=%.1f\n", rss)
		fmt.Printf("arbiter_rss_peak_mb=%.1f\n", hwm)
		fmt.Printf("nats_cpu_share=%.3f\n", procstat.Share(n0, n1))
		fmt.Printf("simulator_cpu_share=%.3f\n", procstat.Share(s0, s1))
		fmt.Printf("transitions=%d\n", st.Transitions)
		fmt.Printf("commands=%d\n", st.Commands)
		fmt.Printf("claims=%d\n", st.Claims)
		fmt.Printf("correlated=%d\n", len(lat))
		fmt.Printf("p50_ms=%.1f\n", ms(quantile(lat, 0.50)))
		fmt.Printf("p99_ms=%.1f\n", ms(quantile(lat, 0.99)))
		fmt.Printf("max_ms=%.1f\n", ms(quantile(lat, 1)))
		if full, term, err := stateSizes(ctx, sim); err != nil {
			b.Error(err)
		} else {
			// The state is persisted whole before every command; a new
			// term records it without the per-node view in one event.
			fmt.Printf("state_bytes=%d\n", full)
			fmt.Printf("term_state_bytes=%d (one event holds at most %d)\n", term, events.MaxEncodedSize)
		}
		b.ReportMetric(procstat.Share(a0, a1), "arbiter-cores")
		b.ReportMetric(ms(quantile(lat, 0.99)), "p99-ms")
		if pprofAddr != "" {
			for range 2 {
				if err := <-profiled; err != nil {
					b.Error(err)
				}
			}
		}
		if len(lat) == 0 {
			b.Errorf("no command followed any of %d transitions\narbiter log:\n%s", st.Transitions, arbiter.logs.String())
		}
	}
}

// stateSizes reads the arbiter's persisted state: its size, and the size
// of what a term record carries of it (without the per-node view).
func stateSizes(ctx context.Context, sim *Sim) (full, term int, err error) {
	kv, err := sim.ctrl.StateKV(ctx)
	if err != nil {
		return 0, 0, err
	}
	e, err := kv.Get(ctx, events.ArbiterStateKey(sim.cfg.Cluster))
	if err != nil {
		return 0, 0, fmt.Errorf("arbiter state: %w", err)
	}
	var st decide.State
	if err := json.Unmarshal(e.Value(), &st); err != nil {
		return 0, 0, fmt.Errorf("arbiter state: %w", err)
	}
	for i := range st.Groups {
		st.Groups[i].Nodes = nil
	}
	t, err := json.Marshal(st)
	return len(e.Value()), len(t), err
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// quantile of sorted durations (nearest rank); 0 when empty.
func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q*float64(len(sorted))+0.5) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

func sample(b *testing.B, pid int) procstat.Sample {
	s, err := procstat.Take(pid)
	if err != nil {
		b.Fatal(err)
	}
	return s
}

// binaries returns fan-arbiter and fan-nats: from -scale.bin or FAN_BIN,
// else built into dir (the arbiter with the pprof tag when profiling).
func binaries(b *testing.B, dir string) (arbiter, nats string) {
	from := *scaleBin
	if from == "" {
		from = os.Getenv("FAN_BIN")
	}
	build := func(name, pkg string, tags ...string) string {
		out := filepath.Join(dir, name)
		args := append([]string{"build", "-o", out}, tags...)
		if o, err := exec.Command("go", append(args, pkg)...).CombinedOutput(); err != nil {
			b.Fatalf("build %s: %v\n%s", name, err, o)
		}
		return out
	}
	if from != "" && *scaleProfile == "" {
		arbiter = filepath.Join(from, "fan-arbiter")
	} else if *scaleProfile != "" {
		arbiter = build("fan-arbiter", "github.com/fanpbx/fan/services/arbiter/cmd/fan-arbiter", "-tags", "pprof")
	} else {
		arbiter = build("fan-arbiter", "github.com/fanpbx/fan/services/arbiter/cmd/fan-arbiter")
	}
	if from != "" {
		nats = filepath.Join(from, "fan-nats")
	} else {
		nats = build("fan-nats", "github.com/fanpbx/fan/cmd/fan-nats")
	}
	return arbiter, nats
}

type process struct {
	cmd  *exec.Cmd
	logs *logtest.Buffer
}

func (p *process) pid() int { return p.cmd.Process.Pid }

// startProcess runs bin until the benchmark ends (SIGTERM, then SIGKILL
// after 10 s), its output kept for a failure's message.
func startProcess(b *testing.B, bin string, env []string, args ...string) *process {
	p := &process{cmd: exec.Command(bin, args...), logs: &logtest.Buffer{}}
	p.cmd.Env = env
	p.cmd.Stdout, p.cmd.Stderr = p.logs, p.logs
	// An interrupted benchmark takes its processes with it.
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		b.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = p.cmd.Wait(); close(done) }()
	b.Cleanup(func() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = p.cmd.Process.Kill()
			<-done
		}
	})
	return p
}
