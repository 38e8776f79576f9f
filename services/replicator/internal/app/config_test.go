package app

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/platform/config"
	"github.com/fanpbx/fan/services/replicator/internal/calls"
)

const base = "cluster: lab\nnode: n1\nbus:\n  url: nats://127.0.0.1:4222\ngroup: pbx\n"

func TestConfigDefaults(t *testing.T) {
	var c Config
	if err := config.Parse("t", []byte(base), &c); err != nil {
		t.Fatal(err)
	}
	if len(c.Trees) != 2 || c.Trees[0].Path != "/etc/asterisk" || c.Trees[1].Path != "/var/spool/asterisk/voicemail" ||
		!slices.Contains(c.Trees[1].Exclude, "tmp/") {
		t.Fatalf("default trees: %+v", c.Trees)
	}
	if c.Safety.MaxDeleteShare != 0.10 || *c.Safety.AllowDeletes != 2 || c.StateDir != "/var/lib/fan/replicator" {
		t.Fatalf("defaults: %+v", c)
	}
}

// A tree above spool/outgoing leaves it out; a tree inside it is refused.
func TestNeverReplicated(t *testing.T) {
	var c Config
	if err := config.Parse("t", []byte(base+"trees:\n  - name: spool\n    path: /var/spool/asterisk\n"), &c); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(c.Trees[0].Exclude, "/outgoing") || !slices.Contains(c.Trees[0].Exclude, "/tmp") {
		t.Fatalf("excludes: %v", c.Trees[0].Exclude)
	}
	for name, body := range map[string]string{
		"inside outgoing": "trees:\n  - name: o\n    path: /var/spool/asterisk/outgoing/x\n",
		"relative":        "trees:\n  - name: o\n    path: etc\n",
		"bad name":        "trees:\n  - name: a.b\n    path: /x\n",
		"twice":           "trees:\n  - name: a\n    path: /x\n  - name: a\n    path: /y\n",
		"share":           "safety:\n  max_delete_share: 2\n",
		"astdb no ami":    "astdb:\n  enabled: true\n",
	} {
		var c Config
		err := config.Parse("t", []byte(base+body), &c)
		if err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// TestTreeRootsRefused: a tree at a system directory, inside another tree,
// over the state directory, or leading to a system directory through a
// symlink is refused, naming the key.
func TestTreeRootsRefused(t *testing.T) {
	link := filepath.Join(t.TempDir(), "asterisk")
	if err := os.Symlink("/etc", link); err != nil {
		t.Fatal(err)
	}
	cases := map[string]string{
		"trees[0].path": "trees:\n  - name: a\n    path: /\n",
		"trees[1].path": "trees:\n  - name: a\n    path: /srv/a\n  - name: b\n    path: /var\n",
	}
	for _, root := range []string{"/", "/etc", "/usr", "/var", "/bin", "/boot", "/dev", "/lib", "/proc", "/root", "/run", "/sbin", "/sys", "/etc/", "/var/../etc", link} {
		cases["trees[0].path "+root] = "trees:\n  - name: a\n    path: " + root + "\n"
	}
	cases["trees[1].path inside"] = "trees:\n  - name: a\n    path: /srv/pbx\n  - name: b\n    path: /srv/pbx/sub\n"
	cases["trees[1].path around"] = "trees:\n  - name: a\n    path: /srv/pbx/sub\n  - name: b\n    path: /srv/pbx\n"
	cases["trees[1].path same"] = "trees:\n  - name: a\n    path: /srv/pbx\n  - name: b\n    path: /srv/pbx/\n"
	cases["trees[0].path state"] = "state_dir: /srv/pbx/state\ntrees:\n  - name: a\n    path: /srv/pbx\n"
	cases["trees[0].path in state"] = "state_dir: /srv/state\ntrees:\n  - name: a\n    path: /srv/state/conflicts\n"
	for name, body := range cases {
		key, _, _ := strings.Cut(name, " ")
		var c Config
		err := config.Parse("t", []byte(base+body), &c)
		if err == nil || !strings.Contains(err.Error(), key) {
			t.Errorf("%s: err %v, want one naming %s", name, err, key)
		}
	}
	// Beside each other, and below system directories, trees are fine.
	var c Config
	ok := "trees:\n  - name: a\n    path: /etc/asterisk\n  - name: b\n    path: /var/spool/asterisk/voicemail\n  - name: c\n    path: /srv/pbx-extra\n    allow_outside_symlinks: true\n    preserve_owner: true\n    preserve_special_bits: true\n"
	if err := config.Parse("t", []byte(base+ok), &c); err != nil {
		t.Fatal(err)
	}
	if c.Trees[0].AllowOutsideSymlinks || c.Trees[0].PreserveOwner || c.Trees[0].PreserveSpecialBits ||
		!c.Trees[2].AllowOutsideSymlinks || !c.Trees[2].PreserveOwner || !c.Trees[2].PreserveSpecialBits {
		t.Fatalf("policy keys: %+v", c.Trees)
	}
}

// The recorder of calls is on wherever the file gives an AMI login, with
// the registrations' unless it has its own, and off otherwise or when
// turned off.
func TestCallsDefaults(t *testing.T) {
	const ami = "astdb:\n  enabled: true\n  ami: {address: \"127.0.0.1:5038\", username: fan, secret: s}\n"
	for name, tc := range map[string]struct {
		body    string
		enabled bool
		user    string
	}{
		"no AMI at all":          {"", false, ""},
		"the registrations'":     {ami, true, "fan"},
		"turned off":             {ami + "calls:\n  enabled: false\n", false, "fan"},
		"a login of its own":     {"calls:\n  ami: {address: \"127.0.0.1:5038\", username: rec, secret: s}\n", true, "rec"},
		"its own beside astdb's": {ami + "calls:\n  ami: {address: \"127.0.0.1:5038\", username: rec, secret: s}\n", true, "rec"},
	} {
		var c Config
		if err := config.Parse("t", []byte(base+tc.body), &c); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if *c.Calls.Enabled != tc.enabled || (tc.enabled && c.Calls.AMI.Username != tc.user) {
			t.Errorf("%s: enabled %v with %+v", name, *c.Calls.Enabled, c.Calls.AMI)
		}
		if tc.enabled && (c.Calls.ReconcileInterval.D() != 30*time.Second || c.Calls.SummaryInterval.D() != 2*time.Second || c.Calls.EventBuffer != 8192 || c.Calls.OrphanGrace.D() != calls.DefaultOrphanGrace) {
			t.Errorf("%s: defaults %+v", name, c.Calls)
		}
	}
	var og Config
	if err := config.Parse("t", []byte(base+ami+"calls:\n  orphan_grace: 10m\n"), &og); err != nil || og.Calls.OrphanGrace.D() != 10*time.Minute {
		t.Errorf("calls.orphan_grace 10m: %v, %v", og.Calls.OrphanGrace.D(), err)
	}
	var c Config
	if err := config.Parse("t", []byte(base+"calls:\n  enabled: true\n"), &c); err == nil || !strings.Contains(err.Error(), "calls.ami") {
		t.Errorf("on without a login: %v", err)
	}
}
