// Command fan-depcheck fails when fan's modules select different versions
// of one dependency (make test runs it). It checks the module directories
// given, or every module of the workspace.
package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/fanpbx/fan/lab/depcheck"
)

func main() {
	ctx := context.Background()
	dirs := os.Args[1:]
	if len(dirs) == 0 {
		out, err := exec.CommandContext(ctx, "go", "list", "-m", "-f", "{{.Dir}}").Output()
		if err != nil {
			fmt.Fprintln(os.Stderr, "fan-depcheck: list the workspace's modules:", err)
			os.Exit(2)
		}
		dirs = strings.Fields(string(out))
	}
	if wd, err := os.Getwd(); err == nil {
		for i, d := range dirs {
			if rel, err := filepath.Rel(wd, d); err == nil && !strings.HasPrefix(rel, "..") {
				dirs[i] = rel // shorter to read; go list runs in it all the same
			}
		}
	}
	var mods []depcheck.Module
	for _, d := range dirs {
		m, err := depcheck.List(ctx, d)
		if err != nil {
			fmt.Fprintln(os.Stderr, "fan-depcheck:", err)
			os.Exit(2)
		}
		mods = append(mods, m)
	}
	drift := depcheck.Find(mods)
	for _, d := range drift {
		fmt.Println(d)
	}
	if len(drift) > 0 {
		fmt.Fprintf(os.Stderr, "fan-depcheck: %d dependencies at more than one version across %d modules; align them (go get PATH@VERSION in the modules behind)\n", len(drift), len(mods))
		os.Exit(1)
	}
	fmt.Printf("fan-depcheck: %d modules, one version of each dependency\n", len(mods))
}
