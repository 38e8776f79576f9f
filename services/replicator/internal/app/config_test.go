package app

import (
	"slices"
	"testing"

	"github.com/fanpbx/fan/pkg/platform/config"
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
