package stack

import (
	"bufio"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// The lab restarts what fan's units restart, after their RestartSec: each
// of deploy/systemd's units that runs a service the lab runs is
// Restart=always with RestartSec equal to restartAfter.
func TestRestartedUnitsMatchTheShippedUnits(t *testing.T) {
	asterisk, err := FindShippedAsterisk()
	if err != nil {
		t.Fatal(err)
	}
	units, err := filepath.Glob(filepath.Join(filepath.Dir(asterisk), "systemd", "*.service"))
	if err != nil || len(units) == 0 {
		t.Fatalf("no units under deploy/systemd: %v", err)
	}
	var programs []string
	for _, u := range units {
		f, err := os.Open(u)
		if err != nil {
			t.Fatal(err)
		}
		keys := map[string]string{}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if k, v, ok := strings.Cut(strings.TrimSpace(sc.Text()), "="); ok {
				keys[k] = v
			}
		}
		f.Close()
		prog := filepath.Base(strings.Fields(keys["ExecStart"] + " ?")[0])
		if prog == "fanctl" {
			continue // fan-status: not run in the lab
		}
		programs = append(programs, prog)
		if keys["Restart"] != "always" {
			t.Errorf("%s: Restart=%s, the lab restarts %s always", filepath.Base(u), keys["Restart"], prog)
		}
		if d, err := time.ParseDuration(keys["RestartSec"]); err != nil || d != restartAfter {
			t.Errorf("%s: RestartSec=%s, the lab waits %v", filepath.Base(u), keys["RestartSec"], restartAfter)
		}
	}
	slices.Sort(programs)
	want := slices.Sorted(slices.Values(restartedUnits))
	if !slices.Equal(programs, want) {
		t.Errorf("units run %v, the lab restarts %v", programs, want)
	}
}
