package systemdbox

import (
	"os"
	"path/filepath"
	"testing"
)

func TestMirrorIn(t *testing.T) {
	for _, tc := range []struct{ name, text, want string }{
		{"deb822", `Types: deb
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main

Types: deb
# a comment
URIs: http://mirror.example.net/debian
Suites: bookworm bookworm-updates
Components: main
`, "http://mirror.example.net/debian"},
		{"one-line with options", `deb [arch=amd64 signed-by=/k.gpg] https://packages.example.net/apt cloud-sdk-bookworm main
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://mirror.example.net/debian bookworm main
`, "http://mirror.example.net/debian"},
		{"only other suites", "deb http://deb.debian.org/debian-security bookworm-security main\n", ""},
		{"deb822 last block without blank line", "URIs: http://a.example.net/debian\nSuites: bookworm\n", "http://a.example.net/debian"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "sources")
			if err := os.WriteFile(p, []byte(tc.text), 0o644); err != nil {
				t.Fatal(err)
			}
			if got := mirrorIn(p, "bookworm"); got != tc.want {
				t.Fatalf("mirrorIn = %q, want %q", got, tc.want)
			}
		})
	}
}

// The image is reused only while nothing that shapes it changed.
func TestTagFollowsRecipe(t *testing.T) {
	base := Recipe{Suite: "bookworm", Mirror: "http://m.example.net/debian", Packages: []string{"systemd", "iproute2"}}
	same := base
	if base.Tag() != same.Tag() {
		t.Fatal("equal recipes, different tags")
	}
	for name, r := range map[string]Recipe{
		"suite":    {Suite: "trixie", Mirror: base.Mirror, Packages: base.Packages},
		"mirror":   {Suite: base.Suite, Mirror: "http://n.example.net/debian", Packages: base.Packages},
		"packages": {Suite: base.Suite, Mirror: base.Mirror, Packages: []string{"systemd", "iproute2", "procps"}},
	} {
		if r.Tag() == base.Tag() {
			t.Errorf("a changed %s keeps tag %s", name, base.Tag())
		}
	}
}
