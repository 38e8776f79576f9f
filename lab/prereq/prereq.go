// Package prereq is how every test in fan that needs something beyond Go
// (root, a Debian package, the built binaries) says so, in one place: a
// missing prerequisite skips the test on a developer's machine but fails it
// under CI (CI set), where a skip would hide a broken image behind a green run.
package prereq

import (
	"fmt"
	"os"
	"os/exec"
	"testing"
)

// SkipOrFail skips a test whose prerequisites are missing, except under CI.
func SkipOrFail(t testing.TB, why string) {
	t.Helper()
	if os.Getenv("CI") != "" {
		t.Fatalf("prerequisite missing under CI: %s", why)
	}
	t.Skip(why)
}

// Root requires root (network namespaces, raw sockets).
func Root(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		SkipOrFail(t, fmt.Sprintf("needs root (euid %d)", os.Geteuid()))
	}
}

// Need requires every program on PATH; pkg names the Debian packages that
// provide them, for the message.
func Need(t testing.TB, pkg string, programs ...string) {
	t.Helper()
	for _, p := range programs {
		if _, err := exec.LookPath(p); err != nil {
			SkipOrFail(t, fmt.Sprintf("%s is not installed (apt-get install %s)", p, pkg))
		}
	}
}
