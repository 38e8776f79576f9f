package replicate

import (
	"io"
	"log/slog"
	"testing"

	"github.com/fanpbx/fan/services/replicator/internal/fstree"
)

// TestTargetRefusesManifestOfAnotherTree: a manifest read under this
// tree's name but whose header names another cluster, group or tree is
// not applied.
func TestTargetRefusesManifestOfAnotherTree(t *testing.T) {
	w := &target{shared: &shared{e: &Engine{cfg: Config{Cluster: "lab", Group: "pbx"}}, t: Tree{Name: "voicemail"},
		log: slog.New(slog.NewTextHandler(io.Discard, nil))}}
	for _, c := range []struct {
		m  fstree.Manifest
		ok bool
	}{
		{fstree.Manifest{Cluster: "lab", Group: "pbx", Tree: "voicemail"}, true},
		{fstree.Manifest{Cluster: "lab", Group: "pbx", Tree: "asterisk-etc"}, false},
		{fstree.Manifest{Cluster: "lab", Group: "other", Tree: "voicemail"}, false},
		{fstree.Manifest{Cluster: "prod", Group: "pbx", Tree: "voicemail"}, false},
		{fstree.Manifest{}, false},
	} {
		if got := w.namedAs(&c.m, "x"); got != c.ok {
			t.Errorf("%+v: %v, want %v", c.m, got, c.ok)
		}
	}
}
