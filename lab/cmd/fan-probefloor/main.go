// Command fan-probefloor is the prober benchmark's references (lab/probefloor):
// -mode floor runs the checks with nothing but their socket work, -mode exec
// runs each check as a process of its own per interval (keepalived's
// vrrp_script way), and -once runs one check once (the process exec starts).
// After -warmup it measures -window and prints one result line: its CPU,
// its children's included, and the runs per kind.
//
//	fan-probefloor -mode floor -check ami,50,127.0.0.1:5038 -check tcp,25,127.0.0.1:80 -user fan -secret s
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/fanpbx/fan/lab/probefloor"
)

type specs []string

func (s *specs) String() string     { return fmt.Sprint(*s) }
func (s *specs) Set(v string) error { *s = append(*s, v); return nil }

func main() {
	var checkSpecs specs
	flag.Var(&checkSpecs, "check", "kind,count,address (repeatable); kinds: ami, sip, siptcp, tcp, http (a URL)")
	mode := flag.String("mode", "floor", "floor (one loop, kept connections) or exec (a process per check per interval)")
	interval := flag.Duration("interval", 200*time.Millisecond, "each check's interval")
	timeout := flag.Duration("timeout", 150*time.Millisecond, "each run's timeout")
	warmup := flag.Duration("warmup", 2*time.Second, "time before the measured window")
	window := flag.Duration("window", 10*time.Second, "measured window")
	user := flag.String("user", "", "AMI username")
	secret := flag.String("secret", "", "AMI secret")
	once := flag.String("once", "", "run one check of this kind once against -addr and exit (status 1 when it fails)")
	addr := flag.String("addr", "", "the -once check's address")
	flag.Parse()
	cred := probefloor.Credentials{Username: *user, Secret: *secret}

	if *once != "" {
		ctx, cancel := context.WithTimeout(context.Background(), *timeout)
		defer cancel()
		if err := probefloor.Once(ctx, probefloor.Check{Kind: *once, Addr: *addr}, cred); err != nil {
			fmt.Fprintln(os.Stderr, err)
			cancel()
			os.Exit(1)
		}
		return
	}
	var checks []probefloor.Check
	for _, s := range checkSpecs {
		c, err := probefloor.ParseSpec(s)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		checks = append(checks, c...)
	}
	if len(checks) == 0 {
		fmt.Fprintln(os.Stderr, "fan-probefloor: no -check")
		os.Exit(2)
	}
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintln(os.Stderr, "fan-probefloor: own path:", err)
		os.Exit(1)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	counts := &probefloor.Counts{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		switch *mode {
		case "exec":
			probefloor.Exec(ctx, self, checks, cred, *interval, *timeout, counts)
		default:
			probefloor.Floor(ctx, checks, cred, *interval, *timeout, counts)
		}
	}()
	select {
	case <-ctx.Done():
		return
	case <-time.After(*warmup):
	}
	r0, f0 := counts.Snapshot()
	t0, c0 := time.Now(), cpu()
	select {
	case <-ctx.Done():
		return
	case <-time.After(*window):
	}
	r1, f1 := counts.Snapshot()
	res := probefloor.Result{Mode: *mode, Window: time.Since(t0), CPU: cpu() - c0, Runs: map[string]int{}}
	for k, n := range r1 {
		res.Runs[k] = n - r0[k]
	}
	for k, n := range f1 {
		res.Failed += n - f0[k]
	}
	fmt.Println(res)
	stop()
	<-done
}

// cpu is this process's user and system time plus its reaped children's.
func cpu() time.Duration {
	var total time.Duration
	for _, who := range []int{syscall.RUSAGE_SELF, syscall.RUSAGE_CHILDREN} {
		var ru syscall.Rusage
		if err := syscall.Getrusage(who, &ru); err == nil {
			total += time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
		}
	}
	return total
}
