package stack

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/fanpbx/fan/lab/prereq"
)

// BinDirForTest returns the directory with fan's built binaries for an
// end-to-end test (FAN_BIN, which `make test` sets). Without it the test is
// skipped locally, but fails under CI, where skipping would hide a broken
// failover behind a green run.
func BinDirForTest(t testing.TB) string {
	t.Helper()
	dir := os.Getenv("FAN_BIN")
	if dir == "" {
		prereq.SkipOrFail(t, "FAN_BIN is not set (make test builds the binaries and sets it)")
	}
	for _, b := range Binaries {
		if _, err := os.Stat(filepath.Join(dir, b)); err != nil {
			t.Fatalf("FAN_BIN=%s lacks %s: %v", dir, b, err)
		}
	}
	return dir
}

// RequireLab checks what the namespace lab needs: root and Kamailio.
func RequireLab(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		prereq.SkipOrFail(t, fmt.Sprintf("needs root for network namespaces (euid %d)", os.Geteuid()))
	}
	if _, err := execLookPath("kamailio"); err != nil {
		prereq.SkipOrFail(t, "kamailio is not installed (apt-get install kamailio)")
	}
}
