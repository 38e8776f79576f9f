// Package depcheck finds the dependencies that fan's modules compile at
// different versions. Every module builds alone (its own go.mod), so a
// module left behind on an old version builds and ships with it, while the
// workspace build, which picks one version for all, hides it.
//
// What counts is what is compiled: the modules that provide a package to a
// module's build or its tests (go list -deps -test). Modules that appear
// only in the module graph (a go.mod read for version selection, nothing
// compiled from it) are not compared: go mod tidy removes any requirement
// that would align them, so a check on them could only be satisfied by
// hand and undone by the next tidy.
package depcheck

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"slices"
	"strings"
)

// Module is what one module compiles: dependency path -> version.
type Module struct {
	Dir  string
	Path string
	Deps map[string]string
}

// List reads what the module in dir compiles, for its packages and their
// tests, as it builds alone (GOWORK=off).
func List(ctx context.Context, dir string) (Module, error) {
	cmd := exec.CommandContext(ctx, "go", "list", "-deps", "-test",
		"-f", "{{with .Module}}{{.Path}} {{.Main}} {{.Version}}{{end}}", "./...")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOWORK=off")
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return Module{}, fmt.Errorf("go list -deps in %s: %w: %s", dir, err, strings.TrimSpace(errb.String()))
	}
	m := Module{Dir: dir, Deps: map[string]string{}}
	sc := bufio.NewScanner(&out)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		switch {
		case len(f) >= 2 && f[1] == "true":
			m.Path = f[0]
		case len(f) == 3:
			m.Deps[f[0]] = f[2]
		}
	}
	return m, sc.Err()
}

// Drift is one dependency selected at more than one version.
type Drift struct {
	Path string
	// Modules lists, per version, the modules (their directories) that select it.
	Modules map[string][]string
}

func (d Drift) String() string {
	var parts []string
	for _, v := range slices.Sorted(maps.Keys(d.Modules)) {
		parts = append(parts, fmt.Sprintf("%s in %s", v, strings.Join(d.Modules[v], ", ")))
	}
	return d.Path + ": " + strings.Join(parts, "; ")
}

// Find compares the modules' build lists. The modules themselves are left
// out: each replaces the others with their directory, whatever version a
// requirement names.
func Find(mods []Module) []Drift {
	own := map[string]bool{}
	for _, m := range mods {
		own[m.Path] = true
	}
	seen := map[string]map[string][]string{}
	for _, m := range mods {
		for p, v := range m.Deps {
			if own[p] {
				continue
			}
			if seen[p] == nil {
				seen[p] = map[string][]string{}
			}
			seen[p][v] = append(seen[p][v], m.Dir)
		}
	}
	var out []Drift
	for _, p := range slices.Sorted(maps.Keys(seen)) {
		if len(seen[p]) > 1 {
			for _, dirs := range seen[p] {
				slices.Sort(dirs)
			}
			out = append(out, Drift{Path: p, Modules: seen[p]})
		}
	}
	return out
}

// Linked lists the packages whose path starts with prefix that the program
// pkg (a package path or ./dir, in the module at dir, built alone) compiles,
// less those in allow: what a program must not carry, such as a service
// carrying nats-server.
func Linked(ctx context.Context, dir, pkg, prefix string, allow ...string) ([]string, error) {
	cmd := exec.CommandContext(ctx, "go", "list", "-deps", "-f", "{{.ImportPath}}", pkg)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOWORK=off")
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("go list -deps %s in %s: %w: %s", pkg, dir, err, strings.TrimSpace(errb.String()))
	}
	var linked []string
	for _, p := range strings.Fields(out.String()) {
		if (p == prefix || strings.HasPrefix(p, prefix+"/")) && !slices.Contains(allow, p) {
			linked = append(linked, p)
		}
	}
	return linked, nil
}
