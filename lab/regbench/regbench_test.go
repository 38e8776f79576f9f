package regbench

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fanpbx/fan/lab/prereq"
)

// TestRegistrationsEndToEnd runs the benchmark small (30 phones, short
// windows) and checks what it must show whatever the machine's load: every
// registration timed reached the standby, the churn reached it, and after
// the crash the new holder reached every phone. The figures are the
// benchmark's business, not this test's. It is opt-in (minutes, root,
// SIPp): FAN_REGBENCH=1 FAN_BIN=dir (fan-nats, fan-replicator,
// fan-pbxstandin), and FAN_ASTERISK=/opt/asterisk-22 runs it on two real
// Asterisk 22s. It runs itself again inside a network namespace it makes.
func TestRegistrationsEndToEnd(t *testing.T) {
	if os.Getenv("FAN_REGBENCH") == "" {
		t.Skip("set FAN_REGBENCH=1 and FAN_BIN (and FAN_ASTERISK for real Asterisks) for this run")
	}
	if os.Getenv("FAN_REGBENCH_INSIDE") != "" {
		inside(t)
		return
	}
	prereq.Root(t)
	prereq.Need(t, "sip-tester", "sipp")
	if os.Getenv("FAN_BIN") == "" {
		prereq.SkipOrFail(t, "FAN_BIN is not set")
	}
	ns := fmt.Sprintf("fanregt%d", os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
	if out, err := exec.Command("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up").CombinedOutput(); err != nil {
		t.Fatalf("lo up: %v: %s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "ip", "netns", "exec", ns, os.Args[0], "-test.run", "^TestRegistrationsEndToEnd$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), "FAN_REGBENCH_INSIDE=1")
	out, err := cmd.CombinedOutput()
	t.Logf("inside the namespace:\n%s", out)
	if err != nil {
		t.Fatalf("the run inside the namespace failed: %v", err)
	}
}

func inside(t *testing.T) {
	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	err := Run(ctx, Options{Bin: os.Getenv("FAN_BIN"), Asterisk: os.Getenv("FAN_ASTERISK"), Dir: t.TempDir(), Phones: 30,
		Refresh: 10 * time.Second, Window: 5 * time.Second, Latency: 10 * time.Second, Out: &out})
	t.Log(out.String())
	if err != nil {
		t.Fatal(err)
	}
	figures := map[string]string{}
	for _, line := range strings.Split(out.String(), "\n") {
		if !strings.HasPrefix(line, "phones=") {
			continue
		}
		for _, kv := range strings.Fields(line) {
			k, v, _ := strings.Cut(kv, "=")
			figures[k] = v
		}
	}
	num := func(k string) float64 {
		f, err := strconv.ParseFloat(figures[k], 64)
		if err != nil {
			t.Fatalf("%s=%q: %v", k, figures[k], err)
		}
		return f
	}
	if n := num("registrations_timed"); n < 10 {
		t.Errorf("only %v registrations timed", n)
	}
	if n := num("registrations_not_on_standby_in_10s"); n != 0 {
		t.Errorf("%v registrations did not reach the standby within 10 s", n)
	}
	num("unregister_to_standby_max_ms")
	num("mass_unregister_standby_ms") // "never" when the churn did not reach the standby
	num("registrations_frozen_s")
	if s := num("reachable_share"); s != 1 {
		t.Errorf("the new holder reached %v of the phones", s)
	}
	if n := num("phones_registered_at_crash"); n != 24 {
		t.Errorf("%v phones registered at the crash, want 24 (30 - 9 unregistered + 3 from new addresses)", n)
	}
}
