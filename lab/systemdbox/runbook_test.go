package systemdbox

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/fanpbx/fan/lab/runbook"
)

// The runbook's hosts: two PBX hosts and the witness, each a box on a
// docker network in 192.0.2.0/24, the LAN the floating address is on, as
// the runbook's site file says.
var runbookHosts = []struct {
	name, ip string
	pbx      bool
}{
	{"pbx-a", "192.0.2.11", true},
	{"pbx-b", "192.0.2.12", true},
	{"ctl", "192.0.2.2", false},
}

// The runbook sections this test runs every shell block of.
var packageSections = []string{"Install", "Changing the site", "Rolling upgrade", "Rollback", "Uninstall"}

const (
	runbookVIP    = "192.0.2.10"
	runbookSubnet = "192.0.2.0/24"
)

// The boxes have no Asterisk: the PBX stand-in (lab/pbxstandin: the AMI
// peer, a SIP responder and registrar) runs as asterisk.service and reads
// /etc/asterisk as Asterisk would: AMI and its users from manager.conf (fan's
// user is the one install-host adds), the systemname from asterisk.conf, the
// transports it answers SIP on from pjsip.conf. `asterisk -rx 'manager
// reload'`, which install-host runs after adding fan's user, restarts it.
const standinUnit = `[Unit]
Description=PBX stand-in for Asterisk (fan's lab)
After=network-online.target
StartLimitIntervalSec=0

[Service]
ExecStart=/usr/local/bin/fan-pbxstandin -etc /etc/asterisk -registrar
EnvironmentFile=/etc/default/asterisk
Restart=always
RestartSec=200ms

[Install]
WantedBy=multi-user.target
`

const asteriskCLI = `#!/bin/sh
# The stand-in's answer to what install-host asks of a running Asterisk.
if [ "$1" = -rx ] && [ "$2" = "manager reload" ]; then exec systemctl restart asterisk; fi
echo "asterisk (stand-in): $*: not supported" >&2
exit 1
`

// setupPBX gives a PBX box its stand-in Asterisk, configured as an
// operator following deploy/asterisk would: AMI on loopback, the same
// systemname on both hosts. Its unit is enabled and not started: there is
// no AMI user for fan until install-host adds it, and no transports until
// the host's pjsip.conf is written (asteriskTransports).
func setupPBX(ctx context.Context, b *Box, host, standin string) error {
	if err := b.CopyIn(ctx, standin, "/usr/local/bin/fan-pbxstandin"); err != nil {
		return err
	}
	files := map[string]string{
		"/etc/asterisk/manager.conf":           "[general]\nenabled = yes\nbindaddr = 127.0.0.1\nport = 5038\n",
		"/etc/asterisk/asterisk.conf":          "[options]\nsystemname = pbx\n",
		"/etc/systemd/system/asterisk.service": standinUnit,
		"/usr/local/sbin/asterisk":             asteriskCLI,
		"/etc/default/asterisk":                "FAN_PBX_NODE=" + host + "\n",
	}
	for path, body := range files {
		mode := "0644"
		if strings.HasPrefix(path, "/usr/local/sbin/") {
			mode = "0755"
		}
		if err := b.WriteFile(ctx, path, mode, body); err != nil {
			return err
		}
	}
	_, err := b.Output(ctx, "mkdir -p /var/spool/asterisk/voicemail && chmod 0755 /usr/local/bin/fan-pbxstandin && systemctl daemon-reload && systemctl enable asterisk")
	return err
}

// asteriskTransports is the operator merging the bundle's PJSIP
// transports into the host's pjsip.conf (the production guide, section 3).
func asteriskTransports(ctx context.Context, b *Box, host string) error {
	_, err := b.Output(ctx, "install -m 0644 /root/"+host+"/asterisk/pjsip-transports.conf /etc/asterisk/pjsip.conf")
	return err
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
	network := NetworkForTest(t, runbookSubnet)
	var opts []Options
	for _, h := range runbookHosts {
		opts = append(opts, Options{Hostname: h.name, Network: network, IP: h.ip})
	}
	boxes := BootForTest(t, image, opts...)
	box := map[string]*Box{}
	for i, h := range runbookHosts {
		box[h.name] = boxes[i]
	}
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	r := &rb{t: t, ctx: ctx, doc: doc}
	oldEnv := "FAN_DEB=/root/" + filepath.Base(oldDeb)
	newEnv := "FAN_DEB=/root/" + filepath.Base(newDeb)
	oldVer, newVer := debVersion(t, oldDeb), debVersion(t, newDeb)
	if oldVer == newVer {
		t.Fatalf("FAN_DEB and FAN_DEB_NEXT are both version %s", oldVer)
	}

	// Install: the site file on the admin's machine (the witness), init,
	// each host's bundle copied to it, install.sh on each, provision,
	// doctor on each. These are the only commands of the install.
	standin := os.Getenv("FAN_STANDIN")
	if standin == "" {
		t.Fatal("FAN_STANDIN is not set: make systemd-test passes the PBX stand-in's binary")
	}
	for _, h := range runbookHosts {
		b := box[h.name]
		for _, d := range []string{oldDeb, newDeb} {
			if err := b.CopyIn(ctx, d, "/root/"+filepath.Base(d)); err != nil {
				t.Fatal(err)
			}
		}
		if h.pbx {
			if err := setupPBX(ctx, b, h.name, standin); err != nil {
				t.Fatalf("%s: the stand-in Asterisk: %v", h.name, err)
			}
		}
	}
	ctl := box["ctl"]
	if err := ctl.WriteFile(ctx, "/root/site.yaml", "0600", r.text("site-file")); err != nil {
		t.Fatal(err)
	}
	out := r.run(ctl, "ctl", "install-init", oldEnv)
	for _, h := range runbookHosts {
		if !strings.Contains(out, h.name) || !strings.Contains(out, "fan-site/hosts/"+h.name) {
			t.Fatalf("install-init does not name %s's bundle:\n%s", h.name, out)
		}
	}
	for _, h := range runbookHosts {
		// scp -r fan-site/hosts/<host> root@<host>: (or cp -r on the witness)
		if err := pipeTar(ctx, ctl, box[h.name], "/root/fan-site/hosts", h.name); err != nil {
			t.Fatal(err)
		}
		if h.pbx {
			if err := asteriskTransports(ctx, box[h.name], h.name); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, h := range runbookHosts {
		out := r.run(box[h.name], h.name, "install-host", oldEnv)
		if !strings.Contains(out, "installed fan") || !strings.Contains(out, "started: fan-nats") {
			t.Fatalf("install-host on %s:\n%s", h.name, out)
		}
		if h.pbx {
			// install-host added fan's AMI user and had the stand-in reload it.
			if got, err := box[h.name].Output(ctx, "grep -c 'manager.d/fan.conf' /etc/asterisk/manager.conf; stat -c '%U:%G %a' /etc/asterisk/manager.d/fan.conf"); err != nil || !strings.HasPrefix(got, "1\nroot:") {
				t.Fatalf("%s: fan's AMI user: %q %v", h.name, got, err)
			}
		}
	}
	r.run(ctl, "ctl", "install-provision")
	for _, h := range runbookHosts {
		r.retry(box[h.name], h.name, "install-check", 60*time.Second)
	}
	waitHolder(t, ctx, box, "pbx-a")
	for _, h := range runbookHosts {
		// doctor exits non-zero on any error: the retry gives the services
		// the time to be ready, and a finding that stays fails the test.
		out := r.retry(box[h.name], h.name, "install-doctor", 30*time.Second)
		if !regexp.MustCompile(`(?m)^0 errors`).MatchString(out) {
			t.Errorf("doctor on %s is not clean:\n%s", h.name, out)
		}
		t.Logf("doctor on %s: %s", h.name, lastLines(out, 1))
	}
	checkSecrets(t, ctx, box)
	out = r.run(ctl, "ctl", "install-status")
	if !strings.Contains(out, "pbx-a") {
		t.Fatalf("install-status does not show pbx-a:\n%s", out)
	}
	// The status page under systemd, as the viewer: active only once it
	// answers, and what it shows is the holder.
	page := r.retry(ctl, "ctl", "install-status-page-check", 30*time.Second)
	if !strings.Contains(page, `"group":"pbx"`) || !strings.Contains(page, `"holder":"pbx-a"`) {
		t.Fatalf("install-status-page-check: the page's status does not show pbx-a holding group pbx:\n%s", page)
	}
	if out, err := ctl.Output(ctx, `curl -sS -o /dev/null -w '%{http_code}' http://127.0.0.1:9110/api/status`); err != nil || strings.TrimSpace(out) != "401" {
		t.Fatalf("the page's status without the token: %q %v, want 401", out, err)
	}

	// The first failover: Asterisk stops on the holder, pbx-b takes the
	// address; Asterisk back, the group stays (no failback window open),
	// and a switchover brings it back.
	start := time.Now()
	r.run(box["pbx-a"], "pbx-a", "stop-pbx")
	waitHolder(t, ctx, box, "pbx-b")
	t.Logf("runbook_first_failover_seconds=%.1f", time.Since(start).Seconds())
	r.run(box["pbx-a"], "pbx-a", "start-pbx")
	r.retry(ctl, "ctl", "switch-back", 60*time.Second)
	waitHolder(t, ctx, box, "pbx-a")

	// Changing the site: an operator added. Every host's NATS server
	// reloads its users (no restart); the new operator's bundle works.
	if _, err := ctl.Output(ctx, `sed -i 's/^  operators: \[alice\]$/  operators: [alice, bob]/' /root/site.yaml && grep -q 'alice, bob' /root/site.yaml`); err != nil {
		t.Fatalf("adding bob to the site file: %v", err)
	}
	out = r.run(ctl, "ctl", "site-change")
	if !strings.Contains(out, "hosts that need the new bundle: pbx-a pbx-b ctl") || strings.Count(out, "/etc/fan/nats/nats-server.conf") != 3 {
		t.Fatalf("site-change: want every host's nats-server.conf changed, and only that:\n%s", out)
	}
	for _, h := range []string{"pbx-b", "ctl", "pbx-a"} {
		if _, err := box[h].Output(ctx, "rm -rf /root/"+h); err != nil {
			t.Fatal(err)
		}
		if err := pipeTar(ctx, ctl, box[h], "/root/fan-site/hosts", h); err != nil {
			t.Fatal(err)
		}
		out := r.run(box[h], h, "site-change-host")
		if !strings.Contains(out, "reloaded: fan-nats") || strings.Contains(out, "restarted:") {
			t.Fatalf("site-change-host on %s: want fan-nats reloaded and nothing restarted:\n%s", h, out)
		}
	}
	if out, err := ctl.Output(ctx, "fanctl --config /root/fan-site/people/bob/fanctl.yaml status"); err != nil || !strings.Contains(out, "pbx-a") {
		t.Fatalf("bob's bundle after the reloads: %v\n%s", err, out)
	}

	// Rolling upgrade: the standby PBX host, the witness, then the holder
	// after a switchover.
	r.run(ctl, "ctl", "upgrade-holder")
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
	r.retry(ctl, "ctl", "upgrade-switchover", 60*time.Second)
	waitHolder(t, ctx, box, "pbx-b")
	upgrade("pbx-a", newEnv, "upgrade-package", newVer)

	// Rollback: the same order from where the address is now.
	upgrade("pbx-a", oldEnv, "rollback-package", oldVer)
	upgrade("ctl", oldEnv, "rollback-package", oldVer)
	// The arbiter's restart on the witness may already have put the group
	// back on its preferred node; the request is then refused as done.
	r.retryAccepting(ctl, "ctl", "rollback-switchover", 60*time.Second, "pbx-a already holds group pbx")
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
ip -o -4 addr show | grep -F ' `+runbookVIP+`/' || true`)
		if err == nil && strings.TrimSpace(left) != "" {
			t.Errorf("after uninstall on %s, left behind:\n%s", host, left)
		}
		r.run(b, host, "uninstall-forget")
		if out, _ := b.Output(ctx, "ls -d /etc/fan /etc/fan-status /etc/asterisk/manager.d/fan.conf 2>/dev/null; getent passwd fan fan-status; grep -Fs manager.d/fan.conf /etc/asterisk/manager.conf"); strings.TrimSpace(out) != "" {
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
			if holdsVIP(ctx, box[h.name]) {
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
	// The package's upstream version (0.2.1~dev.5.abc1234 of
	// 0.2.1~dev.5.abc1234-1: the Makefile's version, revision 1) is what
	// --version prints.
	upstream := debVer[:max(strings.LastIndex(debVer, "-"), 0)]
	if upstream == "" || !strings.Contains(out, "fan-prober "+upstream+" (commit ") {
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

// pipeTar copies paths (relative to dir) from one box to another's /root.
func pipeTar(ctx context.Context, from, to *Box, dir string, paths ...string) error {
	src := exec.CommandContext(ctx, "docker", append([]string{"exec", "-w", dir, from.Name, "tar", "-c"}, paths...)...)
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

// checkSecrets performs what a compromised status page could try: as its
// user, read the other identities' seeds on its host and the admin's and
// operators' bundles kept there; each must be refused, while the page's
// own identity stays readable to it. On the PBX hosts, no identity that
// does not run there is present at all.
func checkSecrets(t *testing.T, ctx context.Context, box map[string]*Box) {
	t.Helper()
	ctl := box["ctl"]
	if out, err := ctl.Output(ctx, "ps -o user= -C fanctl"); err != nil || strings.TrimSpace(out) != "fan-status" {
		t.Errorf("the status page runs as %q (%v), want fan-status", strings.TrimSpace(out), err)
	}
	if _, err := ctl.Output(ctx, "runuser -u fan-status -- cat /etc/fan-status/viewer.nk >/dev/null"); err != nil {
		t.Errorf("the page cannot read its own identity: %v", err)
	}
	for _, path := range []string{"/etc/fan/bus/arbiter.nk", "/etc/fan/bus/arbiter-system.nk", "/etc/fan/bus/scheduler-key.pem",
		"/etc/fan/nats/server-key.pem", "/etc/fan/arbiter.yaml", "/root/fan-site/admin/admin.nk", "/root/fan-site/people/alice/operator.nk",
		"/root/fan-site/bus/ca/ca-key.pem", "/root/fan-site/secrets/ami-pbx-a"} {
		if out, err := ctl.Output(ctx, "runuser -u fan-status -- cat "+path); err == nil {
			t.Errorf("the status page's user read %s (%d bytes)", path, len(out))
		}
	}
	for _, h := range runbookHosts {
		if !h.pbx {
			continue
		}
		out, err := box[h.name].Output(ctx, `find / -xdev \( -name 'viewer*' -o -name 'operator*' -o -name 'admin*' -o -name 'scheduler*.nk' -o -name 'scheduler-*.pem' -o -name 'page.token' -o -name 'ca-key.pem' \) \( -path '/etc/*' -o -path '/root/*' -o -path '/var/*' \) 2>/dev/null`)
		if err != nil {
			t.Fatal(err)
		}
		if strings.TrimSpace(out) != "" {
			t.Errorf("%s holds identities that do not run there:\n%s", h.name, out)
		}
	}
}

// holdsVIP says whether the box carries the runbook's floating address.
func holdsVIP(ctx context.Context, b *Box) bool {
	out, err := b.Output(ctx, "ip -o -4 addr show")
	return err == nil && strings.Contains(out, " "+runbookVIP+"/24 ")
}
