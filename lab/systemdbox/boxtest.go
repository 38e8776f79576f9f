package systemdbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fanpbx/fan/lab/prereq"
	"github.com/fanpbx/fan/pkg/platform/poll"
)

// PackageForTest returns the fan package a test installs: FAN_DEB, which
// `make systemd-test` sets after `make deb`. Without it the test is skipped
// (the README's `make test` builds no package); a set FAN_DEB that names no
// file fails.
func PackageForTest(t testing.TB, env string) string {
	t.Helper()
	deb := os.Getenv(env)
	if deb == "" {
		t.Skipf("%s is not set: make systemd-test builds the package and runs this test", env)
	}
	abs, err := filepath.Abs(deb)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(abs); err != nil {
		t.Fatalf("%s=%s: %v", env, deb, err)
	}
	return abs
}

// ImageForTest builds (or reuses) the image. Root, docker and, for a
// first build, debootstrap are prerequisites (prereq.SkipOrFail).
func ImageForTest(t testing.TB) string {
	t.Helper()
	prereq.Root(t)
	prereq.Need(t, "docker.io", "docker")
	if err := exec.Command("docker", "info").Run(); err != nil {
		prereq.SkipOrFail(t, "the docker engine does not answer (docker info): "+err.Error())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	r := DefaultRecipe()
	if !ImageExists(ctx, r.Tag()) {
		prereq.Need(t, "debootstrap", "debootstrap")
	}
	start := time.Now()
	tag, err := BuildImage(ctx, r, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("systemdbox_image_seconds=%.1f", time.Since(start).Seconds())
	return tag
}

// BootForTest boots one box per option set, all at once, waits until
// systemd runs in each, and removes them when the test ends, pass or fail.
// On failure the fan units' status and journal are logged first.
func BootForTest(t testing.TB, image string, opts ...Options) []*Box {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	start := time.Now()
	var boxes []*Box
	for _, o := range opts {
		b, err := Start(ctx, image, o)
		t.Cleanup(func() {
			if t.Failed() {
				dctx, dcancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer dcancel()
				out, _ := b.Output(dctx, "systemctl status --no-pager -n 0 'fan-*' 2>&1 | head -80; "+
					"journalctl --no-pager -o short-precise -n 2000 | grep -F fan | tail -150")
				t.Logf("box %s (%s) at failure:\n%s", b.Name, o.Hostname, out)
			}
			if err := b.Remove(); err != nil {
				t.Error(err)
			}
		})
		if err != nil {
			t.Fatal(err)
		}
		boxes = append(boxes, b)
	}
	for i, b := range boxes {
		state, err := b.WaitRunning(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("systemd in %s (%s): %s", b.Name, opts[i].Hostname, state)
	}
	t.Logf("systemdbox_boot_seconds=%.1f", time.Since(start).Seconds())
	return boxes
}

// NetworkForTest creates a docker network on subnet for the test and
// removes it when the test ends (after the boxes on it: cleanups run last
// registered first, so call this before BootForTest).
func NetworkForTest(t testing.TB, subnet string) string {
	t.Helper()
	var rnd [4]byte
	_, _ = rand.Read(rnd[:])
	name := "fan-systemdbox-" + hex.EncodeToString(rnd[:])
	if out, err := exec.Command("docker", "network", "create", "--subnet", subnet, "--label", "fan.systemdbox=1", name).CombinedOutput(); err != nil {
		t.Fatalf("docker network create %s: %v: %s", subnet, err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("docker", "network", "rm", name).CombinedOutput(); err != nil {
			t.Errorf("docker network rm %s: %v: %s", name, err, out)
		}
	})
	return name
}

// Show returns the unit's properties (systemctl show -p).
func (b *Box) Show(ctx context.Context, unit string, props ...string) (map[string]string, error) {
	args := "systemctl show " + unit
	for _, p := range props {
		args += " -p " + p
	}
	out, err := b.Output(ctx, args)
	if err != nil {
		return nil, err
	}
	m := map[string]string{}
	for _, line := range strings.Split(out, "\n") {
		if k, v, ok := strings.Cut(line, "="); ok {
			m[k] = v
		}
	}
	return m, nil
}

// WaitFor calls cond every 100 ms (a condition here is usually a docker exec) until it
// reports done, the timeout passes or ctx ends; it returns the last state
// cond described and whether it was done.
func WaitFor(ctx context.Context, timeout time.Duration, cond func() (bool, string)) (string, bool) {
	var last string
	err := poll.Every(ctx, 100*time.Millisecond, timeout, "the condition", func() error {
		done, state := cond()
		last = state
		if !done {
			return errors.New(state)
		}
		return nil
	})
	return last, err == nil
}
