package fstree

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/fanpbx/fan/lab/prereq"
)

// The attacks in this file are what a holder that turned hostile (or a
// forged manifest) and a local process racing the apply would try against
// a target that runs as root. Each checks a sentinel directory outside the
// tree: nothing may ever appear there or change in it.

// fileEntry stores data in m and returns a file entry for it.
func fileEntry(m memStore, rel, data string, mode uint32) Entry {
	sum := sha256.Sum256([]byte(data))
	h := hex.EncodeToString(sum[:])
	m[h] = []byte(data)
	return Entry{Path: rel, Kind: KindFile, Mode: mode, Size: int64(len(data)), Hash: h, MTime: time.Now().UnixNano()}
}

// sentinel is a directory outside the tree holding one file; untouched
// fails the test if anything in it changed.
type sentinel struct {
	dir  string
	file string
	fi   os.FileInfo
}

func newSentinel(t *testing.T) *sentinel {
	t.Helper()
	s := &sentinel{dir: t.TempDir()}
	s.file = filepath.Join(s.dir, "victim")
	if err := os.WriteFile(s.file, []byte("precious"), 0o600); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Lstat(s.file)
	if err != nil {
		t.Fatal(err)
	}
	s.fi = fi
	return s
}

func (s *sentinel) untouched(t *testing.T) {
	t.Helper()
	des, err := os.ReadDir(s.dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(des) != 1 || des[0].Name() != "victim" {
		var names []string
		for _, de := range des {
			names = append(names, de.Name())
		}
		t.Fatalf("something was written outside the tree: %v", names)
	}
	fi, err := os.Lstat(s.file)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(s.file)
	st, st0 := fi.Sys().(*syscall.Stat_t), s.fi.Sys().(*syscall.Stat_t)
	if string(b) != "precious" || fi.Mode() != s.fi.Mode() || st.Uid != st0.Uid || st.Gid != st0.Gid || !fi.ModTime().Equal(s.fi.ModTime()) {
		t.Fatalf("the file outside the tree changed: %q %v uid %d gid %d mtime %v", b, fi.Mode(), st.Uid, st.Gid, fi.ModTime())
	}
}

// bothResolvers runs f with openat2 and with the O_NOFOLLOW walk.
func bothResolvers(t *testing.T, f func(t *testing.T)) {
	for _, walk := range []bool{false, true} {
		name := "openat2"
		if walk {
			name = "walk"
		}
		t.Run(name, func(t *testing.T) {
			walkOnly = walk
			defer func() { walkOnly = false }()
			f(t)
		})
	}
}

// TestAttackSymlinkThenWrite is the reported escape: a full manifest holds
// x -> /outside, a progress manifest then holds x/pwned with mode 04755.
func TestAttackSymlinkThenWrite(t *testing.T) {
	bothResolvers(t, func(t *testing.T) {
		out := newSentinel(t)
		dst := t.TempDir()
		m := memStore{}
		sc := &Scanner{Root: dst}
		full := []Entry{{Path: "x", Kind: KindSymlink, Link: out.dir}}
		pwned := []Entry{fileEntry(m, "x/pwned", "#!/bin/sh\nid\n", 0o4755)}

		// By default the link itself is refused.
		if _, err := Apply(context.Background(), sc, full, opts(m)); !errors.Is(err, ErrUnsafeManifest) {
			t.Fatalf("outside symlink: err %v, want ErrUnsafeManifest", err)
		}
		if _, err := os.Lstat(filepath.Join(dst, "x")); !os.IsNotExist(err) {
			t.Fatalf("the refused symlink was created (%v)", err)
		}

		// Allowed by the tree's policy, the link is made, and the write
		// through it is still refused, as a progress or a full manifest.
		o := opts(m)
		o.AllowOutsideSymlinks = true
		if _, err := Apply(context.Background(), sc, full, o); err != nil {
			t.Fatal(err)
		}
		o.Partial = true
		if _, err := Apply(context.Background(), sc, pwned, o); !errors.Is(err, ErrOutsideTree) {
			t.Fatalf("progress write through the symlink: err %v, want ErrOutsideTree", err)
		}
		out.untouched(t)
		o.Partial = false
		if _, err := Apply(context.Background(), sc, append(full, pwned...), o); !errors.Is(err, ErrUnsafeManifest) {
			t.Fatalf("one manifest with the link and a path below it: err %v", err)
		}
		out.untouched(t)

		// A link a local process made (not replication) is no way out either.
		if err := os.Remove(filepath.Join(dst, "x")); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(out.dir, filepath.Join(dst, "x")); err != nil {
			t.Fatal(err)
		}
		o.Partial = true
		if _, err := Apply(context.Background(), sc, pwned, o); !errors.Is(err, ErrOutsideTree) {
			t.Fatalf("write through a local symlink: err %v, want ErrOutsideTree", err)
		}
		out.untouched(t)
	})
}

// TestAttackSymlinkThenDirectory: after x -> /outside, a manifest asks for
// the directory x/d (with a file in it), with and without listing x.
func TestAttackSymlinkThenDirectory(t *testing.T) {
	bothResolvers(t, func(t *testing.T) {
		out := newSentinel(t)
		dst := t.TempDir()
		m := memStore{}
		sc := &Scanner{Root: dst}
		o := opts(m)
		o.AllowOutsideSymlinks = true
		o.ConflictDir = t.TempDir()
		if _, err := Apply(context.Background(), sc, []Entry{{Path: "x", Kind: KindSymlink, Link: out.dir}}, o); err != nil {
			t.Fatal(err)
		}
		dirs := []Entry{{Path: "x/d", Kind: KindDir, Mode: 0o777}, fileEntry(m, "x/d/f", "data", 0o644)}
		o.Partial = true
		if _, err := Apply(context.Background(), sc, dirs, o); !errors.Is(err, ErrOutsideTree) {
			t.Fatalf("progress mkdir through the symlink: err %v, want ErrOutsideTree", err)
		}
		out.untouched(t)
		withX := append([]Entry{{Path: "x", Kind: KindDir, Mode: 0o755}}, dirs...)
		if _, err := Apply(context.Background(), sc, withX, o); !errors.Is(err, ErrNeedsFull) {
			t.Fatalf("progress turning the link into a directory: err %v, want ErrNeedsFull", err)
		}
		// A full manifest replaces the link itself (never its target) by a
		// directory inside the tree.
		o.Partial = false
		if _, err := Apply(context.Background(), sc, withX, o); err != nil {
			t.Fatal(err)
		}
		out.untouched(t)
		if fi, err := os.Lstat(filepath.Join(dst, "x")); err != nil || !fi.IsDir() {
			t.Fatalf("x is not a directory in the tree: %v %v", fi, err)
		}
		if b, err := os.ReadFile(filepath.Join(dst, "x/d/f")); err != nil || string(b) != "data" {
			t.Fatalf("x/d/f: %q %v", b, err)
		}
	})
}

// TestAttackDotDot: names and link targets that climb out, directly or by
// way of another symlink.
func TestAttackDotDot(t *testing.T) {
	out := newSentinel(t)
	dst := t.TempDir()
	m := memStore{}
	sc := &Scanner{Root: dst}
	rel, err := filepath.Rel(dst, out.dir)
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string][]Entry{
		"parent":          {fileEntry(m, "../escape", "x", 0o644)},
		"deep parent":     {{Path: "a", Kind: KindDir}, fileEntry(m, "a/../../escape", "x", 0o644)},
		"absolute":        {fileEntry(m, out.file, "x", 0o644)},
		"dot":             {fileEntry(m, "a/./b", "x", 0o644)},
		"double slash":    {fileEntry(m, "a//b", "x", 0o644)},
		"trailing dotdot": {{Path: "a/..", Kind: KindDir}},
		"NUL":             {fileEntry(m, "a\x00/../../b", "x", 0o644)},
		"twice":           {fileEntry(m, "a", "x", 0o644), {Path: "a", Kind: KindDir}},
		"bad hash":        {{Path: "a", Kind: KindFile, Hash: "../../etc/passwd"}},
		"unknown kind":    {{Path: "a", Kind: "c"}},
		"empty link":      {{Path: "a", Kind: KindSymlink}},
		"link to parent":  {{Path: "l", Kind: KindSymlink, Link: ".."}},
		"link relative":   {{Path: "l", Kind: KindSymlink, Link: rel}},
		"link deep":       {{Path: "a", Kind: KindDir}, {Path: "a/l", Kind: KindSymlink, Link: "../../x"}},
		"link absolute":   {{Path: "l", Kind: KindSymlink, Link: "/etc"}},
		// d/y -> .. is the root itself (allowed); x -> d/y/.. reads as d
		// on paper but the kernel climbs from where y leads: the root's
		// parent.
		"link through link": {{Path: "d", Kind: KindDir}, {Path: "d/y", Kind: KindSymlink, Link: ".."}, {Path: "x", Kind: KindSymlink, Link: "d/y/.."}},
		"mode bits":         {{Path: "a", Kind: KindDir, Mode: 0o170755}},
		// This tree excludes outgoing/ (as a spool tree leaves out call files).
		"link into excluded": {{Path: "v", Kind: KindDir}, {Path: "v/INBOX", Kind: KindSymlink, Link: "../outgoing"}},
	} {
		o := opts(m)
		o.Exclude, _ = NewExcluder([]string{"/outgoing"})
		if _, err := Apply(context.Background(), sc, want, o); !errors.Is(err, ErrUnsafeManifest) {
			t.Errorf("%s: err %v, want ErrUnsafeManifest", name, err)
		}
	}
	out.untouched(t)
	if des, _ := os.ReadDir(dst); len(des) != 0 {
		t.Fatalf("a refused manifest left %d entries in the tree", len(des))
	}
	// Links that stay inside are carried.
	ok := []Entry{
		{Path: "a", Kind: KindDir, Mode: 0o755},
		{Path: "a/sib", Kind: KindSymlink, Link: "../b"},
		{Path: "a/here", Kind: KindSymlink, Link: "./c/d"},
		{Path: "top", Kind: KindSymlink, Link: "a/sib"},
	}
	if _, err := Apply(context.Background(), sc, ok, opts(m)); err != nil {
		t.Fatalf("inside links refused: %v", err)
	}
}

func TestLinkStaysInside(t *testing.T) {
	for _, c := range []struct {
		rel, link string
		ok        bool
	}{
		{"l", "x", true},
		{"l", "./x", true},
		{"l", "x/y/z", true},
		{"a/l", "../x", true},
		{"a/b/l", "../../x", true},
		{"a/b/l", "../../../x", false},
		{"l", "..", false},
		{"l", "../x", false},
		{"l", "/x", false},
		{"l", "", false},
		{"a/l", "x/../..", false},
		{"a/l", "x/..", false}, // x may be a symlink
		{"a/l", "../x/../y", false},
		{"l", "x\x00", false},
	} {
		if got := LinkStaysInside(c.rel, c.link); got != c.ok {
			t.Errorf("%s -> %q: %v, want %v", c.rel, c.link, got, c.ok)
		}
	}
}

// TestAttackSwapDuringApply: a local process swaps a directory for a
// symlink to the outside after the plan was made (before anything is
// written), and again after a file is staged but before its rename.
func TestAttackSwapDuringApply(t *testing.T) {
	bothResolvers(t, func(t *testing.T) {
		m := memStore{}
		want := func() []Entry {
			return []Entry{
				{Path: "a", Kind: KindDir, Mode: 0o755, MTime: time.Now().UnixNano()},
				fileEntry(m, "a/keep", "kept", 0o600),
				fileEntry(m, "a/new.wav", "new content", 0o4755),
			}
		}
		swap := func(t *testing.T, dst, outside string) {
			a := filepath.Join(dst, "a")
			if err := os.Rename(a, a+".moved"); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(outside, a); err != nil {
				t.Fatal(err)
			}
		}

		// keepTree holds a/keep with mode 0644 (the manifest says 0600).
		keepTree := func(t *testing.T) string {
			dst := t.TempDir()
			put(t, dst, "a/keep", "kept")
			if err := os.Chmod(filepath.Join(dst, "a/keep"), 0o644); err != nil {
				t.Fatal(err)
			}
			return dst
		}

		t.Run("after plan", func(t *testing.T) {
			out := newSentinel(t)
			// a/keep must get mode 0600: a metadata fix, through a.
			dst := keepTree(t)
			beforeExecute = func() { swap(t, dst, out.dir) }
			defer func() { beforeExecute = nil }()
			_, err := Apply(context.Background(), &Scanner{Root: dst}, want(), opts(m))
			if !errors.Is(err, ErrOutsideTree) {
				t.Fatalf("err %v, want ErrOutsideTree", err)
			}
			out.untouched(t)
		})

		t.Run("before rename", func(t *testing.T) {
			out := newSentinel(t)
			dst := t.TempDir()
			put(t, dst, "a/keep", "kept")
			beforeCommit = func([]*stagedFile) { swap(t, dst, out.dir) }
			defer func() { beforeCommit = nil }()
			// The staged file is renamed in the directory it was created
			// in, wherever that now is: inside the tree.
			_, _ = Apply(context.Background(), &Scanner{Root: dst}, want(), opts(m))
			out.untouched(t)
			if b, err := os.ReadFile(filepath.Join(dst, "a.moved/new.wav")); err != nil || string(b) != "new content" {
				t.Fatalf("the file did not stay in its own directory: %q %v", b, err)
			}
		})

		t.Run("file swapped for a link", func(t *testing.T) {
			out := newSentinel(t)
			dst := keepTree(t)
			// The plan fixes a/keep's mode; by then it points at the victim.
			beforeExecute = func() {
				k := filepath.Join(dst, "a/keep")
				if err := os.Remove(k); err != nil {
					t.Fatal(err)
				}
				if err := os.Symlink(out.file, k); err != nil {
					t.Fatal(err)
				}
			}
			defer func() { beforeExecute = nil }()
			_, err := Apply(context.Background(), &Scanner{Root: dst}, want()[:2], opts(m))
			if !errors.Is(err, ErrOutsideTree) {
				t.Fatalf("err %v, want ErrOutsideTree", err)
			}
			out.untouched(t)
		})
	})
}

// TestAttackSetuidAndOwners: mode bits and owners follow the tree's
// policy, not the manifest (as root, where owners can be given).
func TestAttackSetuidAndOwners(t *testing.T) {
	if os.Geteuid() != 0 {
		prereq.SkipOrFail(t, "owners can only be given as root")
	}
	const rootUID, rootGID, localUID, localGID = 4242, 4343, 5151, 5252
	m := memStore{}
	now := time.Now().UnixNano()
	manifest := func() []Entry {
		es := []Entry{
			{Path: "d", Kind: KindDir, Mode: 0o3777},
			fileEntry(m, "d/new", "new", 0o4755),
			fileEntry(m, "old", "replaced", 0o6755),
			fileEntry(m, "same", "same", 0o4700),
			{Path: "l", Kind: KindSymlink, Link: "same"},
		}
		for i := range es {
			es[i].UID, es[i].GID = 0, 0
			if es[i].Kind == KindFile {
				es[i].MTime = now
			}
		}
		return es
	}
	setup := func(t *testing.T) string {
		dst := t.TempDir()
		put(t, dst, "old", "before")
		put(t, dst, "same", "same")
		for _, p := range []string{"old", "same"} {
			if err := os.Chown(filepath.Join(dst, p), localUID, localGID); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.Chown(dst, rootUID, rootGID); err != nil {
			t.Fatal(err)
		}
		return dst
	}
	check := func(t *testing.T, dst, rel string, mode os.FileMode, uid, gid uint32) {
		t.Helper()
		fi, err := os.Lstat(filepath.Join(dst, rel))
		if err != nil {
			t.Fatal(err)
		}
		st := fi.Sys().(*syscall.Stat_t)
		if fi.Mode()&^os.ModeType != mode || st.Uid != uid || st.Gid != gid {
			t.Errorf("%s: mode %v uid %d gid %d, want %v %d %d", rel, fi.Mode()&^os.ModeType, st.Uid, st.Gid, mode, uid, gid)
		}
	}

	t.Run("default", func(t *testing.T) {
		dst := setup(t)
		o := opts(m)
		o.Known = KnownOf(manifest()) // "old" is not a local change to keep
		o.Known["old"] = "f:" + hex.EncodeToString(func() []byte { s := sha256.Sum256([]byte("before")); return s[:] }())
		if _, err := Apply(context.Background(), &Scanner{Root: dst}, manifest(), o); err != nil {
			t.Fatal(err)
		}
		check(t, dst, "d", 0o777, rootUID, rootGID)
		check(t, dst, "d/new", 0o755, rootUID, rootGID)
		check(t, dst, "old", 0o755, localUID, localGID)
		check(t, dst, "same", 0o700, localUID, localGID)
		check(t, dst, "l", os.ModePerm, rootUID, rootGID)
		// A second pass finds nothing to change: the policy is stable.
		r, err := Apply(context.Background(), &Scanner{Root: dst}, manifest(), o)
		if err != nil || r.Files+r.MetaFixed+r.Deleted != 0 {
			t.Fatalf("second pass changed %+v (%v)", r, err)
		}
	})

	t.Run("preserve", func(t *testing.T) {
		dst := setup(t)
		o := opts(m)
		o.ConflictDir = t.TempDir()
		o.PreserveOwner, o.PreserveSpecialBits = true, true
		if _, err := Apply(context.Background(), &Scanner{Root: dst}, manifest(), o); err != nil {
			t.Fatal(err)
		}
		check(t, dst, "d", 0o777|os.ModeSetgid|os.ModeSticky, 0, 0)
		check(t, dst, "d/new", 0o755|os.ModeSetuid, 0, 0)
		check(t, dst, "old", 0o755|os.ModeSetuid|os.ModeSetgid, 0, 0)
		check(t, dst, "same", 0o700|os.ModeSetuid, 0, 0)
	})
}

// TestValidatePlanExecute: each step alone.
func TestValidatePlanExecute(t *testing.T) {
	m := memStore{}
	ex, _ := NewExcluder([]string{"tmp/"})
	o := opts(m)
	o.Exclude = ex
	want := []Entry{
		fileEntry(m, "b", "b", 0o644),
		{Path: "a", Kind: KindDir, Mode: 0o2755, UID: 7, GID: 8},
		{Path: "tmp", Kind: KindDir},
		fileEntry(m, "tmp/x", "x", 0o644),
		fileEntry(m, "a/f", "f", 0o4644),
	}
	wanted, err := Validate(want, o)
	if err != nil {
		t.Fatal(err)
	}
	if len(wanted) != 3 || wanted[0].Path != "a" || wanted[1].Path != "a/f" || wanted[2].Path != "b" {
		t.Fatalf("validate: %+v", wanted)
	}

	local := []Entry{
		{Path: "a", Kind: KindDir, Mode: 0o755, UID: 1, GID: 2},
		{Path: "a/f", Kind: KindFile, Mode: 0o600, UID: 3, GID: 4, Hash: wanted[1].Hash, MTime: wanted[1].MTime},
		{Path: "gone", Kind: KindFile, Hash: "00"},
		{Path: "olddir", Kind: KindDir},
	}
	p, err := Plan(wanted, local, o, Owner{UID: 10, GID: 11})
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Writes) != 1 || p.Writes[0].Path != "b" || p.Writes[0].UID != 10 || p.Writes[0].GID != 11 || p.Writes[0].Mode != 0o644 {
		t.Errorf("writes: %+v", p.Writes)
	}
	if len(p.MetaFix) != 1 || p.MetaFix[0].Path != "a/f" || p.MetaFix[0].Mode != 0o644 || p.MetaFix[0].UID != 3 {
		t.Errorf("meta fixes: %+v", p.MetaFix)
	}
	if len(p.DelFiles) != 1 || p.DelFiles[0].Path != "gone" || len(p.DelDirs) != 1 || p.DelDirs[0].Path != "olddir" {
		t.Errorf("deletions: %+v %+v", p.DelFiles, p.DelDirs)
	}
	if len(p.NewDirs) != 0 || p.Wanted[0].Mode != 0o755 || p.Wanted[0].UID != 1 {
		t.Errorf("directories: new %+v, a %+v", p.NewDirs, p.Wanted[0])
	}
	o.Partial = true
	if p, err := Plan(wanted, local, o, Owner{}); err != nil || len(p.DelFiles)+len(p.DelDirs) != 0 {
		t.Errorf("partial plan deletes: %+v %v", p, err)
	}
	o.Partial = false
	o.AllowDeletes, o.MaxDeleteShare = 0, 0.1
	var ve *ValveError
	if _, err := Plan(wanted, local, o, Owner{}); !errors.As(err, &ve) || ve.Deletes != 1 {
		t.Errorf("valve: %v", err)
	}

	// Execute the first plan on a real tree.
	dst := t.TempDir()
	put(t, dst, "a/f", "f")
	put(t, dst, "gone", "local")
	if err := os.Mkdir(filepath.Join(dst, "olddir"), 0o755); err != nil {
		t.Fatal(err)
	}
	tr, err := openTree(dst)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.close()
	o = opts(m)
	o.ConflictDir = t.TempDir()
	o.Owner = false
	res, err := p.execute(context.Background(), &Scanner{Root: dst}, tr, o)
	if err != nil {
		t.Fatal(err)
	}
	if res.Files != 1 || res.Deleted != 2 || res.MetaFixed != 1 || len(res.Conflicts) != 1 {
		t.Fatalf("execute: %+v", res)
	}
	for rel, mode := range map[string]os.FileMode{"a/f": 0o644, "b": 0o644} {
		if fi, err := os.Stat(filepath.Join(dst, rel)); err != nil || fi.Mode() != mode {
			t.Errorf("%s: %v %v", rel, fi, err)
		}
	}
	if _, err := os.Lstat(filepath.Join(dst, "olddir")); !os.IsNotExist(err) {
		t.Errorf("olddir still there: %v", err)
	}
}

// TestRemoveTempsStaysInside: a temp-named file behind a symlink in the
// tree is not the tree's and is left alone.
func TestRemoveTempsStaysInside(t *testing.T) {
	out := newSentinel(t)
	outTemp := filepath.Join(out.dir, TempPrefix+"theirs")
	dst := t.TempDir()
	put(t, dst, "a/"+TempPrefix+"ours", "x")
	if err := os.Symlink(out.dir, filepath.Join(dst, "l")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(outTemp, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := (&Scanner{Root: dst}).RemoveTemps(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dst, "a", TempPrefix+"ours")); !os.IsNotExist(err) {
		t.Errorf("own temp not removed: %v", err)
	}
	if _, err := os.Stat(outTemp); err != nil {
		t.Errorf("a file outside the tree was removed: %v", err)
	}
}

// TestAttackHardLink: a local user hard-links a file from outside the tree
// into it (possible where fs.protected_hardlinks is off, or for a file of
// their own), and the manifest asks for that path's mode and owner to
// change. The outside file keeps its own; the tree's path gets a copy.
func TestAttackHardLink(t *testing.T) {
	out := newSentinel(t)
	// Same file system as the tree: the sentinel's parent.
	dst := filepath.Join(filepath.Dir(out.dir), "tree-"+filepath.Base(out.dir))
	if err := os.Mkdir(dst, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dst) })
	if err := os.Link(out.file, filepath.Join(dst, "linked")); err != nil {
		t.Skipf("no hard link across the test's directories: %v", err)
	}
	m := memStore{}
	e := fileEntry(m, "linked", "precious", 0o4777)
	fi, _ := os.Lstat(out.file)
	e.MTime = fi.ModTime().UnixNano()
	o := opts(m)
	o.PreserveOwner, o.PreserveSpecialBits = true, true
	e.UID, e.GID = 1234, 1234
	r, err := Apply(context.Background(), &Scanner{Root: dst}, []Entry{e}, o)
	if err != nil {
		t.Fatal(err)
	}
	out.untouched(t)
	if r.Files != 1 || r.MetaFixed != 0 {
		t.Fatalf("the hard-linked path was not rewritten: %+v", r)
	}
	got, err := os.Lstat(filepath.Join(dst, "linked"))
	if err != nil || got.Mode()&os.ModePerm != 0o777 || os.SameFile(got, fi) {
		t.Fatalf("the tree's path: %v %v (same file as outside: %v)", got, err, os.SameFile(got, fi))
	}
}

// TestAttackSourceReadsThroughSwap: on the source, a local process swaps a
// listed file for a symlink to a file it may not read, between the scan's
// stat and its read. The scan must not publish that file's content, and
// an upload's open must not follow the link either.
func TestAttackSourceReadsThroughSwap(t *testing.T) {
	bothResolvers(t, func(t *testing.T) {
		out := newSentinel(t)
		secret := sha256.Sum256([]byte("precious"))
		root := t.TempDir()
		put(t, root, "d/f", "ordinary")
		beforeHash = func() {
			f := filepath.Join(root, "d/f")
			if err := os.Remove(f); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(out.file, f); err != nil {
				t.Fatal(err)
			}
		}
		defer func() { beforeHash = nil }()
		r, err := (&Scanner{Root: root}).Scan(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range r.Entries {
			if e.Hash == hex.EncodeToString(secret[:]) {
				t.Fatalf("the scan read the file outside the tree through %s", e.Path)
			}
		}
		if _, err := (&Scanner{Root: root}).OpenFile("d/f"); !errors.Is(err, ErrOutsideTree) {
			t.Fatalf("open through the link: %v, want ErrOutsideTree", err)
		}
		// A directory swapped for a link is not read through either.
		if err := os.Rename(filepath.Join(root, "d"), filepath.Join(root, "d2")); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(out.dir, filepath.Join(root, "d")); err != nil {
			t.Fatal(err)
		}
		if _, err := (&Scanner{Root: root}).OpenFile("d/victim"); !errors.Is(err, ErrOutsideTree) {
			t.Fatalf("open through a directory link: %v, want ErrOutsideTree", err)
		}
	})
}

// TestAttackRootSwapped: a local user who owns the directory above the
// root (asterisk owns /var/spool/asterisk) swaps the root itself for a
// symlink to the outside between two passes. A root that was a symlink
// from the start (the administrator's) is followed as it was then.
func TestAttackRootSwapped(t *testing.T) {
	bothResolvers(t, func(t *testing.T) {
		out := newSentinel(t)
		parent := t.TempDir()
		real := filepath.Join(parent, "real")
		if err := os.Mkdir(real, 0o755); err != nil {
			t.Fatal(err)
		}
		root := filepath.Join(parent, "voicemail")
		if err := os.Symlink(real, root); err != nil {
			t.Fatal(err)
		}
		m := memStore{}
		sc := &Scanner{Root: root}
		if _, err := Apply(context.Background(), sc, []Entry{fileEntry(m, "first", "1", 0o644)}, opts(m)); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(filepath.Join(real, "first")); err != nil {
			t.Fatalf("the administrator's symlinked root was not followed: %v", err)
		}
		// The swap: the root's real directory moves away, a symlink to the
		// outside takes its place.
		if err := os.Rename(real, real+".old"); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(out.dir, real); err != nil {
			t.Fatal(err)
		}
		o := opts(m)
		o.Partial = true
		if _, err := Apply(context.Background(), sc, []Entry{fileEntry(m, "cron-job", "* * * * * root id\n", 0o644)}, o); !errors.Is(err, ErrOutsideTree) {
			t.Fatalf("apply into a swapped root: %v, want ErrOutsideTree", err)
		}
		if _, err := sc.Scan(context.Background()); err == nil {
			t.Fatal("a scan read a swapped root")
		}
		out.untouched(t)
	})
}
