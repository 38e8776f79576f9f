package replicate_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/waittest"
	"github.com/fanpbx/fan/services/replicator/internal/replicate"
	"github.com/fanpbx/fan/services/replicator/internal/store"
)

// directTree writes a spool whose first pass is larger than the room a
// pass has in the store: small messages, then two recordings larger than
// one answer. It returns the contents by name.
func directTree(t *testing.T, root string) map[string][]byte {
	files := map[string][]byte{}
	for i := range 30 {
		files[fmt.Sprintf("default/%d/INBOX/msg%04d.txt", i%3, i)] = random(4 << 10)
	}
	files["default/0/INBOX/msg0100.wav"] = random(3<<20 + 777)
	files["default/1/INBOX/msg0101.wav"] = random(2<<20 + 5)
	for rel, data := range files {
		write(t, root, rel, data)
	}
	return files
}

// TestDirectTransferOfALargePass: a first sync larger than store_pass
// stores only its first part in the bus; the target fetches the rest from
// the holder and confirms the whole tree. A later small change goes
// through the store as before.
func TestDirectTransferOfALargePass(t *testing.T) {
	l := newLab(t)
	n1, n2 := newNode(t, "n1"), newNode(t, "n2")
	files := directTree(t, n1.root)
	room := func(c *replicate.Config) { c.StorePassBytes = 64 << 10 }
	mark := l.mark()
	l.start(n1, room)
	l.start(n2, room)
	l.setHolder("n1", 1)
	l.waitCaughtUp(mark, "n1", "n2", "voicemail", 1)
	if err := same(n1.root, n2.root); err != nil {
		t.Fatalf("after the first sync: %v", err)
	}
	st := l.holderStore()
	var hashes []string
	for _, data := range files {
		hashes = append(hashes, store.HashOf(data))
	}
	if err := st.Lookup(l.ctx, hashes); err != nil {
		t.Fatal(err)
	}
	var stored int
	for _, h := range hashes {
		if st.Has(h) {
			stored++
		}
	}
	if stored == 0 || stored == len(hashes) {
		t.Fatalf("%d of %d contents stored: want the pass's first part stored and the rest served", stored, len(hashes))
	}
	for _, rel := range []string{"default/0/INBOX/msg0100.wav", "default/1/INBOX/msg0101.wav"} {
		if st.Has(store.HashOf(files[rel])) {
			t.Errorf("%s stored, though the pass's room was used up before it", rel)
		}
	}
	t.Logf("%d of %d contents stored, the rest fetched from the holder", stored, len(hashes))

	// A new message fits the room: stored, and fetched from the store.
	mark = l.mark()
	msg := random(8 << 10)
	write(t, n1.root, "default/2/INBOX/msg0200.txt", msg)
	waittest.Succeeds(l.t, l.patience(20*time.Second), "the new message on n2", func() error {
		return same(n1.root, n2.root)
	})
	l.waitCaughtUp(mark, "n1", "n2", "voicemail", 1)
	if err := st.Lookup(l.ctx, []string{store.HashOf(msg)}); err != nil || !st.Has(store.HashOf(msg)) {
		t.Errorf("a small change was not stored (%v)", err)
	}
}

// TestTargetWithoutDirectTransferGetsEverythingFromTheStore: a target
// that does not fetch directly (direct_transfer off, or a release from
// before it) finds part of the pass missing from the store; its
// confirmation lists what it lacks, the holder stores exactly that, and
// the target catches up from the store.
func TestTargetWithoutDirectTransferGetsEverythingFromTheStore(t *testing.T) {
	l := newLab(t)
	n1, n2 := newNode(t, "n1"), newNode(t, "n2")
	directTree(t, n1.root)
	mark := l.mark()
	l.start(n1, func(c *replicate.Config) { c.StorePassBytes = 64 << 10 })
	l.start(n2)
	l.setHolder("n1", 1)
	l.waitCaughtUp(mark, "n1", "n2", "voicemail", 1)
	if err := same(n1.root, n2.root); err != nil {
		t.Fatal(err)
	}
	if _, _, i := l.find(mark, func(_ events.Envelope, p events.Payload) bool {
		a, ok := p.(*events.ReplicationApplied)
		return ok && a.Node == "n2" && len(a.Missing) > 0
	}); i < 0 {
		t.Error("n2 caught up without ever reporting missing contents: the holder stored the whole pass")
	}
}

// TestProgressWhileTheSourceStillReads: a target receives files of a
// first sync while the holder is still reading the rest of its tree, that
// is before any full manifest exists, from progress manifests published
// during the scan (direct transfer serves what they list).
func TestProgressWhileTheSourceStillReads(t *testing.T) {
	// The scan stops half way until a file is on n2: the full manifest
	// cannot come first, however fast the machine.
	var hashed atomic.Int64
	hold := make(chan struct{})
	var once sync.Once
	release := func() { once.Do(func() { close(hold) }) }
	replicate.AfterHashing(func(string) {
		if hashed.Add(1) == 100 {
			<-hold
		}
	})
	t.Cleanup(func() { replicate.AfterHashing(nil) })
	l := newLab(t)
	n1, n2 := newNode(t, "n1"), newNode(t, "n2")
	for i := range 200 {
		write(t, n1.root, fmt.Sprintf("default/%d/INBOX/msg%04d.txt", i%4, i), random(512))
	}
	st := l.holderStore()
	mark := l.mark()
	room := func(c *replicate.Config) { c.StorePassBytes = 1 } // everything served, nothing uploaded
	l.start(n1, room)
	l.start(n2, room)
	// Before the replicators stop, or n1's scan would wait forever.
	t.Cleanup(release)
	l.setHolder("n1", 1)
	name := events.ReplManifestName(cluster, group, "voicemail", "n1")
	waittest.Succeeds(l.t, l.patience(20*time.Second), "a file on n2 while n1 has no full manifest yet", func() error {
		found := false
		for i := range 200 {
			if _, err := os.Stat(filepath.Join(n2.root, fmt.Sprintf("default/%d/INBOX/msg%04d.txt", i%4, i))); err == nil {
				found = true
				break
			}
		}
		if !found {
			return fmt.Errorf("no file on n2 yet")
		}
		if _, err := st.GetManifest(l.ctx, name); !errors.Is(err, store.ErrNoManifest) {
			t.Fatalf("the full manifest came first (%v): no progress while scanning", err)
		}
		return nil
	})
	release()
	l.waitCaughtUp(mark, "n1", "n2", "voicemail", 1)
	if err := same(n1.root, n2.root); err != nil {
		t.Fatal(err)
	}
}
