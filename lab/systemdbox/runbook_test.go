package systemdbox

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/fanpbx/fan/lab/runbook"
)

// The runbook's hosts: two PBX hosts and the witness, each a box on a
// docker network in 198.51.100.0/24, with the names the cluster file gives
// them resolving through /etc/hosts.
var runbookHosts = []struct {
	name, ip string
	pbx      bool
}{
	{"pbx-a", "198.51.100.11", true},
	{"pbx-b", "198.51.100.12", true},
	{"ctl", "198.51.100.2", false},
}

// The runbook sections this test runs every shell block of.
var packageSections = []string{"Install", "Rolling upgrade", "Rollback", "Uninstall"}

// hostConfigs are the services' configurations without their bus section
// (the bundle's <service>-bus.yaml is appended on the host, as the runbook
// says): what an operator writes from the examples, with a TCP check of
// the host's own NATS port standing in for Asterisk, which the boxes lack.
func hostConfigs(host string, pbx bool) map[string]string {
	common := func(port int) string {
		return fmt.Sprintf("cluster: prod\nnode: %s\nhttp_listen: 127.0.0.1:%d\n", host, port)
	}
	arbiter := common(9104) + `lease_ttl: 3s
groups:
  - name: pbx
    addresses: [` + floatAddr + `]
    nodes: [pbx-a, pbx-b]
    health_check: up
    planned:
      drain_within: 5s
`
	if !pbx {
		return map[string]string{
			"arbiter": arbiter,
			"scheduler": common(9105) + `groups:
  - name: pbx
    windows:
      - name: nightly
        time_zone: UTC
        weekly:
          - {days: [daily], from: "02:00", to: "05:00"}
`,
		}
	}
	return map[string]string{
		"prober": common(9101) + `checks:
  - {name: up, kind: tcp, role: self, address: "127.0.0.1:4222", interval: 200ms, timeout: 150ms, rise: 2, fall: 3}
`,
		"ipmover": common(9102) + ipmoverBody,
		"replicator": common(9103) + `group: pbx
state_dir: /var/lib/fan/replicator
trees:
  - name: asterisk-etc
    path: /etc/asterisk
`,
	}
}

// rb runs the runbook's blocks in boxes and remembers which ran.
type rb struct {
	t   *testing.T
	ctx context.Context
	doc *runbook.Doc
	ran []string
}

// run runs the shell block name on b with env, once, as an operator would
// paste it (bash, stopping at the first failing command, after "Before you
// start"'s variables), and returns its output.
func (r *rb) run(b *Box, host, name string, env ...string) string {
	r.t.Helper()
	return r.retryAccepting(b, host, name, 0, "", env...)
}

// retry runs the block until it succeeds or timeout passes: for an
// operator's request that the text says to repeat while the restarted
// arbiter takes its lease back.
func (r *rb) retry(b *Box, host, name string, timeout time.Duration, env ...string) string {
	return r.retryAccepting(b, host, name, timeout, "", env...)
}

// retryAccepting is retry that also takes a failure whose output contains
// accept as the block's answer (an operator's request refused because it
// is already done).
func (r *rb) retryAccepting(b *Box, host, name string, timeout time.Duration, accept string, env ...string) string {
	r.t.Helper()
	blk, err := r.doc.Shell(name)
	if err != nil {
		r.t.Fatal(err)
	}
	pre, err := r.doc.Shell("env")
	if err != nil {
		r.t.Fatal(err)
	}
	var out string
	state, ok := WaitFor(r.ctx, timeout, func() (bool, string) {
		var err error
		out, err = b.RunEnv(r.ctx, nil, env, "set -eu\n"+pre.Text+blk.Text)
		if err != nil && accept != "" && strings.Contains(err.Error(), accept) {
			out, err = err.Error(), nil
		}
		return err == nil, fmt.Sprint(err)
	})
	if !ok {
		r.t.Fatalf("runbook:%s on %s (docs/operations.md line %d) failed for %s: %s", name, host, blk.Line, timeout, state)
	}
	r.ran = append(r.ran, name)
	r.t.Logf("runbook:%s on %s:\n%s", name, host, indent(lastLines(out, 12)))
	return out
}

func (r *rb) text(name string) string {
	r.t.Helper()
	blk, err := r.doc.Block(name)
	if err != nil {
		r.t.Fatal(err)
	}
	return blk.Text
}

// TestRunbookPackage runs docs/operations.md's Install, Rolling upgrade,
// Rollback and Uninstall sections on three boxes: the package installed on
// two PBX hosts and a witness with a three-server bus, upgraded host by
// host to a rebuilt package with a bumped version, rolled back to the
// first, and purged, checking what each step promises.
func TestRunbookPackage(t *testing.T) {
	oldDeb := PackageForTest(t, "FAN_DEB")
	newDeb := PackageForTest(t, "FAN_DEB_NEXT")
	_, self, _, _ := runtime.Caller(0)
	doc, err := runbook.ParseFile(filepath.Join(filepath.Dir(self), "../../docs/operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	image := ImageForTest(t)
	network := NetworkForTest(t, "198.51.100.0/24")
	names := map[string]string{}
	var opts []Options
	for _, h := range runbookHosts {
		names[h.name+".example.net"] = h.ip
	}
	for _, h := range runbookHosts {
		opts = append(opts, Options{Hostname: h.name, Network: network, IP: h.ip, Hosts: names})
	}
	boxes := BootForTest(t, image, opts...)
	box := map[string]*Box{}
	for i, h := range runbookHosts {
		box[h.name] = boxes[i]
	}
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	r := &rb{t: t, ctx: ctx, doc: doc}
	// fanctl's operator bundle is the default of "Before you start" once
	// install-fanctl put it on the witness.
	operator := "FANCTL_CONFIG=/etc/fan/bus/fanctl.yaml"
	oldEnv := "FAN_DEB=/root/" + filepath.Base(oldDeb)
	newEnv := "FAN_DEB=/root/" + filepath.Base(newDeb)
	oldVer, newVer := debVersion(t, oldDeb), debVersion(t, newDeb)
	if oldVer == newVer {
		t.Fatalf("FAN_DEB and FAN_DEB_NEXT are both version %s", oldVer)
	}

	// Install.
	for _, h := range runbookHosts {
		b := box[h.name]
		for _, d := range []string{oldDeb, newDeb} {
			if err := b.CopyIn(ctx, d, "/root/"+filepath.Base(d)); err != nil {
				t.Fatal(err)
			}
		}
		out := r.run(b, h.name, "install-package", oldEnv)
		if !strings.Contains(out, "fan "+oldVer+" installed") {
			t.Fatalf("install-package on %s: want fan %s installed in:\n%s", h.name, oldVer, out)
		}
		if _, err := b.Output(ctx, fmt.Sprintf("ip link add %[1]s type veth peer name %[1]sp && ip link set %[1]s up && ip link set %[1]sp up && "+
			"mkdir -p /etc/asterisk && echo '; test' >/etc/asterisk/extensions.conf", floatIface)); err != nil {
			t.Fatal(err)
		}
	}
	// The admin's machine is the witness here: it makes the credentials
	// and hands each host its two bundles.
	ctl := box["ctl"]
	if err := ctl.WriteFile(ctx, "/root/cluster.yaml", "0600", r.text("cluster-file")); err != nil {
		t.Fatal(err)
	}
	r.run(ctl, "ctl", "install-credentials")
	for _, h := range runbookHosts {
		if h.name == "ctl" {
			continue
		}
		if err := pipeTar(ctx, ctl, box[h.name], "fan-bus/hosts/"+h.name, "fan-bus/hosts/nats-"+h.name); err != nil {
			t.Fatal(err)
		}
	}
	natsYAML := r.text("nats-yaml")
	if !strings.Contains(natsYAML, "server_name: nats-pbx-a\n") {
		t.Fatalf("runbook:nats-yaml no longer names nats-pbx-a:\n%s", natsYAML)
	}
	for _, h := range runbookHosts {
		b := box[h.name]
		r.run(b, h.name, "install-host-credentials")
		if err := b.WriteFile(ctx, "/etc/fan/nats.yaml", "0640",
			strings.Replace(natsYAML, "server_name: nats-pbx-a\n", "server_name: nats-"+h.name+"\n", 1)); err != nil {
			t.Fatal(err)
		}
		r.run(b, h.name, "install-start-nats")
	}
	r.run(ctl, "ctl", "install-fanctl")
	r.run(ctl, "ctl", "install-provision")
	for _, h := range runbookHosts {
		b := box[h.name]
		for svc, body := range hostConfigs(h.name, h.pbx) {
			path := "/etc/fan/" + svc + ".yaml"
			if err := b.WriteFile(ctx, path, "0640", body); err != nil {
				t.Fatal(err)
			}
			// The bundle's bus section, with the replication the
			// three servers give.
			if _, err := b.Output(ctx, fmt.Sprintf(`sed 's/^bus:$/bus:\n  replicas: 3/' /etc/fan/bus/%[1]s-bus.yaml >>%[2]s && chgrp fan %[2]s &&
runuser -u fan -- fan-%[1]s -check-config %[2]s`, svc, path)); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, h := range runbookHosts {
		if h.pbx {
			r.run(box[h.name], h.name, "install-start-pbx")
		}
	}
	r.run(ctl, "ctl", "install-start-witness")
	for _, h := range runbookHosts {
		r.run(box[h.name], h.name, "install-check")
	}
	waitHolder(t, ctx, box, "pbx-a")
	out := r.run(ctl, "ctl", "install-status", operator)
	if !strings.Contains(out, "pbx-a") {
		t.Fatalf("install-status does not show pbx-a:\n%s", out)
	}
	// The status page under systemd, as the viewer: active only once it
	// answers, and what it shows is the holder.
	r.run(ctl, "ctl", "install-status-page")
	page := r.retry(ctl, "ctl", "install-status-page-check", 30*time.Second)
	if !strings.Contains(page, `"group":"pbx"`) || !strings.Contains(page, `"holder":"pbx-a"`) {
		t.Fatalf("install-status-page-check: the page's status does not show pbx-a holding group pbx:\n%s", page)
	}
	if out, err := ctl.Output(ctx, `curl -sS -o /dev/null -w '%{http_code}' http://127.0.0.1:9110/api/status`); err != nil || strings.TrimSpace(out) != "401" {
		t.Fatalf("the page's status without the token: %q %v, want 401", out, err)
	}

	// Rolling upgrade: the standby PBX host, the witness, then the holder
	// after a switchover.
	r.run(ctl, "ctl", "upgrade-holder", operator)
	upgrade := func(host, env, block, ver string) {
		t.Helper()
		out := r.run(box[host], host, block, env)
		if !strings.Contains(out, "fan "+ver) {
			t.Fatalf("%s on %s: want fan %s in:\n%s", block, host, ver, out)
		}
		r.run(box[host], host, "upgrade-restart")
		checkVersions(t, ctx, box[host], host, ver)
	}
	upgrade("pbx-b", newEnv, "upgrade-package", newVer)
	upgrade("ctl", newEnv, "upgrade-package", newVer)
	r.retry(ctl, "ctl", "upgrade-switchover", 60*time.Second, operator)
	waitHolder(t, ctx, box, "pbx-b")
	upgrade("pbx-a", newEnv, "upgrade-package", newVer)

	// Rollback: the same order from where the address is now.
	upgrade("pbx-a", oldEnv, "rollback-package", oldVer)
	upgrade("ctl", oldEnv, "rollback-package", oldVer)
	// The arbiter's restart on the witness may already have put the group
	// back on its preferred node; the request is then refused as done.
	r.retryAccepting(ctl, "ctl", "rollback-switchover", 60*time.Second, "pbx-a already holds group pbx", operator)
	waitHolder(t, ctx, box, "pbx-a")
	upgrade("pbx-b", oldEnv, "rollback-package", oldVer)

	// Uninstall, the holder last.
	for _, host := range []string{"pbx-b", "ctl", "pbx-a"} {
		b := box[host]
		r.run(b, host, "uninstall")
		out := r.run(b, host, "uninstall-leftovers")
		if !strings.Contains(out, "nats.yaml") || !strings.Contains(out, "fan:") {
			t.Errorf("uninstall-leftovers on %s: want the operator's /etc/fan files and the fan user:\n%s", host, out)
		}
		left, err := b.Output(ctx, `ls /usr/bin/fan* /lib/systemd/system/fan-* /var/lib/fan 2>/dev/null;
find /etc/systemd/system -name 'fan-*' 2>/dev/null; systemctl list-units --all --plain --no-legend 'fan-*'
ip -o addr show dev `+floatIface+` | grep -F '`+floatAddr+`' || true`)
		if err == nil && strings.TrimSpace(left) != "" {
			t.Errorf("after uninstall on %s, left behind:\n%s", host, left)
		}
		r.run(b, host, "uninstall-forget")
		if out, _ := b.Output(ctx, "ls -d /etc/fan 2>/dev/null; getent passwd fan"); strings.TrimSpace(out) != "" {
			t.Errorf("uninstall-forget on %s left: %s", host, out)
		}
	}
	if missing := doc.Missing(r.ran, packageSections...); len(missing) > 0 {
		t.Errorf("docs/operations.md blocks this test never ran: %v", missing)
	}
}

// waitHolder waits until host, and only host, carries the floating address.
func waitHolder(t *testing.T, ctx context.Context, box map[string]*Box, host string) {
	t.Helper()
	start := time.Now()
	state, ok := WaitFor(ctx, 60*time.Second, func() (bool, string) {
		var where []string
		for _, h := range runbookHosts {
			if has, _ := hasAddr(ctx, box[h.name]); has {
				where = append(where, h.name)
			}
		}
		return len(where) == 1 && where[0] == host, fmt.Sprint(where)
	})
	if !ok {
		t.Fatalf("want the floating address on %s only, on %s", host, state)
	}
	t.Logf("floating address on %s after %.1f s", host, time.Since(start).Seconds())
}

// checkVersions: every fan unit enabled on the host runs, and its binary
// says the package's version.
func checkVersions(t *testing.T, ctx context.Context, b *Box, host, debVer string) {
	t.Helper()
	out, err := b.Output(ctx, `for u in $(systemctl list-unit-files --plain --no-legend --state=enabled 'fan-*' | awk '{print $1}'); do
	echo "$u $(systemctl is-active "$u") $(systemctl show -p NRestarts --value "$u")"
done; fan-prober --version`)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if strings.HasPrefix(line, "fan-") && strings.Contains(line, ".service") && !strings.Contains(line, " active ") {
			t.Errorf("%s: %s", host, line)
		}
	}
	// The package's upstream version (0.1.1 of 0.1.1-1) is in --version.
	upstream := strings.SplitN(strings.SplitN(debVer, "-", 2)[0], "+", 2)[0]
	if !strings.Contains(out, "fan-prober v"+upstream) {
		t.Errorf("%s: fan-prober is not version %s:\n%s", host, upstream, out)
	}
}

func debVersion(t *testing.T, deb string) string {
	t.Helper()
	out, err := exec.Command("dpkg-deb", "-f", deb, "Version").Output()
	if err != nil {
		t.Fatalf("dpkg-deb -f %s: %v", deb, err)
	}
	return strings.TrimSpace(string(out))
}

// pipeTar copies paths (relative to /root) from one box to another.
func pipeTar(ctx context.Context, from, to *Box, paths ...string) error {
	src := exec.CommandContext(ctx, "docker", append([]string{"exec", "-w", "/root", from.Name, "tar", "-c"}, paths...)...)
	dst := exec.CommandContext(ctx, "docker", "exec", "-i", "-w", "/root", to.Name, "tar", "-x")
	pipe, err := src.StdoutPipe()
	if err != nil {
		return err
	}
	dst.Stdin = pipe
	if err := src.Start(); err != nil {
		return fmt.Errorf("tar from %s: %w", from.Name, err)
	}
	out, derr := dst.CombinedOutput()
	if err := src.Wait(); err != nil {
		return fmt.Errorf("tar from %s: %w", from.Name, err)
	}
	if derr != nil {
		return fmt.Errorf("tar into %s: %w: %s", to.Name, derr, out)
	}
	return nil
}

func indent(s string) string {
	return "    " + strings.ReplaceAll(s, "\n", "\n    ")
}
