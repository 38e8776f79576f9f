// Command fan-depcheck fails when fan's modules select different versions
// of one dependency, or when a program that must not carry nats-server
// compiles it (make deps-check, part of make test). It checks the module
// directories given, or every module of the workspace; the programs are
// always the workspace's.
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
	checked, err := checkNoServer(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, "fan-depcheck:", err)
		os.Exit(1)
	}
	fmt.Printf("fan-depcheck: %d programs without nats-server\n", checked)
}

// natsServer is the module only fan-nats and the lab may compile: a
// service reaches the bus as a client, and package natsserver, which runs
// a server, would add some 2 MB and the server's code to every binary.
const natsServer = "github.com/nats-io/nats-server/v2"

// archiveOnly is what fanctl may compile of it: the snapshot format's
// reader and writer (standard library only), which backup's restore uses
// to rewrite a header in each stored message.
var archiveOnly = []string{natsServer + "/server/archive"}

// checkNoServer fails when a service's program or fanctl compiles
// nats-server (beyond fanctl's archive package), returning how many
// programs it checked.
func checkNoServer(ctx context.Context) (int, error) {
	out, err := exec.CommandContext(ctx, "go", "env", "GOWORK").Output()
	work := strings.TrimSpace(string(out))
	if err != nil || work == "" || work == "off" {
		return 0, fmt.Errorf("find the workspace (go env GOWORK): %v", err)
	}
	root := filepath.Dir(work)
	progs, err := filepath.Glob(filepath.Join(root, "services", "*", "cmd", "*"))
	if err != nil {
		return 0, err
	}
	type program struct {
		module, pkg string
		allow       []string
	}
	var list []program
	for _, p := range progs {
		list = append(list, program{module: filepath.Dir(filepath.Dir(p)), pkg: "./cmd/" + filepath.Base(p)})
	}
	list = append(list, program{module: filepath.Join(root, "cmd"), pkg: "./fanctl", allow: archiveOnly})
	var bad []string
	for _, p := range list {
		linked, err := depcheck.Linked(ctx, p.module, p.pkg, natsServer, p.allow...)
		if err != nil {
			return 0, err
		}
		if len(linked) > 0 {
			rel, _ := filepath.Rel(root, filepath.Join(p.module, p.pkg))
			bad = append(bad, fmt.Sprintf("%s compiles %s", rel, strings.Join(linked, ", ")))
		}
	}
	if len(bad) > 0 {
		return 0, fmt.Errorf("programs that must not carry nats-server do (only fan-nats and the lab import pkg/platform/natsserver):\n  %s", strings.Join(bad, "\n  "))
	}
	return len(list), nil
}
