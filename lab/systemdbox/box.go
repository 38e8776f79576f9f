package systemdbox

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"slices"
	"strings"
	"time"

	"github.com/fanpbx/fan/pkg/platform/poll"
)

// errNotRunning is returned when systemd in the container never reached a
// running (or degraded) state.
var errNotRunning = errors.New("systemd did not finish booting")

// Box is one running container with systemd as PID 1.
type Box struct {
	Name string
}

// Options place a box on a network of its own choosing.
type Options struct {
	// Hostname is the box's host name (default fanbox).
	Hostname string
	// Network and IP put the box on a user-defined docker network at a
	// fixed address (default: docker's bridge).
	Network, IP string
	// Hosts are extra /etc/hosts entries, name to address.
	Hosts map[string]string
}

// RunArgs are `docker run`'s options for a systemd container on a host that
// refuses --privileged: systemd mounts its own cgroups (private cgroup
// namespace, CAP_SYS_ADMIN), the services' sandboxing makes mount and
// network namespaces (no seccomp filter), the ipmover adds addresses
// (CAP_NET_ADMIN). /proc/sys stays read-only in a container, so the sysctl
// fan-ipmover's hot answer mode needs is set by docker, as an operator of a
// containerised PBX would.
func RunArgs(name string, o Options) []string {
	host := o.Hostname
	if host == "" {
		host = "fanbox"
	}
	args := []string{
		"run", "-d", "--name", name, "--hostname", host,
		"--label", "fan.systemdbox=1",
		"--cap-add", "SYS_ADMIN", "--cap-add", "NET_ADMIN",
		"--security-opt", "seccomp=unconfined", "--cgroupns=private",
		"--tmpfs", "/run", "--tmpfs", "/run/lock", "--tmpfs", "/tmp",
		"--sysctl", "net.ipv4.ip_nonlocal_bind=1", "--sysctl", "net.ipv6.ip_nonlocal_bind=1",
		"-e", "container=docker",
	}
	if o.Network != "" {
		args = append(args, "--network", o.Network)
	}
	if o.IP != "" {
		args = append(args, "--ip", o.IP)
	}
	names := make([]string, 0, len(o.Hosts))
	for n := range o.Hosts {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		args = append(args, "--add-host", n+":"+o.Hosts[n])
	}
	return args
}

// Start runs a container of image with systemd as PID 1. The caller must
// Remove the box, pass or fail (also when Start returns an error).
func Start(ctx context.Context, image string, o Options) (*Box, error) {
	var rnd [4]byte
	_, _ = rand.Read(rnd[:])
	b := &Box{Name: "fan-systemdbox-" + hex.EncodeToString(rnd[:])}
	args := append(RunArgs(b.Name, o), image, "/sbin/init")
	if out, err := exec.CommandContext(ctx, "docker", args...).CombinedOutput(); err != nil {
		return b, fmt.Errorf("docker run: %w: %s", err, out)
	}
	return b, nil
}

// WaitRunning waits until systemd says the system is running. A degraded
// system is accepted with the failed units in the returned report (the
// caller prints it): the container lacks some of a real host's units.
func (b *Box) WaitRunning(ctx context.Context) (string, error) {
	var report string
	// Each look is a docker exec.
	err := poll.Every(ctx, 250*time.Millisecond, 90*time.Second, "systemd running in "+b.Name, func() error {
		// is-system-running exits non-zero for anything but running, and
		// prints the state either way.
		out, _ := b.Output(ctx, "systemctl is-system-running")
		switch state := strings.TrimSpace(out); state {
		case "running":
			report = "running"
		case "degraded":
			failed, _ := b.Output(ctx, "systemctl --failed --no-legend --plain; journalctl -b -p err --no-pager -q | tail -20")
			report = "degraded: " + strings.TrimSpace(failed)
		default:
			return fmt.Errorf("state %q", state)
		}
		return nil
	})
	if err != nil {
		jobs, _ := b.Output(ctx, "systemctl list-jobs --no-pager; systemctl --failed --no-pager")
		return "", fmt.Errorf("%w: %w:\n%s", errNotRunning, err, jobs)
	}
	return report, nil
}

// Remove force-removes the container (its anonymous volumes too).
func (b *Box) Remove() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if out, err := exec.CommandContext(ctx, "docker", "rm", "-f", "-v", b.Name).CombinedOutput(); err != nil {
		return fmt.Errorf("docker rm %s: %w: %s", b.Name, err, out)
	}
	return nil
}

// Output runs script with bash in the container (root, no terminal) and
// returns what it printed (stdout and stderr together).
func (b *Box) Output(ctx context.Context, script string) (string, error) {
	return b.Run(ctx, nil, script)
}

// Run is Output with stdin.
func (b *Box) Run(ctx context.Context, stdin io.Reader, script string) (string, error) {
	return b.RunEnv(ctx, stdin, nil, script)
}

// RunEnv is Run with environment variables (NAME=value) for the script,
// in root's home directory.
func (b *Box) RunEnv(ctx context.Context, stdin io.Reader, env []string, script string) (string, error) {
	args := []string{"exec", "-w", "/root"}
	if stdin != nil {
		args = append(args, "-i")
	}
	for _, e := range env {
		args = append(args, "-e", e)
	}
	args = append(args, b.Name, "bash", "-o", "pipefail", "-c", script)
	cmd := exec.CommandContext(ctx, "docker", args...)
	cmd.Stdin = stdin
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if err != nil {
		return out.String(), fmt.Errorf("in %s: %q: %w: %s", b.Name, firstLine(script), err, strings.TrimSpace(out.String()))
	}
	return out.String(), nil
}

// WriteFile writes content to path in the container with mode (octal, as
// install(1) takes it).
func (b *Box) WriteFile(ctx context.Context, path, mode, content string) error {
	_, err := b.Run(ctx, strings.NewReader(content),
		fmt.Sprintf("install -D -m %s /dev/stdin %q", mode, path))
	return err
}

// CopyIn copies a file of the host into the container.
func (b *Box) CopyIn(ctx context.Context, src, dst string) error {
	if out, err := exec.CommandContext(ctx, "docker", "cp", src, b.Name+":"+dst).CombinedOutput(); err != nil {
		return fmt.Errorf("docker cp %s: %w: %s", src, err, out)
	}
	return nil
}

func firstLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i] + " ..."
	}
	return s
}
