package depcheck

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestDriftIsFound builds real modules, two of which compile one
// dependency at two versions (local modules stand in for published ones),
// and lists them as make test does.
func TestDriftIsFound(t *testing.T) {
	root := t.TempDir()
	write := func(rel, text string) {
		t.Helper()
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, v := range []string{"v1", "v2"} {
		write("dep"+v+"/go.mod", "module example.com/dep\n\ngo 1.22\n")
		write("dep"+v+"/dep.go", "package dep\n\nconst V = \""+v+"\"\n")
	}
	module := func(name, version, dir string) {
		write(name+"/go.mod", "module example.com/"+name+"\n\ngo 1.22\n\nrequire example.com/dep "+version+"\n\nreplace example.com/dep "+version+" => ../"+dir+"\n")
		write(name+"/main.go", "package main\n\nimport \"example.com/dep\"\n\nfunc main() { println(dep.V) }\n")
	}
	module("a", "v1.2.0", "depv2")
	module("b", "v1.1.0", "depv1")
	module("c", "v1.2.0", "depv2")

	list := func(names ...string) []Module {
		var mods []Module
		for _, n := range names {
			m, err := List(context.Background(), filepath.Join(root, n))
			if err != nil {
				t.Fatal(err)
			}
			mods = append(mods, m)
		}
		return mods
	}
	if d := Find(list("a", "c")); len(d) != 0 {
		t.Fatalf("drift reported where there is none: %v", d)
	}
	d := Find(list("a", "b", "c"))
	if len(d) != 1 || d[0].Path != "example.com/dep" || len(d[0].Modules["v1.1.0"]) != 1 || len(d[0].Modules["v1.2.0"]) != 2 {
		t.Fatalf("drift %v", d)
	}
	if s := d[0].String(); !strings.Contains(s, "v1.1.0 in "+filepath.Join(root, "b")) {
		t.Fatalf("report %q does not name the module behind", s)
	}
}

// TestOwnModulesAreNotCompared: the repository's modules replace each
// other with their directories, whatever version a requirement names.
func TestOwnModulesAreNotCompared(t *testing.T) {
	mods := []Module{
		{Dir: "cmd", Path: "github.com/fanpbx/fan/cmd", Deps: map[string]string{"github.com/fanpbx/fan/pkg/ami": "v0.0.0", "golang.org/x/sys": "v0.49.0"}},
		{Dir: "replicator", Path: "github.com/fanpbx/fan/services/replicator", Deps: map[string]string{"github.com/fanpbx/fan/pkg/ami": "v0.0.0-00010101000000-000000000000", "golang.org/x/sys": "v0.49.0"}},
		{Dir: "ami", Path: "github.com/fanpbx/fan/pkg/ami"},
	}
	if d := Find(mods); len(d) != 0 {
		t.Fatalf("drift %v", d)
	}
	mods[1].Deps["golang.org/x/sys"] = "v0.2.0"
	if d := Find(mods); len(d) != 1 || d[0].Path != "golang.org/x/sys" {
		t.Fatalf("x/sys at two versions not reported: %v", d)
	}
}

// TestLinkedFindsAForbiddenPackage builds a program that imports a server
// package and one that imports only an allowed package of the same module.
func TestLinkedFindsAForbiddenPackage(t *testing.T) {
	root := t.TempDir()
	write := func(rel, text string) {
		t.Helper()
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("srv/go.mod", "module example.com/srv\n\ngo 1.22\n")
	write("srv/server/server.go", "package server\n\nconst Name = \"server\"\n")
	write("srv/archive/archive.go", "package archive\n\nconst Magic = \"m\"\n")
	write("app/go.mod", "module example.com/app\n\ngo 1.22\n\nrequire example.com/srv v1.0.0\n\nreplace example.com/srv v1.0.0 => ../srv\n")
	write("app/svc/main.go", "package main\n\nimport \"example.com/srv/server\"\n\nfunc main() { println(server.Name) }\n")
	write("app/tool/main.go", "package main\n\nimport \"example.com/srv/archive\"\n\nfunc main() { println(archive.Magic) }\n")

	ctx := context.Background()
	got, err := Linked(ctx, filepath.Join(root, "app"), "./svc", "example.com/srv", "example.com/srv/archive")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(got, ",") != "example.com/srv/server" {
		t.Fatalf("svc links %v, want the server package", got)
	}
	got, err = Linked(ctx, filepath.Join(root, "app"), "./tool", "example.com/srv", "example.com/srv/archive")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 0 {
		t.Fatalf("tool links %v, want nothing but the allowed package", got)
	}
}
