package replicate_test

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fanpbx/fan/lab/prereq"
	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/waittest"
	"github.com/fanpbx/fan/services/replicator/internal/fstree"
	"github.com/fanpbx/fan/services/replicator/internal/replicate"
	"github.com/fanpbx/fan/services/replicator/internal/store"
)

// TestHostileHolder plays a hostile holder through the bus against two
// targets running as root: n2 with the default policy, n3 with
// allow_outside_symlinks. The holder publishes a full manifest with
// x -> (a directory outside the trees), then a progress manifest with
// x/pwned, setuid, then a setuid file owned by root. Nothing may appear
// outside, and modes and owners follow each target's policy.
func TestHostileHolder(t *testing.T) {
	if os.Geteuid() != 0 {
		prereq.SkipOrFail(t, "the attack is on a replicator running as root")
	}
	l := newLab(t)
	outside := t.TempDir()
	n2, n3 := newNode(t, "n2"), newNode(t, "n3")
	const rootUID, rootGID = 4242, 4343
	for _, n := range []*node{n2, n3} {
		if err := os.MkdirAll(n.root, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(n.root, rootUID, rootGID); err != nil {
			t.Fatal(err)
		}
	}
	st := l.holderStore()
	mark := l.mark()
	l.start(n2)
	l.start(n3, func(c *replicate.Config) { c.Trees[0].Policy.AllowOutsideSymlinks = true })
	l.setHolder("n1", 1)

	file := func(rel string, data []byte, mode uint32) fstree.Entry {
		if _, err := st.Put(l.ctx, store.HashOf(data), bytes.NewReader(data)); err != nil {
			t.Fatal(err)
		}
		return fstree.Entry{Path: rel, Kind: fstree.KindFile, Mode: mode, Size: int64(len(data)),
			Hash: store.HashOf(data), MTime: time.Now().UnixNano()}
	}
	publish := func(progress bool, gen uint64, es []fstree.Entry) {
		fstree.Sort(es)
		l.publishAsN1(st, progress, gen, es)
	}
	applied := func(node string, gen uint64) *events.ReplicationApplied {
		var a *events.ReplicationApplied
		waittest.Succeeds(l.t, l.patience(10*time.Second), fmt.Sprintf("%s confirms generation %d", node, gen), func() error {
			_, p, i := l.find(mark, func(_ events.Envelope, p events.Payload) bool {
				x, ok := p.(*events.ReplicationApplied)
				return ok && x.Node == node && x.Generation == gen
			})
			if i < 0 {
				return fmt.Errorf("no confirmation")
			}
			a = p.(*events.ReplicationApplied)
			return nil
		})
		return a
	}
	nothingOutside := func() {
		t.Helper()
		des, err := os.ReadDir(outside)
		if err != nil {
			t.Fatal(err)
		}
		if len(des) != 0 {
			t.Fatalf("the replicator wrote outside its tree: %s", des[0].Name())
		}
	}

	// 1. The symlink out of the tree.
	link := fstree.Entry{Path: "x", Kind: fstree.KindSymlink, Link: outside}
	publish(false, 1, []fstree.Entry{link, file("a.txt", []byte("a"), 0o644)})
	if a := applied("n2", 1); !strings.Contains(a.Error, "unsafe manifest") {
		t.Fatalf("n2 applied a manifest with a symlink out of the tree: %+v", a)
	}
	if _, err := os.Lstat(filepath.Join(n2.root, "x")); !os.IsNotExist(err) {
		t.Fatalf("n2 made the symlink (%v)", err)
	}
	if a := applied("n3", 1); a.Error != "" {
		t.Fatalf("n3 (allow_outside_symlinks) refused: %s", a.Error)
	}
	if got, err := os.Readlink(filepath.Join(n3.root, "x")); err != nil || got != outside {
		t.Fatalf("n3's x: %q %v", got, err)
	}

	// 2. A progress manifest writes through it. The directory it also
	// lists shows the apply ran; the next full manifest's confirmation
	// shows it ended (a tree's passes run one at a time).
	publish(true, 2, []fstree.Entry{{Path: "progress-seen", Kind: fstree.KindDir, Mode: 0o755},
		file("x/pwned", []byte("#!/bin/sh\nid > /tmp/owned\n"), 0o4755)})
	waittest.Succeeds(l.t, l.patience(10*time.Second), "n3 applies the progress manifest", func() error {
		_, err := os.Stat(filepath.Join(n3.root, "progress-seen"))
		return err
	})

	// 3. A setuid file owned by root, and an existing file whose owner the
	// manifest changes.
	if err := os.WriteFile(filepath.Join(n2.root, "a.txt"), []byte("a"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(filepath.Join(n2.root, "a.txt"), 5151, 5252); err != nil {
		t.Fatal(err)
	}
	suid := file("suid", []byte("#!/bin/sh\nid\n"), 0o4755)
	owned := file("a.txt", []byte("a"), 0o2644)
	publish(false, 3, []fstree.Entry{{Path: "x", Kind: fstree.KindSymlink, Link: "suid"}, suid, owned})
	for _, n := range []string{"n2", "n3"} {
		if a := applied(n, 3); a.Error != "" {
			t.Fatalf("%s: %s", n, a.Error)
		}
	}
	nothingOutside()
	for _, c := range []struct {
		n         *node
		rel       string
		mode      os.FileMode
		uid, gid  uint32
		whyOwners string
	}{
		{n2, "suid", 0o755, rootUID, rootGID, "new: the tree root's owner"},
		{n3, "suid", 0o755, rootUID, rootGID, "new: the tree root's owner"},
		{n2, "a.txt", 0o644, 5151, 5252, "existing: its own owner"},
	} {
		fi, err := os.Stat(filepath.Join(c.n.root, c.rel))
		if err != nil {
			t.Fatal(err)
		}
		s := fi.Sys().(*syscall.Stat_t)
		if fi.Mode() != c.mode || s.Uid != c.uid || s.Gid != c.gid {
			t.Errorf("%s %s: mode %v uid %d gid %d, want %v %d %d (%s)", c.n.name, c.rel, fi.Mode(), s.Uid, s.Gid, c.mode, c.uid, c.gid, c.whyOwners)
		}
	}
}
