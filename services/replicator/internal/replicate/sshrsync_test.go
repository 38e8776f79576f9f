package replicate_test

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/platform/logtest"
	"github.com/fanpbx/fan/pkg/platform/waittest"
)

// sshRsync is how the replicator's users synced the spool before it:
// rsync -az --delete to the standby over SSH. For the benchmark the two
// ends are two network namespaces joined by a veth pair, with an sshd of
// its own (keys made for the run, in a temporary directory) listening on
// the standby's address; both ends still see this machine's file system,
// so only the transport crosses the link.
type sshRsync struct {
	dir, client, server string
	ssh                 string // the -e command rsync runs
	sshd                *exec.Cmd
	madePrivsep         bool
}

const (
	sshClientAddr = "198.51.100.1"
	sshServerAddr = "198.51.100.2"
)

// startSSHRsync sets the two ends up; it returns why not (and nil) when
// this machine cannot: not root, or OpenSSH not installed.
func startSSHRsync(b *testing.B) (*sshRsync, string) {
	if os.Geteuid() != 0 {
		return nil, "needs root for the namespaces"
	}
	for _, tool := range []string{"ssh", "ssh-keygen", "ip"} {
		if _, err := exec.LookPath(tool); err != nil {
			return nil, tool + " not installed (apt-get install openssh-server openssh-client iproute2)"
		}
	}
	sshd := "/usr/sbin/sshd"
	if _, err := os.Stat(sshd); err != nil {
		return nil, "sshd not installed (apt-get install openssh-server)"
	}
	dir, err := os.MkdirTemp("/tmp", "fan-bench-ssh-")
	if err != nil {
		b.Fatal(err)
	}
	tag := fmt.Sprint(os.Getpid())
	s := &sshRsync{dir: dir, client: "fanbssh-c-" + tag, server: "fanbssh-s-" + tag}
	b.Cleanup(s.close)
	run := func(args ...string) {
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			b.Fatalf("%s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	hostKey, userKey := filepath.Join(dir, "host_ed25519"), filepath.Join(dir, "user_ed25519")
	run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", hostKey)
	run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", userKey)
	pub, err := os.ReadFile(userKey + ".pub")
	if err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "authorized_keys"), pub, 0o600); err != nil {
		b.Fatal(err)
	}
	cfg := filepath.Join(dir, "sshd_config")
	if err := os.WriteFile(cfg, fmt.Appendf(nil, `ListenAddress %s:22
HostKey %s
PidFile %s
AuthorizedKeysFile %s
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
LogLevel ERROR
`, sshServerAddr, hostKey, filepath.Join(dir, "sshd.pid"), filepath.Join(dir, "authorized_keys")), 0o600); err != nil {
		b.Fatal(err)
	}
	// sshd refuses to start without its privilege separation directory,
	// which the package's service would make.
	if _, err := os.Stat("/run/sshd"); errors.Is(err, os.ErrNotExist) {
		if err := os.Mkdir("/run/sshd", 0o755); err != nil {
			b.Fatal(err)
		}
		s.madePrivsep = true
	}
	run("ip", "netns", "add", s.client)
	run("ip", "netns", "add", s.server)
	run("ip", "-n", s.client, "link", "add", "veth0", "type", "veth", "peer", "name", "veth0", "netns", s.server)
	for ns, addr := range map[string]string{s.client: sshClientAddr, s.server: sshServerAddr} {
		run("ip", "-n", ns, "addr", "add", addr+"/24", "dev", "veth0")
		run("ip", "-n", ns, "link", "set", "veth0", "up")
		run("ip", "-n", ns, "link", "set", "lo", "up")
	}
	s.sshd = exec.Command("ip", "netns", "exec", s.server, sshd, "-D", "-e", "-f", cfg)
	var logs logtest.Buffer
	s.sshd.Stderr = &logs
	if err := s.sshd.Start(); err != nil {
		b.Fatal(err)
	}
	s.ssh = fmt.Sprintf("ssh -i %s -o UserKnownHostsFile=%s -o StrictHostKeyChecking=accept-new -o BatchMode=yes -o LogLevel=ERROR",
		userKey, filepath.Join(dir, "known_hosts"))
	// Up when a login runs a command.
	waittest.Succeeds(b, 10*time.Second, "ssh to the bench's sshd", func() error {
		args := append([]string{"netns", "exec", s.client}, strings.Fields(s.ssh)...)
		if out, err := exec.Command("ip", append(args, "root@"+sshServerAddr, "true")...).CombinedOutput(); err != nil {
			return fmt.Errorf("%w: %s; sshd: %s", err, out, logs.String())
		}
		return nil
	})
	return s, ""
}

// rsync runs rsync -az --delete from src to dst over SSH, from the client
// end, and returns its wall time and the CPU of the client's processes
// (rsync and ssh; the server end's sshd and rsync are not counted).
func (s *sshRsync) rsync(b *testing.B, src, dst string) (time.Duration, time.Duration) {
	start := time.Now()
	cmd := exec.Command("ip", "netns", "exec", s.client, "rsync", "-az", "--delete", "-e", s.ssh, src+"/", "root@"+sshServerAddr+":"+dst+"/")
	if out, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("rsync over SSH: %v: %s", err, out)
	}
	return time.Since(start), cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
}

// close stops sshd and removes the namespaces (the veth pair goes with
// them), the keys, and the privilege separation directory if made here.
func (s *sshRsync) close() {
	if s.sshd != nil && s.sshd.Process != nil {
		_ = s.sshd.Process.Kill()
		_ = s.sshd.Wait()
	}
	// ip netns exec runs sshd in its place (exec), so the kill above
	// reached sshd itself; a forked session child, if any, ends with its
	// connection.
	for _, ns := range []string{s.client, s.server} {
		_ = exec.Command("ip", "netns", "del", ns).Run()
	}
	_ = os.RemoveAll(s.dir)
	if s.madePrivsep {
		_ = os.Remove("/run/sshd")
	}
}
