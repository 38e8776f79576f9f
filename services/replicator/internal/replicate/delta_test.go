package replicate_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/waittest"
	"github.com/fanpbx/fan/services/replicator/internal/fstree"
	"github.com/fanpbx/fan/services/replicator/internal/replicate"
	"github.com/fanpbx/fan/services/replicator/internal/store"
)

// TestChangesGoOutAsDeltas: once the initial sync is done, a change the
// holder's notifications report is published as a delta naming only what
// changed (the full manifest stays as it was), and the standby applies
// and confirms it.
func TestChangesGoOutAsDeltas(t *testing.T) {
	l := newLab(t)
	n1, n2 := newNode(t, "n1"), newNode(t, "n2")
	for i := range 20 {
		write(t, n1.root, fmt.Sprintf("default/%d/INBOX/msg0000.txt", i), random(100))
	}
	hour := func(c *replicate.Config) { c.ScanInterval = time.Hour } // notifications only
	mark := l.mark()
	l.start(n1, hour)
	l.start(n2, hour)
	l.setHolder("n1", 1)
	l.waitCaughtUp(mark, "n1", "n2", "voicemail", 1)
	st := l.holderStore()
	full := events.ReplManifestName(cluster, group, "voicemail", "n1")
	head, ok, err := st.ManifestHead(l.ctx, full)
	if err != nil || !ok {
		t.Fatalf("head of the full manifest: %v %v", ok, err)
	}

	mark = l.mark()
	write(t, n1.root, "default/3/INBOX/msg0001.txt", []byte("new"))
	if err := os.Remove(filepath.Join(n1.root, "default/4/INBOX/msg0000.txt")); err != nil {
		t.Fatal(err)
	}
	write(t, n1.root, "default/5/INBOX/msg0000.txt", []byte("edited"))
	waittest.Succeeds(l.t, l.patience(10*time.Second), "standby has the changes", func() error { return same(n1.root, n2.root) })

	// Every delta since the full manifest, in order, names only the three
	// paths.
	var seen []string
	var last *fstree.Delta
	for seq := head.AsOf + 1; ; seq++ {
		d, err := st.GetDelta(l.ctx, store.DeltaName(cluster, group, "voicemail", "n1", seq))
		if err != nil {
			break
		}
		if last != nil && d.Prev != last.Generation {
			t.Fatalf("delta %d follows generation %d, not %d", seq, d.Prev, last.Generation)
		}
		last = d
		for _, e := range d.Entries {
			seen = append(seen, e.Path)
		}
		seen = append(seen, d.Deleted...)
	}
	if last == nil {
		t.Fatal("no delta published")
	}
	slices.Sort(seen)
	seen = slices.Compact(seen)
	want := []string{"default/3/INBOX/msg0001.txt", "default/4/INBOX/msg0000.txt", "default/5/INBOX/msg0000.txt"}
	if !slices.Equal(seen, want) {
		t.Fatalf("deltas named %v, want %v", seen, want)
	}
	if h, _, _ := st.ManifestHead(l.ctx, full); h.Generation != head.Generation {
		t.Fatalf("the full manifest was published again (generation %d, was %d)", h.Generation, head.Generation)
	}
	waittest.Succeeds(l.t, l.patience(10*time.Second), "the last delta confirmed and caught up", func() error {
		if _, _, i := l.find(mark, func(_ events.Envelope, p events.Payload) bool {
			s, ok := p.(*events.ReplicationStatus)
			return ok && s.Peer == "n2" && s.CaughtUp && s.Generation == last.Generation
		}); i < 0 {
			return fmt.Errorf("no caught-up status for generation %d", last.Generation)
		}
		return nil
	})
}

// TestTargetFollowsDeltasInOrder: a target applies a delta only right
// after the one it names as its predecessor; a delta of another chain is
// never applied; a gap (the next delta gone) makes it read the full
// manifest, and the deltas after that follow it.
func TestTargetFollowsDeltasInOrder(t *testing.T) {
	l := newLab(t)
	n2 := newNode(t, "n2")
	st := l.holderStore()
	l.start(n2)
	l.setHolder("n1", 1)
	content := map[string][]byte{}
	file := func(p, data string) fstree.Entry {
		b := []byte(data)
		if _, err := st.Put(l.ctx, store.HashOf(b), bytes.NewReader(b)); err != nil {
			t.Fatal(err)
		}
		content[p] = b
		return fstree.Entry{Path: p, Kind: fstree.KindFile, Mode: 0o640, MTime: time.Now().UnixNano(), Size: int64(len(b)), Hash: store.HashOf(b)}
	}
	dir := fstree.Entry{Path: "d", Kind: fstree.KindDir, Mode: 0o750}
	fullManifest := func(gen, asOf uint64, es ...fstree.Entry) {
		es = append([]fstree.Entry{dir}, es...)
		fstree.Sort(es)
		m := &fstree.Manifest{Cluster: cluster, Group: group, Tree: "voicemail", Node: "n1", Epoch: 1, Generation: gen, AsOf: asOf,
			Created: time.Now(), Changed: time.Now(), Digest: fstree.Digest(es), Entries: es}
		if err := st.PutManifest(l.ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	delta := func(seq, gen, prev uint64, deleted []string, es ...fstree.Entry) *fstree.Delta {
		d := &fstree.Delta{Cluster: cluster, Group: group, Tree: "voicemail", Node: "n1", Epoch: 1, Seq: seq, Generation: gen, Prev: prev,
			Created: time.Now(), Changed: time.Now(), Digest: fstree.DeltaDigest(es, deleted), Entries: es, Deleted: deleted}
		if err := st.PutDelta(l.ctx, d); err != nil {
			t.Fatal(err)
		}
		return d
	}
	has := func(p string) error {
		b, err := os.ReadFile(filepath.Join(n2.root, p))
		if err != nil {
			return err
		}
		if !bytes.Equal(b, content[p]) {
			return fmt.Errorf("%s holds %q", p, b)
		}
		return nil
	}
	confirmed := func(from int, gen uint64, digest string) {
		t.Helper()
		waittest.Succeeds(l.t, l.patience(10*time.Second), fmt.Sprintf("generation %d confirmed", gen), func() error {
			if _, _, i := l.find(from, func(_ events.Envelope, p events.Payload) bool {
				a, ok := p.(*events.ReplicationApplied)
				return ok && a.Node == "n2" && a.Generation == gen && a.Digest == digest && a.Error == ""
			}); i < 0 {
				return fmt.Errorf("not yet")
			}
			return nil
		})
	}

	a := file("d/a.txt", "a")
	fullManifest(100, 1000, a)
	waittest.Succeeds(l.t, l.patience(10*time.Second), "full manifest applied", func() error { return has("d/a.txt") })

	mark := l.mark()
	d1 := delta(1001, 110, 100, nil, file("d/b.txt", "b"))
	confirmed(mark, 110, d1.Digest)
	if err := has("d/b.txt"); err != nil {
		t.Fatal(err)
	}

	// The next delta of another chain (its predecessor is not what was
	// applied) would delete a: never applied. Delta 1003 comes without
	// 1002: not applied either until the gap is filled.
	delta(1002, 125, 999, []string{"d/a.txt"})
	delta(1003, 130, 120, nil, file("d/d.txt", "d"))
	// The holder's new full manifest includes 1002 and 1003 (c came in
	// the delta the target never got).
	c := file("d/c.txt", "c")
	fullManifest(140, 1003, a, file("d/b.txt", "b"), c, file("d/d.txt", "d"))
	waittest.Succeeds(l.t, l.patience(10*time.Second), "the gap closed by the full manifest", func() error {
		for _, p := range []string{"d/a.txt", "d/b.txt", "d/c.txt", "d/d.txt"} {
			if err := has(p); err != nil {
				return err
			}
		}
		return nil
	})
	if _, _, i := l.find(0, func(_ events.Envelope, p events.Payload) bool {
		a, ok := p.(*events.ReplicationApplied)
		return ok && (a.Generation == 125 || a.Generation == 130)
	}); i >= 0 {
		t.Fatal("a delta out of its chain was applied")
	}

	// Deltas after the full manifest follow it.
	mark = l.mark()
	d4 := delta(1004, 150, 140, []string{"d/b.txt"})
	confirmed(mark, 150, d4.Digest)
	if _, err := os.Stat(filepath.Join(n2.root, "d/b.txt")); !os.IsNotExist(err) {
		t.Fatalf("d/b.txt not deleted by the delta: %v", err)
	}
	// A full manifest under the last delta's generation (a rebase) is not
	// read again: nothing is confirmed for it beyond what was.
	mark = l.mark()
	fullManifest(150, 1004, a, c, file("d/d.txt", "d"))
	d5 := delta(1005, 160, 150, nil, file("d/e.txt", "e"))
	confirmed(mark, 160, d5.Digest)
	if _, _, i := l.find(mark, func(_ events.Envelope, p events.Payload) bool {
		a, ok := p.(*events.ReplicationApplied)
		return ok && a.Generation == 150
	}); i >= 0 {
		t.Fatal("the rebased full manifest was applied again")
	}
}

// TestDeltaDeletionsMeetTheValveTogether: deletions cut into many small
// deltas are judged together over the last minute, so a wipe arriving a
// few files at a time is still stopped.
func TestDeltaDeletionsMeetTheValveTogether(t *testing.T) {
	l := newLab(t)
	n1, n2 := newNode(t, "n1"), newNode(t, "n2")
	for i := range 100 {
		write(t, n1.root, fmt.Sprintf("default/%d/INBOX/msg0000.txt", i), random(50))
	}
	hour := func(c *replicate.Config) { c.ScanInterval = time.Hour }
	mark := l.mark()
	l.start(n1, hour)
	l.start(n2, hour)
	l.setHolder("n1", 1)
	l.waitCaughtUp(mark, "n1", "n2", "voicemail", 1)

	// Four deletions at a time, each batch replicated before the next:
	// each alone is under the share (10 % of 100), together they are not.
	for i := 0; i < 20; i += 4 {
		for j := i; j < i+4; j++ {
			if err := os.Remove(filepath.Join(n1.root, fmt.Sprintf("default/%d/INBOX/msg0000.txt", j))); err != nil {
				t.Fatal(err)
			}
		}
		last := filepath.Join(n2.root, fmt.Sprintf("default/%d/INBOX/msg0000.txt", i+3))
		waittest.Succeeds(l.t, l.patience(10*time.Second), "a batch deleted or refused", func() error {
			if _, err := os.Stat(last); os.IsNotExist(err) {
				return nil
			}
			if _, _, i := l.find(mark, func(_ events.Envelope, p events.Payload) bool {
				a, ok := p.(*events.ReplicationApplied)
				return ok && a.Node == "n2" && a.Error != ""
			}); i >= 0 {
				return nil
			}
			return fmt.Errorf("not yet")
		})
	}
	waittest.Succeeds(l.t, l.patience(10*time.Second), "the valve stops the wipe", func() error {
		if _, _, i := l.find(mark, func(_ events.Envelope, p events.Payload) bool {
			a, ok := p.(*events.ReplicationAlarm)
			return ok && a.Reason == events.AlarmSafetyValve
		}); i < 0 {
			return fmt.Errorf("no alarm")
		}
		return nil
	})
	left := 0
	for i := range 20 {
		if _, err := os.Stat(filepath.Join(n2.root, fmt.Sprintf("default/%d/INBOX/msg0000.txt", i))); err == nil {
			left++
		}
	}
	if left == 0 {
		t.Fatal("every deletion reached the standby")
	}

	// The holder's files come back: the standby takes the tree as it
	// stands, whole.
	for i := range 20 {
		write(t, n1.root, fmt.Sprintf("default/%d/INBOX/msg0000.txt", i), random(60))
	}
	waittest.Succeeds(l.t, l.patience(20*time.Second), "the standby follows the restored tree", func() error { return same(n1.root, n2.root) })
}

// TestRenamedDirectoryIsFollowed: a directory renamed inside the tree
// goes out as what it now is, and a file written in it afterwards is
// notified under its new path (with no periodic scan to catch it).
func TestRenamedDirectoryIsFollowed(t *testing.T) {
	l := newLab(t)
	n1, n2 := newNode(t, "n1"), newNode(t, "n2")
	write(t, n1.root, "default/100/INBOX/msg0000.txt", []byte("one"))
	write(t, n1.root, "default/100/Old/msg0000.txt", []byte("two"))
	hour := func(c *replicate.Config) { c.ScanInterval = time.Hour }
	mark := l.mark()
	l.start(n1, hour)
	l.start(n2, hour)
	l.setHolder("n1", 1)
	l.waitCaughtUp(mark, "n1", "n2", "voicemail", 1)

	if err := os.Rename(filepath.Join(n1.root, "default/100"), filepath.Join(n1.root, "default/200")); err != nil {
		t.Fatal(err)
	}
	waittest.Succeeds(l.t, l.patience(10*time.Second), "the rename replicated", func() error { return same(n1.root, n2.root) })
	write(t, n1.root, "default/200/Old/msg0001.txt", []byte("three"))
	waittest.Succeeds(l.t, l.patience(10*time.Second), "a file in the renamed directory replicated", func() error { return same(n1.root, n2.root) })
}

// TestPeriodicScanCatchesWhatNotificationsMiss: a file written through a
// hard link outside the tree raises no notification on the tree's
// directories; the periodic scan finds it and sends it as a delta.
func TestPeriodicScanCatchesWhatNotificationsMiss(t *testing.T) {
	l := newLab(t)
	n1, n2 := newNode(t, "n1"), newNode(t, "n2")
	write(t, n1.root, "default/1/INBOX/msg0000.txt", []byte("one"))
	outside := filepath.Join(t.TempDir(), "link")
	if err := os.Link(filepath.Join(n1.root, "default/1/INBOX/msg0000.txt"), outside); err != nil {
		t.Fatal(err)
	}
	mark := l.mark()
	l.start(n1)
	l.start(n2)
	l.setHolder("n1", 1)
	l.waitCaughtUp(mark, "n1", "n2", "voicemail", 1)
	if err := os.WriteFile(outside, []byte("written past the watches"), 0o640); err != nil {
		t.Fatal(err)
	}
	waittest.Succeeds(l.t, l.patience(10*time.Second), "the periodic scan sent it", func() error { return same(n1.root, n2.root) })
}

// TestFullManifestRebasesTheDeltas: every few deltas (here 3) the holder
// publishes the tree as its full manifest under the last delta's
// generation, deletes the deltas the previous one included, and a
// standby that starts then reads the full manifest and the deltas after
// it.
func TestFullManifestRebasesTheDeltas(t *testing.T) {
	old := replicate.SetFullEvery(3)
	t.Cleanup(func() { replicate.SetFullEvery(old) })
	l := newLab(t)
	n1, n2 := newNode(t, "n1"), newNode(t, "n2")
	write(t, n1.root, "default/1/INBOX/msg0000.txt", []byte("zero"))
	hour := func(c *replicate.Config) { c.ScanInterval = time.Hour }
	mark := l.mark()
	l.start(n1, hour)
	stop2 := l.start(n2, hour)
	l.setHolder("n1", 1)
	l.waitCaughtUp(mark, "n1", "n2", "voicemail", 1)
	st := l.holderStore()
	full := events.ReplManifestName(cluster, group, "voicemail", "n1")
	first, _, err := st.ManifestHead(l.ctx, full)
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 7; i++ {
		rel := fmt.Sprintf("default/1/INBOX/msg%04d.txt", i)
		write(t, n1.root, rel, random(30))
		waittest.Succeeds(l.t, l.patience(10*time.Second), rel+" replicated", func() error {
			_, err := os.Stat(filepath.Join(n2.root, rel))
			return err
		})
	}
	var head store.Head
	waittest.Succeeds(l.t, l.patience(10*time.Second), "a rebased full manifest", func() error {
		h, _, err := st.ManifestHead(l.ctx, full)
		if err != nil {
			return err
		}
		if h.AsOf < first.AsOf+6 {
			return fmt.Errorf("as of %d, want at least %d", h.AsOf, first.AsOf+6)
		}
		head = h
		return nil
	})
	waittest.Succeeds(l.t, l.patience(10*time.Second), "the deltas of the first rebase deleted", func() error {
		if _, err := st.GetDelta(l.ctx, store.DeltaName(cluster, group, "voicemail", "n1", first.AsOf+1)); !errors.Is(err, store.ErrNoManifest) {
			return fmt.Errorf("delta %d still there (%v)", first.AsOf+1, err)
		}
		return nil
	})
	if d, err := st.GetDelta(l.ctx, store.DeltaName(cluster, group, "voicemail", "n1", head.AsOf)); err != nil || d.Generation != head.Generation {
		t.Fatalf("the full manifest's generation is not its last delta's: %+v %v", head, err)
	}

	// A standby that starts afresh reads the full manifest and what follows.
	stop2()
	n3 := newNode(t, "n3")
	l.start(n3, hour)
	write(t, n1.root, "default/1/INBOX/msg0100.txt", random(30))
	waittest.Succeeds(l.t, l.patience(10*time.Second), "the new standby has everything", func() error { return same(n1.root, n3.root) })
}
