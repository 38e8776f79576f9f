package fstree

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestDeltaOfNotifiedPaths: ScanPaths looks at the named paths only (a
// directory that appeared whole, a file changed, one removed, a directory
// removed with its contents), Diff turns them into a delta against the
// tree as last published, and ApplyDelta makes another tree take it
// without a scan of its own: the result equals the source.
func TestDeltaOfNotifiedPaths(t *testing.T) {
	src, dst := t.TempDir(), t.TempDir()
	m := memStore{}
	put(t, src, "a/1/msg0000.txt", "one")
	put(t, src, "a/1/msg0001.txt", "two")
	put(t, src, "a/2/msg0000.txt", "three")
	put(t, src, "b/msg0000.txt", "four")
	base := scanInto(t, src, nil, m)
	if _, err := Apply(context.Background(), &Scanner{Root: dst}, base, opts(m)); err != nil {
		t.Fatal(err)
	}
	cur := map[string]Entry{}
	for _, e := range base {
		cur[e.Path] = e
	}

	put(t, src, "a/1/msg0001.txt", "two, edited")
	put(t, src, "c/new/msg0000.txt", "five")
	if err := os.Remove(filepath.Join(src, "a/1/msg0000.txt")); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(src, "a/2")); err != nil {
		t.Fatal(err)
	}
	sc := &Scanner{Root: src}
	rels := []string{"a/1/msg0001.txt", "c", "c/new/msg0000.txt", "a/1/msg0000.txt", "a/2"}
	res, gone, err := sc.ScanPaths(context.Background(), rels, true)
	if err != nil {
		t.Fatal(err)
	}
	changed, deleted := Diff(cur, rels, res.Entries, gone)
	var paths []string
	for _, e := range changed {
		paths = append(paths, e.Path)
		if e.Kind == KindFile {
			b, _ := os.ReadFile(filepath.Join(src, e.Path))
			m[e.Hash] = b
		}
	}
	if want := []string{"a/1/msg0001.txt", "c", "c/new", "c/new/msg0000.txt"}; !slices.Equal(paths, want) {
		t.Fatalf("changed %v, want %v", paths, want)
	}
	if want := []string{"a/1/msg0000.txt", "a/2", "a/2/msg0000.txt"}; !slices.Equal(deleted, want) {
		t.Fatalf("deleted %v, want %v", deleted, want)
	}
	d := &Delta{Entries: changed, Deleted: deleted, Digest: DeltaDigest(changed, deleted)}
	b, err := EncodeDelta(d)
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeDelta(b)
	if err != nil {
		t.Fatal(err)
	}
	o := opts(m)
	o.Known = KnownOf(base)
	o.TreeFiles = 4
	o.AllowDeletes = 3
	if _, err := ApplyDelta(context.Background(), &Scanner{Root: dst}, got.Entries, got.Deleted, o); err != nil {
		t.Fatal(err)
	}
	if err := sameTree(src, dst); err != nil {
		t.Fatal(err)
	}
}

// TestDecodeDeltaRefuses: a delta whose digest does not match, that
// deletes an unsafe path, or deletes a path it also writes, is refused.
func TestDecodeDeltaRefuses(t *testing.T) {
	e := Entry{Path: "x", Kind: KindDir}
	for name, d := range map[string]*Delta{
		"digest":  {Entries: []Entry{e}, Digest: "00"},
		"climbs":  {Deleted: []string{"../etc"}, Digest: DeltaDigest(nil, []string{"../etc"})},
		"both":    {Entries: []Entry{e}, Deleted: []string{"x"}, Digest: DeltaDigest([]Entry{e}, []string{"x"})},
		"absolut": {Deleted: []string{"/etc/passwd"}, Digest: DeltaDigest(nil, []string{"/etc/passwd"})},
	} {
		b, err := EncodeDelta(d)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := DecodeDelta(b); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// TestApplyDeltaKeepsLocalChanges: a file changed locally that a delta
// replaces or deletes is kept as a conflict first; deletions count against
// the valve with those of recent deltas, on the whole tree's size.
func TestApplyDeltaKeepsLocalChanges(t *testing.T) {
	src, dst := t.TempDir(), t.TempDir()
	m := memStore{}
	for _, p := range []string{"m/1.txt", "m/2.txt", "m/3.txt"} {
		put(t, src, p, "v1 "+p)
	}
	base := scanInto(t, src, nil, m)
	o := opts(m)
	o.ConflictDir = t.TempDir()
	if _, err := Apply(context.Background(), &Scanner{Root: dst}, base, o); err != nil {
		t.Fatal(err)
	}
	o.Known = KnownOf(base)
	put(t, dst, "m/1.txt", "changed on the standby")
	put(t, src, "m/1.txt", "v2")
	es := scanInto(t, src, nil, m)
	var one Entry
	for _, e := range es {
		if e.Path == "m/1.txt" {
			one = e
		}
	}
	res, err := ApplyDelta(context.Background(), &Scanner{Root: dst}, []Entry{one}, []string{"m/2.txt"}, o)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Conflicts) != 1 || res.Conflicts[0].Path != "m/1.txt" {
		t.Fatalf("conflicts %+v", res.Conflicts)
	}
	if b, _ := os.ReadFile(res.Conflicts[0].PreservedAs); string(b) != "changed on the standby" {
		t.Fatalf("kept %q", b)
	}
	// One more deletion with three made lately, on a tree of 3 files
	// (AllowDeletes 2): refused.
	o.TreeFiles, o.DeletedBefore = 2, 3
	_, err = ApplyDelta(context.Background(), &Scanner{Root: dst}, nil, []string{"m/3.txt"}, o)
	var valve *ValveError
	if !errors.As(err, &valve) {
		t.Fatalf("valve not met: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dst, "m/3.txt")); err != nil {
		t.Fatalf("refused delta deleted: %v", err)
	}
}

// sameTree compares two trees' entries (directory mtimes aside).
func sameTree(a, b string) error {
	ra, err := (&Scanner{Root: a}).Scan(context.Background())
	if err != nil {
		return err
	}
	rb, err := (&Scanner{Root: b}).Scan(context.Background())
	if err != nil {
		return err
	}
	if len(ra.Entries) != len(rb.Entries) {
		return errors.New("entry counts differ")
	}
	for i := range ra.Entries {
		x, y := ra.Entries[i], rb.Entries[i]
		if x.Path != y.Path || Drifted(x, y) {
			return errors.New("entry differs: " + x.Path + " / " + y.Path)
		}
	}
	return nil
}
