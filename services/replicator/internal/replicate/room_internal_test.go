package replicate

import (
	"testing"

	"github.com/fanpbx/fan/services/replicator/internal/fstree"
)

// TestStoreRoom: a pass stores contents in order until one does not fit,
// and leaves that one and every later one to direct transfer; a later pass
// does not store what was left (the targets fetched it from the holder)
// unless a target could not fetch it; no limit stores everything.
func TestStoreRoom(t *testing.T) {
	file := func(h string, size int64) fstree.Entry {
		return fstree.Entry{Kind: fstree.KindFile, Hash: h, Size: size}
	}
	var r storeRoom
	r.reset(100)
	for _, c := range []struct {
		e    fstree.Entry
		want bool
	}{
		{file("a", 60), true},
		{file("b", 30), true},
		{file("big", 50), false},
		{file("c", 5), false}, // in order: the rest of the pass goes direct
	} {
		if got := r.take(c.e); got != c.want {
			t.Errorf("first pass, %s: stored %v, want %v", c.e.Hash, got, c.want)
		}
	}
	if !r.skip("big") || !r.skip("c") || r.skip("a") {
		t.Error("what the first pass served is not skipped by later look-ups (or what it stored is)")
	}
	r.reset(100)
	if r.take(file("big", 50)) {
		t.Error("a later pass stored a content the targets had from the holder")
	}
	if !r.take(file("d", 10)) {
		t.Error("a later pass's new content not stored")
	}
	r.mustStore([]string{"big"})
	if r.skip("big") || !r.take(file("big", 50)) {
		t.Error("a content a target could not fetch directly is not stored")
	}
	r.keep([]fstree.Entry{file("a", 60)})
	if r.skip("c") {
		t.Error("a served content gone from the tree is still remembered")
	}
	r.forget()
	r.reset(0)
	if !r.take(file("huge", 1<<40)) {
		t.Error("without a limit a content was not stored")
	}
}
