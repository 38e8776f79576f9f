package config

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestFileChecks(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "seed.nk")
	if err := os.WriteFile(file, []byte("SU..."), 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "nope", "ca.pem")
	empty := filepath.Join(dir, "empty.pem")
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		err  error
		want string // "" = accepted
	}{
		{"readable file", FileReadable("bus.nkey_seed", file), ""},
		{"unset", FileReadable("bus.nkey_seed", ""), ""},
		{"missing file", FileReadable("bus.tls.ca", missing), "bus.tls.ca: " + missing + ": no such file or directory"},
		{"directory as file", FileReadable("bus.creds", dir), "bus.creds: " + dir + " is not a regular file"},
		{"zero-byte file", FileReadable("bus.tls.cert", empty), "bus.tls.cert: " + empty + " is empty"},
		{"directory", DirExists("state_dir", dir), ""},
		{"missing directory", DirExists("trees[0].path", filepath.Join(dir, "x")), "trees[0].path: " + filepath.Join(dir, "x") + ": no such file or directory"},
		{"file as directory", DirExists("state_dir", file), "state_dir: " + file + " is not a directory"},
		{"state file, directory there", ParentDirExists("state_file", filepath.Join(dir, "state.json")), ""},
		{"state file, no directory", ParentDirExists("state_file", missing), "state_file: " + missing + ": its directory"},
	} {
		switch {
		case c.want == "" && c.err != nil:
			t.Errorf("%s: refused: %v", c.name, c.err)
		case c.want != "" && (c.err == nil || !strings.HasPrefix(c.err.Error(), c.want)):
			t.Errorf("%s: got %v, want %q...", c.name, c.err, c.want)
		case c.want != "":
			var fe *FieldError
			if !errors.As(c.err, &fe) {
				t.Errorf("%s: %v is not a FieldError", c.name, c.err)
			}
		}
	}
	if os.Geteuid() != 0 {
		unreadable := filepath.Join(dir, "key.pem")
		if err := os.WriteFile(unreadable, []byte("x"), 0o000); err != nil {
			t.Fatal(err)
		}
		if err := FileReadable("bus.tls.key", unreadable); err == nil || !strings.Contains(err.Error(), "permission denied") {
			t.Errorf("unreadable key: %v", err)
		}
	}
}
