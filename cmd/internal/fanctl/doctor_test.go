package fanctl_test

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fanpbx/fan/cmd/internal/fanctl"
)

// fanctl doctor's exit status follows its findings: 1 on an error (here a
// host with no fan file), 0 with warnings only, 2 for a bad invocation.
func TestDoctorExitStatus(t *testing.T) {
	var out, errb bytes.Buffer
	if code := fanctl.Main([]string{"doctor", "--etc", t.TempDir(), "--json"}, &out, &errb, "t"); code != 1 {
		t.Fatalf("exit %d on a host with no fan file: %s %s", code, out.String(), errb.String())
	}
	var rep struct {
		Errors   int `json:"errors"`
		Findings []struct {
			Severity, Check string
		} `json:"findings"`
	}
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil || rep.Errors == 0 || rep.Findings[0].Check != "files.none" {
		t.Fatalf("report %+v (%v): %s", rep, err, out.String())
	}

	// A witness's fan-nats file alone: nothing there can fail but the
	// clock, a warning at worst.
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "nats.yaml"), []byte("server_name: nats-ctl\nlisten: 127.0.0.1:4222\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if code := fanctl.Main([]string{"doctor", "--etc", dir}, &out, &errb, "t"); code != 0 {
		t.Fatalf("exit %d: %s", code, out.String())
	}
	if !strings.Contains(out.String(), "0 errors") {
		t.Fatalf("text report: %s", out.String())
	}
	if code := fanctl.Main([]string{"doctor", "extra"}, &out, &errb, "t"); code != 2 {
		t.Fatalf("exit %d for an argument", code)
	}
}
