// Command fan-regbench measures how fan-replicator carries PJSIP
// registrations from the holder to the standby (package regbench): SIPp
// registers -phones phones on the holder and keeps them re-registering,
// and it prints the time from each REGISTER's 200 OK to the contact in the
// standby's AstDB, the replicators' and PBXs' costs over a steady window,
// what 30 % of the phones unregistering at once does, and the share of
// phones the new holder reaches after the holder crashes:
//
//	phones=<n> pbx=<standin|asterisk> registration_to_standby_p50_ms=... registration_to_standby_p99_ms=... replicator_cpu_pct=... replicator_rss_mib=... mass_unregister_standby_ms=... registrations_frozen_s=... reachable_share=...
//	targets: ...
//
// It runs everything in a network namespace of its own (loopback only),
// which it makes and removes: it needs root, SIPp, and fan-nats,
// fan-replicator and fan-pbxstandin in -bin. With -asterisk (or
// FAN_ASTERISK) naming an Asterisk 22 install, both PBXs are real
// Asterisks instead of the stand-in.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/fanpbx/fan/lab/cmd/internal/labcmd"
	"github.com/fanpbx/fan/lab/regbench"
)

// version is set by the Makefile (-X main.version), as for fan's services.
var version = "dev"

func main() { labcmd.Main("fan-regbench", version, run) }

func run(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("fan-regbench", flag.ContinueOnError)
	bin := fs.String("bin", "bin", "directory with fan-nats, fan-replicator and fan-pbxstandin")
	asterisk := fs.String("asterisk", os.Getenv("FAN_ASTERISK"), "an Asterisk 22 install (its sbin/asterisk) to run as both PBXs instead of the stand-in (FAN_ASTERISK)")
	phones := fs.Int("phones", 2000, "phones registered on the holder")
	refresh := fs.Duration("refresh", 150*time.Second, "how often each phone registers again")
	window := fs.Duration("window", time.Minute, "steady window the costs are measured over")
	latency := fs.Duration("latency", time.Minute, "window the re-registrations are timed in")
	dir := fs.String("dir", "", "work directory (default: a new one under the system's temp dir, removed after)")
	profile := fs.String("profile", "", "save the replicators' CPU and allocation profiles over the steady window here (build fan-replicator with -tags pprof)")
	debug := fs.Bool("debug", false, "run the replicators with -log-level debug (logs in -dir)")
	inside := fs.String("inside", "", "(internal) run in this network namespace")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *inside == "" {
		return outside(ctx)
	}
	absBin, err := filepath.Abs(*bin)
	if err != nil {
		return err
	}
	work := *dir
	if work == "" {
		if work, err = os.MkdirTemp("", "fan-regbench-"); err != nil {
			return err
		}
		defer os.RemoveAll(work)
	}
	return regbench.Run(ctx, regbench.Options{Bin: absBin, Asterisk: *asterisk, Dir: work, Phones: *phones,
		Refresh: *refresh, Window: *window, Latency: *latency, Profile: *profile, Debug: *debug, Out: os.Stdout})
}

// outside makes the namespace, runs this program again inside it and
// removes the namespace, whatever happened.
func outside(ctx context.Context) error {
	if os.Geteuid() != 0 {
		return errors.New("needs root: it runs the PBXs, replicators and phones in a network namespace of its own")
	}
	if _, err := exec.LookPath("sipp"); err != nil {
		return errors.New("needs SIPp (Debian: sip-tester)")
	}
	ns := "fanreg" + strconv.Itoa(os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		return fmt.Errorf("ip netns add %s: %w: %s", ns, err, out)
	}
	defer func() { _ = exec.Command("ip", "netns", "del", ns).Run() }()
	if out, err := exec.Command("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up").CombinedOutput(); err != nil {
		return fmt.Errorf("lo up in %s: %w: %s", ns, err, out)
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	args := append([]string{"netns", "exec", ns, self, "-inside", ns}, os.Args[1:]...)
	cmd := exec.Command("ip", args...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = nil, os.Stdout, os.Stderr
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-done:
			return err
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			return <-done
		}
	}
}
