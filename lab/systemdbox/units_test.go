package systemdbox

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// One host running everything on a loopback bus: fan-nats, the three PBX
// services (node n1) and the witness's two (node ctl). Loopback needs
// neither TLS nor identities; everything else is the production units and
// package as shipped. The floating address lives on a veth interface made
// inside the box (this kernel has no dummy driver), in 192.0.2.0/24.
const (
	floatIface = "fan0"
	floatAddr  = "192.0.2.10/24"
)

// ipmoverBody is the ipmover's configuration after its cluster, node, bus
// and http_listen, on every box: the floating address on the box's link,
// answering without a PBX.
const ipmoverBody = `interface: ` + floatIface + `
groups:
  - name: pbx
    prefixes: [` + floatAddr + `]
state_file: /var/lib/fan/ipmover/state.json
answer: {mode: hot}
verify: {enabled: false}
`

var boxConfigs = map[string]string{
	"/etc/fan/nats.yaml": `server_name: nats-box
listen: 127.0.0.1:4222
store_dir: /var/lib/fan/nats
`,
	"/etc/fan/prober.yaml": `cluster: box
node: n1
bus: {url: "nats://127.0.0.1:4222", replicas: 1}
http_listen: 127.0.0.1:9101
checks:
  - name: bus-port
    kind: tcp
    role: self
    address: 127.0.0.1:4222
    interval: 200ms
    timeout: 150ms
    rise: 2
    fall: 3
`,
	"/etc/fan/ipmover.yaml": `cluster: box
node: n1
bus: {url: "nats://127.0.0.1:4222", replicas: 1}
http_listen: 127.0.0.1:9102
` + ipmoverBody,
	"/etc/fan/replicator.yaml": `cluster: box
node: n1
bus: {url: "nats://127.0.0.1:4222", replicas: 1}
http_listen: 127.0.0.1:9103
group: pbx
state_dir: /var/lib/fan/replicator
trees:
  - name: asterisk-etc
    path: /etc/asterisk
`,
	"/etc/fan/arbiter.yaml": `cluster: box
node: ctl
bus: {url: "nats://127.0.0.1:4222", replicas: 1}
http_listen: 127.0.0.1:9104
lease_ttl: 3s
groups:
  - name: pbx
    addresses: [` + floatAddr + `]
    nodes: [n1, n2]
    health_check: bus-port
`,
	"/etc/fan/scheduler.yaml": schedulerYAML(1),
}

// schedulerYAML has n groups with a nightly window each (the reload test
// goes from one to two).
func schedulerYAML(n int) string {
	s := `cluster: box
node: ctl
bus: {url: "nats://127.0.0.1:4222", replicas: 1}
http_listen: 127.0.0.1:9105
groups:
`
	for i := range n {
		name := "pbx"
		if i > 0 {
			name = fmt.Sprintf("pbx%d", i+1)
		}
		s += fmt.Sprintf(`  - name: %s
    windows:
      - name: nightly
        time_zone: UTC
        weekly:
          - {days: [daily], from: "02:00", to: "05:00"}
`, name)
	}
	return s
}

// services are the five units with a watchdog and /healthz (port).
var services = []struct {
	unit string
	port int
}{
	{"fan-prober", 9101}, {"fan-ipmover", 9102}, {"fan-replicator", 9103}, {"fan-arbiter", 9104}, {"fan-scheduler", 9105},
}

func allUnits() []string {
	u := []string{"fan-nats"}
	for _, s := range services {
		u = append(u, s.unit)
	}
	return u
}

// setUpHost installs the package and writes the configuration the
// services need on this one host.
func setUpHost(t *testing.T, ctx context.Context, b *Box, deb string) {
	t.Helper()
	if err := b.CopyIn(ctx, deb, "/root/fan.deb"); err != nil {
		t.Fatal(err)
	}
	if out, err := b.Output(ctx, "dpkg -i /root/fan.deb"); err != nil {
		t.Fatal(err)
	} else {
		t.Logf("dpkg -i: %s", lastLines(out, 3))
	}
	for path, content := range boxConfigs {
		if err := b.WriteFile(ctx, path, "0640", content); err != nil {
			t.Fatal(err)
		}
	}
	// The group owns the configuration (the services read it as fan); the
	// floating address's interface; the replicator's tree.
	if _, err := b.Output(ctx, fmt.Sprintf(`chgrp fan /etc/fan/*.yaml
ip link add %[1]s type veth peer name %[1]sp && ip link set %[1]s up && ip link set %[1]sp up
mkdir -p /etc/asterisk && echo '; test' > /etc/asterisk/extensions.conf`, floatIface)); err != nil {
		t.Fatal(err)
	}
}

// TestUnitsUnderSystemd installs fan's package in a Debian 12 box booted
// by systemd and checks what the units promise: readiness only after
// READY=1, every unit working under its hardening, the watchdog restarting
// a stopped service, kill -9 of the ipmover leaving no floating address,
// and reload of the scheduler.
func TestUnitsUnderSystemd(t *testing.T) {
	deb := PackageForTest(t, "FAN_DEB")
	b := BootForTest(t, ImageForTest(t), Options{Hostname: "fanbox"})[0]
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	setUpHost(t, ctx, b, deb)

	// Type=notify: a service is not active before it said READY=1, which
	// it says only once it is on the bus with its streams. Started with no
	// bus, it must stay activating ("connecting to the bus").
	if _, err := b.Output(ctx, "systemctl start --no-block fan-scheduler"); err != nil {
		t.Fatal(err)
	}
	state, ok := WaitFor(ctx, 30*time.Second, func() (bool, string) {
		p, err := b.Show(ctx, "fan-scheduler", "ActiveState", "SubState", "StatusText")
		return err == nil && p["SubState"] == "start" && strings.Contains(p["StatusText"], "connecting"), fmt.Sprint(p, err)
	})
	if !ok {
		t.Fatalf("fan-scheduler without a bus: want activating/start with STATUS connecting, got %s", state)
	}
	// Held for a while: nothing lets it become active without the bus.
	time.Sleep(2 * time.Second)
	if p, _ := b.Show(ctx, "fan-scheduler", "ActiveState"); p["ActiveState"] != "activating" {
		t.Fatalf("fan-scheduler became %s with no bus: it was not waiting for READY=1", p["ActiveState"])
	}
	// fan-nats is Type=notify too: systemctl start returns once it
	// accepts clients.
	if _, err := b.Output(ctx, "systemctl start fan-nats && fanctl --url nats://127.0.0.1:4222 provision --replicas 1 "+
		"--events-mib 64 --live-mib 16 --commands-mib 16 --state-mib 16"); err != nil {
		t.Fatal(err)
	}
	nats, err := b.Show(ctx, "fan-nats", "ActiveEnterTimestampMonotonic")
	if err != nil {
		t.Fatal(err)
	}
	state, ok = WaitFor(ctx, 60*time.Second, func() (bool, string) {
		p, err := b.Show(ctx, "fan-scheduler", "ActiveState", "StatusText")
		return err == nil && p["ActiveState"] == "active", fmt.Sprint(p, err)
	})
	if !ok {
		t.Fatalf("fan-scheduler never became active once the bus was there: %s", state)
	}
	if p, _ := b.Show(ctx, "fan-scheduler", "ActiveEnterTimestampMonotonic"); atoi(p["ActiveEnterTimestampMonotonic"]) <= atoi(nats["ActiveEnterTimestampMonotonic"]) {
		t.Fatalf("fan-scheduler became active at %s µs, before its bus (%s µs)", p["ActiveEnterTimestampMonotonic"], nats["ActiveEnterTimestampMonotonic"])
	}

	// Every unit, enabled and started the way the package says; systemctl
	// returns once each one is ready.
	if _, err := b.Output(ctx, "systemctl enable --now "+strings.Join(allUnits(), " ")); err != nil {
		t.Fatal(err)
	}
	checkAllWorking(t, ctx, b, "after start")

	// The arbiter places the group on n1 (its only healthy node) and the
	// ipmover adds the floating address.
	if state, ok := WaitFor(ctx, 60*time.Second, func() (bool, string) {
		return hasAddr(ctx, b)
	}); !ok {
		t.Fatalf("the floating address never came to %s: %s", floatIface, state)
	}

	t.Run("the replicator yields to the PBX", func(t *testing.T) { replicatorYields(t, ctx, b) })
	t.Run("kill -9 ipmover releases the address", func(t *testing.T) { killIpmover(t, ctx, b) })
	t.Run("reload scheduler", func(t *testing.T) { reloadScheduler(t, ctx, b) })
	t.Run("watchdog restarts a stopped service", func(t *testing.T) { watchdog(t, ctx, b) })
	checkAllWorking(t, ctx, b, "at the end")
}

// checkAllWorking: every unit active, /healthz 200, and nothing in the
// journal that the sandbox refused.
func checkAllWorking(t *testing.T, ctx context.Context, b *Box, when string) {
	t.Helper()
	for _, u := range allUnits() {
		p, err := b.Show(ctx, u, "ActiveState", "SubState", "Result")
		if err != nil || p["ActiveState"] != "active" || p["SubState"] != "running" {
			t.Errorf("%s %s: %v %v", when, u, p, err)
		}
	}
	for _, s := range services {
		// /healthz from inside the box, with bash's /dev/tcp (minbase
		// has no HTTP client).
		code, ok := WaitFor(ctx, 30*time.Second, func() (bool, string) {
			out, _ := b.Output(ctx, httpGet(s.port, "/healthz"))
			first := firstLine(out)
			return strings.Contains(first, " 200 "), lastLines(out, 4)
		})
		if !ok {
			t.Errorf("%s %s /healthz: %s", when, s.unit, code)
		}
	}
	out, err := b.Output(ctx, "journalctl --no-pager -o cat "+unitArgs()+
		" | grep -iE 'permission denied|operation not permitted|read-only file system|EACCES|EPERM|bad system call|SIGSYS' || true")
	if err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(out) != "" {
		t.Errorf("%s: the sandbox refused something:\n%s", when, lastLines(out, 30))
	}
}

func unitArgs() string {
	var b strings.Builder
	for _, u := range allUnits() {
		b.WriteString(" -u " + u)
	}
	return b.String()
}

func httpGet(port int, path string) string {
	return fmt.Sprintf(`exec 3<>/dev/tcp/127.0.0.1/%d && printf 'GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' >&3 && timeout 5 cat <&3`, port, path)
}

func hasAddr(ctx context.Context, b *Box) (bool, string) {
	out, err := b.Output(ctx, "ip -o -4 addr show dev "+floatIface)
	return err == nil && strings.Contains(out, " "+floatAddr+" "), strings.TrimSpace(out)
}

// killIpmover: SIGKILL of the ipmover holding the address. The process has
// no chance to release it; ExecStopPost (`fan-ipmover -release-all`) must,
// before systemd restarts it (RestartSec=1s), and the restarted ipmover
// claims it again when the arbiter says so.
func killIpmover(t *testing.T, ctx context.Context, b *Box) {
	before, err := b.Show(ctx, "fan-ipmover", "MainPID", "NRestarts")
	if err != nil {
		t.Fatal(err)
	}
	// Poll inside the box every 20 ms: the address must be seen gone
	// between the kill and the restarted ipmover's claim (more than the
	// 1 s RestartSec apart).
	script := fmt.Sprintf(`kill -9 %s
for i in $(seq 500); do
	if ! ip -o -4 addr show dev %s | grep -q ' %s '; then echo "gone after ${i}x20ms"; exit 0; fi
	sleep 0.02
done
echo "still there after 10 s"; exit 1`, before["MainPID"], floatIface, floatAddr)
	out, err := b.Output(ctx, script)
	if err != nil {
		t.Fatalf("kill -9 of fan-ipmover (pid %s) left %s on %s: %v", before["MainPID"], floatAddr, floatIface, err)
	}
	t.Logf("kill -9 fan-ipmover: address %s", strings.TrimSpace(out))
	state, ok := WaitFor(ctx, 60*time.Second, func() (bool, string) {
		p, err := b.Show(ctx, "fan-ipmover", "ActiveState", "MainPID", "NRestarts")
		has, addrs := hasAddr(ctx, b)
		return err == nil && p["ActiveState"] == "active" && p["MainPID"] != before["MainPID"] &&
			atoi(p["NRestarts"]) > atoi(before["NRestarts"]) && has, fmt.Sprint(p, " ", addrs)
	})
	if !ok {
		t.Fatalf("fan-ipmover not restarted holding the address again: %s", state)
	}
	out, err = b.Output(ctx, "journalctl --no-pager -o cat -u fan-ipmover | grep -c 'released floating address without the bus' || true")
	if err != nil || atoi(strings.TrimSpace(out)) < 1 {
		t.Fatalf("no release-all in fan-ipmover's journal (ExecStopPost): %q %v", out, err)
	}
}

// replicatorYields: the replicator's process runs at its unit's lower CPU
// and I/O priorities, and the services on the failover path at the
// default, so a loaded PBX host delays replication, never a verdict. The
// box's cgroups are read-only (the host's own hierarchy), so the weights
// are read as systemd parsed them; nice and the I/O priority are the
// kernel's, read from the running processes.
func replicatorYields(t *testing.T, ctx context.Context, b *Box) {
	for _, u := range allUnits() {
		p, err := b.Show(ctx, u, "MainPID", "CPUWeight", "IOWeight")
		if err != nil {
			t.Fatal(err)
		}
		out, err := b.Output(ctx, fmt.Sprintf("awk '{print $19}' /proc/%s/stat && ionice -p %s", p["MainPID"], p["MainPID"]))
		if err != nil {
			t.Fatalf("%s (pid %s): %v", u, p["MainPID"], err)
		}
		nice, ioPrio, _ := strings.Cut(strings.TrimSpace(out), "\n")
		t.Logf("%s: nice %s, I/O %s, CPUWeight %s, IOWeight %s", u, nice, ioPrio, p["CPUWeight"], p["IOWeight"])
		want := struct{ nice, io, cpuWeight, ioWeight string }{"0", "none: prio 0", "[not set]", "[not set]"}
		if u == "fan-replicator" {
			want = struct{ nice, io, cpuWeight, ioWeight string }{"10", "best-effort: prio 7", "20", "20"}
		}
		if nice != want.nice || ioPrio != want.io || p["CPUWeight"] != want.cpuWeight || p["IOWeight"] != want.ioWeight {
			t.Errorf("%s: nice %q, I/O %q, CPUWeight %q, IOWeight %q; want %q, %q, %q, %q",
				u, nice, ioPrio, p["CPUWeight"], p["IOWeight"], want.nice, want.io, want.cpuWeight, want.ioWeight)
		}
	}
}

// reloadScheduler: systemctl reload applies the windows of the changed
// file in the same process.
func reloadScheduler(t *testing.T, ctx context.Context, b *Box) {
	before, err := b.Show(ctx, "fan-scheduler", "MainPID", "NRestarts")
	if err != nil {
		t.Fatal(err)
	}
	if err := b.WriteFile(ctx, "/etc/fan/scheduler.yaml", "0640", schedulerYAML(2)); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Output(ctx, "chgrp fan /etc/fan/scheduler.yaml && systemctl reload fan-scheduler"); err != nil {
		t.Fatal(err)
	}
	state, ok := WaitFor(ctx, 20*time.Second, func() (bool, string) {
		out, _ := b.Output(ctx, "journalctl --no-pager -o cat -u fan-scheduler | grep 'windows reloaded' | tail -1")
		return strings.Contains(out, `"groups":2`), out
	})
	if !ok {
		t.Fatalf("fan-scheduler did not log the reloaded windows: %q", state)
	}
	after, _ := b.Show(ctx, "fan-scheduler", "ActiveState", "MainPID", "NRestarts")
	if after["MainPID"] != before["MainPID"] || after["NRestarts"] != before["NRestarts"] || after["ActiveState"] != "active" {
		t.Fatalf("reload restarted fan-scheduler: before %v, after %v", before, after)
	}
	out, _ := b.Output(ctx, httpGet(9105, "/metrics")+" | grep '^fan_reloads_total'")
	if !regexp.MustCompile(`fan_reloads_total\{result="[a-z_]*"\} [1-9]`).MatchString(out) {
		t.Fatalf("fan_reloads_total does not count the reload: %q", out)
	}
	t.Logf("reload: %s", strings.TrimSpace(out))
}

// watchdog: SIGSTOP every service at once; each stops pinging, and systemd
// must kill (SIGABRT after SIGCONT) and restart it within WatchdogSec plus
// the restart itself.
func watchdog(t *testing.T, ctx context.Context, b *Box) {
	type stopped struct {
		pid, restarts string
		limit         time.Duration
	}
	st := map[string]stopped{}
	var pids []string
	for _, s := range services {
		p, err := b.Show(ctx, s.unit, "MainPID", "NRestarts", "WatchdogUSec")
		if err != nil {
			t.Fatal(err)
		}
		wd, err := time.ParseDuration(strings.ReplaceAll(p["WatchdogUSec"], " ", ""))
		if err != nil || wd == 0 {
			t.Fatalf("%s: WatchdogUSec %q: %v", s.unit, p["WatchdogUSec"], err)
		}
		// The watchdog's own period, RestartSec, and a start on a
		// shared 2-core machine.
		st[s.unit] = stopped{p["MainPID"], p["NRestarts"], wd + 30*time.Second}
		pids = append(pids, p["MainPID"])
	}
	start := time.Now()
	if _, err := b.Output(ctx, "kill -STOP "+strings.Join(pids, " ")); err != nil {
		t.Fatal(err)
	}
	for _, s := range services {
		want := st[s.unit]
		state, ok := WaitFor(ctx, want.limit-time.Since(start), func() (bool, string) {
			p, err := b.Show(ctx, s.unit, "ActiveState", "MainPID", "NRestarts")
			return err == nil && p["ActiveState"] == "active" && p["MainPID"] != want.pid && atoi(p["NRestarts"]) > atoi(want.restarts),
				fmt.Sprint(p, err)
		})
		if !ok {
			t.Errorf("%s stopped with SIGSTOP: not restarted within %s: %s", s.unit, want.limit, state)
			continue
		}
		t.Logf("systemdbox_watchdog_restart_seconds{unit=%q}=%.1f", s.unit, time.Since(start).Seconds())
	}
	out, _ := b.Output(ctx, "journalctl --no-pager -o cat -u 'fan-*' | grep -c 'Watchdog timeout' || true")
	if atoi(strings.TrimSpace(out)) < int64(len(services)) {
		t.Errorf("journal has %s watchdog timeouts, want %d (one per service)", strings.TrimSpace(out), len(services))
	}
}

func atoi(s string) int64 {
	n, _ := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
	return n
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
