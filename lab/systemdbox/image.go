// Package systemdbox boots a Debian 12 container whose PID 1 is systemd, so
// fan's package and units can be installed and started as on a real host:
// the machine the tests run on has no systemd as PID 1, and `systemd-analyze
// verify` checks only the units' syntax.
//
// The image is made from Debian's own packages, nothing is pulled from a
// registry: debootstrap (minbase) into a directory, `docker import` of its
// tar. It is tagged with a hash of everything that went into it and reused
// while the tag exists, so only the first run pays for debootstrap.
//
// The container runs without --privileged (refused on the CI host): it gets
// CAP_SYS_ADMIN and CAP_NET_ADMIN, no seccomp filter, its own cgroup
// namespace and tmpfs on /run, which is what systemd needs as PID 1.
package systemdbox

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
)

// Packages are installed into the image beside minbase: systemd as PID 1,
// iproute2 for the floating address checks, procps for ps and pkill-free
// process listings in failure logs, curl for the status page as the
// runbook reads it.
var Packages = []string{"systemd", "systemd-sysv", "iproute2", "procps", "curl"}

// Suite is the Debian release the image is made of (the one fan's package
// targets).
const Suite = "bookworm"

// recipeVersion changes when the way the image is made changes in a way
// the inputs below do not show.
const recipeVersion = "1"

// Recipe is everything that decides the image's content.
type Recipe struct {
	Suite    string
	Mirror   string
	Packages []string
}

// DefaultRecipe is fan's test image: Suite with Packages, from the Debian
// mirror this machine's apt uses.
func DefaultRecipe() Recipe {
	return Recipe{Suite: Suite, Mirror: AptMirror(), Packages: Packages}
}

// Tag is the image's name: the repository plus a hash of the recipe, so a
// changed recipe builds a new image and an unchanged one reuses the old.
func (r Recipe) Tag() string {
	h := sha256.New()
	fmt.Fprintf(h, "%s\n%s\n%s\n%s\n", recipeVersion, r.Suite, r.Mirror, strings.Join(r.Packages, ","))
	return "fan-systemdbox:" + r.Suite + "-" + hex.EncodeToString(h.Sum(nil))[:12]
}

// debootstrapArgs is the command line that fills root.
func (r Recipe) debootstrapArgs(root string) []string {
	return []string{"--variant=minbase", "--include=" + strings.Join(r.Packages, ","), r.Suite, root, r.Mirror}
}

// AptMirror is the Debian archive this machine's apt reads for the suite
// (FAN_DEBIAN_MIRROR overrides it): the one mirror known to be reachable
// from here. Both source formats are read: one-line .list and deb822
// .sources.
func AptMirror() string {
	if m := os.Getenv("FAN_DEBIAN_MIRROR"); m != "" {
		return m
	}
	files := []string{"/etc/apt/sources.list"}
	for _, pat := range []string{"/etc/apt/sources.list.d/*.list", "/etc/apt/sources.list.d/*.sources"} {
		m, _ := filepath.Glob(pat)
		files = append(files, m...)
	}
	for _, f := range files {
		if m := mirrorIn(f, Suite); m != "" {
			return m
		}
	}
	return "http://deb.debian.org/debian"
}

// mirrorIn returns the first URI in an apt source file that serves suite
// itself (not suite-security or suite-updates).
func mirrorIn(path, suite string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	var uris, suites []string
	flush := func() string {
		defer func() { uris, suites = nil, nil }()
		if len(uris) > 0 && slices.Contains(suites, suite) {
			return uris[0]
		}
		return ""
	}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(line, "#") {
			continue
		}
		if line == "" {
			if m := flush(); m != "" {
				return m
			}
			continue
		}
		fields := strings.Fields(line)
		switch {
		case fields[0] == "deb":
			// deb [options] URI suite component...
			fields = fields[1:]
			if len(fields) > 0 && strings.HasPrefix(fields[0], "[") {
				for len(fields) > 0 && !strings.HasSuffix(fields[0], "]") {
					fields = fields[1:]
				}
				if len(fields) > 0 {
					fields = fields[1:]
				}
			}
			if len(fields) >= 2 && fields[1] == suite {
				return fields[0]
			}
		case strings.EqualFold(fields[0], "URIs:"):
			uris = fields[1:]
		case strings.EqualFold(fields[0], "Suites:"):
			suites = fields[1:]
		}
	}
	return flush()
}

// ImageExists reports whether docker has the tag.
func ImageExists(ctx context.Context, tag string) bool {
	return exec.CommandContext(ctx, "docker", "image", "inspect", "--format", "{{.Id}}", tag).Run() == nil
}

// BuildImage makes the recipe's image (as root: debootstrap creates device
// nodes and owners) unless its tag exists, and returns the tag. logf
// receives progress lines. The directory debootstrap filled is removed
// whatever happens; the image stays for the next run.
func BuildImage(ctx context.Context, r Recipe, logf func(format string, args ...any)) (string, error) {
	tag := r.Tag()
	if ImageExists(ctx, tag) {
		logf("image %s cached", tag)
		return tag, nil
	}
	work, err := os.MkdirTemp("", "fan-systemdbox-")
	if err != nil {
		return "", fmt.Errorf("image %s: %w", tag, err)
	}
	root := filepath.Join(work, "root")
	defer removeRoot(work, logf)
	logf("image %s: debootstrap %s from %s (once; later runs reuse the tag)", tag, r.Suite, r.Mirror)
	cmd := exec.CommandContext(ctx, "debootstrap", r.debootstrapArgs(root)...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("image %s: debootstrap: %w\n%s", tag, err, tail(out, 4000))
	}
	// The image's apt reads the same mirror, and its machine-id is made at
	// each boot (an empty file tells systemd so).
	if err := os.WriteFile(filepath.Join(root, "etc/machine-id"), nil, 0o444); err != nil {
		return "", fmt.Errorf("image %s: %w", tag, err)
	}
	tarCmd := exec.CommandContext(ctx, "tar", "-C", root, "--numeric-owner", "-c", ".")
	imp := exec.CommandContext(ctx, "docker", "import", "--change", `CMD ["/sbin/init"]`, "-", tag)
	pipe, err := tarCmd.StdoutPipe()
	if err != nil {
		return "", fmt.Errorf("image %s: %w", tag, err)
	}
	imp.Stdin = pipe
	var tarErr strings.Builder
	tarCmd.Stderr = &tarErr
	if err := tarCmd.Start(); err != nil {
		return "", fmt.Errorf("image %s: tar: %w", tag, err)
	}
	out, impErr := imp.CombinedOutput()
	if err := tarCmd.Wait(); err != nil {
		return "", fmt.Errorf("image %s: tar: %w: %s", tag, err, tarErr.String())
	}
	if impErr != nil {
		return "", fmt.Errorf("image %s: docker import: %w: %s", tag, impErr, out)
	}
	logf("image %s built", tag)
	return tag, nil
}

// removeRoot deletes debootstrap's directory, first unmounting anything a
// failed debootstrap left mounted in it (its proc and sys), so the removal
// never reaches through a mount into the host.
func removeRoot(work string, logf func(format string, args ...any)) {
	mounts, err := os.ReadFile("/proc/self/mounts")
	if err == nil {
		var under []string
		for _, line := range strings.Split(string(mounts), "\n") {
			f := strings.Fields(line)
			if len(f) > 1 && strings.HasPrefix(f[1], work+"/") {
				under = append(under, f[1])
			}
		}
		// Deepest first.
		slices.SortFunc(under, func(a, b string) int { return len(b) - len(a) })
		for _, m := range under {
			if out, err := exec.Command("umount", "-l", m).CombinedOutput(); err != nil {
				logf("umount %s: %v %s; leaving %s in place", m, err, out, work)
				return
			}
		}
	}
	if err := os.RemoveAll(work); err != nil {
		logf("remove %s: %v", work, err)
	}
}

func tail(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}
