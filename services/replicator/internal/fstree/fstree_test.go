package fstree

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// memStore is the content store of these tests: the scan's hashes name
// the source files' bytes.
type memStore map[string][]byte

func (m memStore) fetch(_ context.Context, h string) (io.ReadCloser, error) {
	b, ok := m[h]
	if !ok {
		return nil, fmt.Errorf("%s: %w", h, ErrMissingContent)
	}
	return io.NopCloser(bytes.NewReader(b)), nil
}

func scanInto(t *testing.T, root string, ex *Excluder, m memStore) []Entry {
	t.Helper()
	r, err := (&Scanner{Root: root, Exclude: ex}).Scan(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range r.Entries {
		if e.Kind == KindFile {
			b, err := os.ReadFile(filepath.Join(root, e.Path))
			if err != nil {
				t.Fatal(err)
			}
			m[e.Hash] = b
		}
	}
	return r.Entries
}

func put(t *testing.T, root, rel, data string) {
	t.Helper()
	p := filepath.Join(root, rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

func opts(m memStore) ApplyOptions {
	ex, _ := NewExcluder(nil)
	return ApplyOptions{Exclude: ex, Fetch: m.fetch, MaxDeleteShare: 0.1, AllowDeletes: 2, Owner: os.Geteuid() == 0, Now: time.Now()}
}

func TestExcluder(t *testing.T) {
	x, err := NewExcluder([]string{"tmp/", "/manager.conf", "default/*/Work", "*.swp"})
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		path  string
		dir   bool
		wants bool
	}{
		{"default/1000/tmp", true, true},
		{"default/1000/tmp", false, false}, // a file named tmp is not the tmp/ dir
		{"default/1000/tmp/x.wav", false, true},
		{"manager.conf", false, true},
		{"sub/manager.conf", false, false}, // anchored at the root
		{"default/1000/Work", true, true},
		{"default/1000/INBOX/.lock-77", false, true},
		{"default/1000/INBOX/.lock", false, true},
		{"default/1000/INBOX/msg0000.txt", false, false},
		{"a/b.swp", false, true},
		{"a/" + TempPrefix + "x-1", false, true},
	}
	for _, c := range cases {
		if got := x.ExcludedAnywhere(c.path, c.dir); got != c.wants {
			t.Errorf("%s (dir %v): excluded %v, want %v", c.path, c.dir, got, c.wants)
		}
	}
	if _, err := NewExcluder([]string{"[x"}); err == nil {
		t.Error("bad pattern accepted")
	}
}

func TestApplyRefusesUnsafeManifests(t *testing.T) {
	dst := t.TempDir()
	ex, _ := NewExcluder(nil)
	sc := &Scanner{Root: dst, Exclude: ex}
	for _, want := range [][]Entry{
		{{Path: "../escape", Kind: KindFile, Hash: "x"}},
		{{Path: "/etc/passwd", Kind: KindFile, Hash: "x"}},
		{{Path: "a", Kind: KindSymlink, Link: "/etc"}, {Path: "a/passwd", Kind: KindFile, Hash: "x"}},
	} {
		if _, err := Apply(context.Background(), sc, want, opts(memStore{})); !errors.Is(err, ErrUnsafeManifest) {
			t.Errorf("%v: err %v, want ErrUnsafeManifest", want, err)
		}
	}
}

// TestScanSkipsUnchangedContent: an unchanged tree is not read again, and a
// change that keeps size and mtime is still seen (ctime moves).
func TestScanSkipsUnchangedContent(t *testing.T) {
	root := t.TempDir()
	put(t, root, "a", "one")
	ex, _ := NewExcluder(nil)
	sc := &Scanner{Root: root, Exclude: ex}
	r, err := sc.Scan(context.Background())
	if err != nil || r.Hashed != 1 {
		t.Fatalf("first scan hashed %d, %v", r.Hashed, err)
	}
	if r, _ = sc.Scan(context.Background()); r.Hashed != 0 {
		t.Fatalf("unchanged tree hashed %d files", r.Hashed)
	}
	fi, _ := os.Stat(filepath.Join(root, "a"))
	put(t, root, "a", "two")
	_ = os.Chtimes(filepath.Join(root, "a"), fi.ModTime(), fi.ModTime())
	r2, _ := sc.Scan(context.Background())
	if r2.Hashed != 1 || r2.Entries[0].Hash == r.Entries[0].Hash {
		t.Fatalf("same-size same-mtime change missed: %+v", r2)
	}
	if _, err := (&Scanner{Root: filepath.Join(root, "nope"), Exclude: ex}).Scan(context.Background()); !errors.Is(err, ErrRootMissing) {
		t.Fatalf("missing root: %v", err)
	}
}

// TestApplyKeepsLocalChanges: a file replication did not put there is
// preserved before it is replaced or removed; one it did put there is not.
func TestApplyKeepsLocalChanges(t *testing.T) {
	src, dst, conf := t.TempDir(), t.TempDir(), t.TempDir()
	m := memStore{}
	put(t, src, "a.txt", "a1")
	put(t, src, "b.txt", "b1")
	put(t, src, "c.txt", "c1")
	want := scanInto(t, src, nil, m)
	ex, _ := NewExcluder(nil)
	sc := &Scanner{Root: dst, Exclude: ex}
	o := opts(m)
	o.ConflictDir = conf
	if _, err := Apply(context.Background(), sc, want, o); err != nil {
		t.Fatal(err)
	}
	o.Known = KnownOf(want)
	put(t, dst, "a.txt", "changed here")  // modified locally
	put(t, dst, "local.txt", "only here") // never replicated
	put(t, src, "c.txt", "c2")            // changed at the source: not a conflict
	if err := os.Remove(filepath.Join(src, "local.txt")); err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	want = scanInto(t, src, nil, m)
	o.Now = time.Now()
	res, err := Apply(context.Background(), sc, want, o)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, c := range res.Conflicts {
		b, err := os.ReadFile(c.PreservedAs)
		if err != nil {
			t.Fatal(err)
		}
		got[c.Path+" "+c.Reason] = string(b)
	}
	if len(got) != 2 || got["a.txt modified_locally"] != "changed here" || got["local.txt local_only"] != "only here" {
		t.Fatalf("conflicts: %v", got)
	}
	if b, _ := os.ReadFile(filepath.Join(dst, "c.txt")); string(b) != "c2" {
		t.Fatalf("c.txt = %q", b)
	}
}

func TestSafetyValve(t *testing.T) {
	src, dst := t.TempDir(), t.TempDir()
	m := memStore{}
	for i := range 40 {
		put(t, src, fmt.Sprintf("f%02d", i), "x")
	}
	ex, _ := NewExcluder(nil)
	sc := &Scanner{Root: dst, Exclude: ex}
	o := opts(m)
	if _, err := Apply(context.Background(), sc, scanInto(t, src, nil, m), o); err != nil {
		t.Fatal(err)
	}
	o.Known = KnownOf(scanInto(t, src, nil, m))
	// 4 of 40 (10 %) may go; 5 may not.
	for i := range 5 {
		os.Remove(filepath.Join(src, fmt.Sprintf("f%02d", i)))
	}
	var ve *ValveError
	if _, err := Apply(context.Background(), sc, scanInto(t, src, nil, m), o); !errors.As(err, &ve) || ve.Deletes != 5 || ve.TargetFiles != 40 {
		t.Fatalf("err %v, want a valve error for 5 of 40", err)
	}
	if _, err := os.Stat(filepath.Join(dst, "f00")); err != nil {
		t.Fatal("the valve applied part of the pass")
	}
	put(t, src, "f00", "x")
	res, err := Apply(context.Background(), sc, scanInto(t, src, nil, m), o)
	if err != nil || res.Deleted != 4 {
		t.Fatalf("4 of 40: %+v %v", res, err)
	}
	// An empty manifest against a full target is the valve's case too.
	if _, err := Apply(context.Background(), sc, nil, o); !errors.Is(err, ErrSafetyValve) {
		t.Fatalf("empty manifest: %v", err)
	}
}

// TestCrashMidTransferLeavesNoPartialFile kills (SIGKILL) a process in the
// middle of writing a file over an older version, and again once files are
// written and verified but not yet made durable and renamed (the group
// commit's window): the final names still hold the old content or nothing,
// the new content is only in temp files the scans ignore, and the next
// start removes them.
func TestCrashMidTransferLeavesNoPartialFile(t *testing.T) {
	if os.Getenv("FSTREE_CRASH_HELPER") != "" {
		t.Skip("helper process")
	}
	for _, at := range []string{"partial", "commit"} {
		t.Run(at, func(t *testing.T) {
			dst := t.TempDir()
			put(t, dst, "msg0001.wav", "old version")
			cmd := exec.Command(os.Args[0], "-test.run=^TestCrashHelper$", "-test.v")
			// The helper is killed, so it cannot clean a temporary directory
			// of its own: its conflict directory is made (and removed) here.
			cmd.Env = append(os.Environ(), "FSTREE_CRASH_HELPER="+dst, "FSTREE_CRASH_AT="+at, "FSTREE_CRASH_CONFLICTS="+t.TempDir())
			out, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			cmd.Stderr = os.Stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			sc := bufio.NewScanner(out)
			var tmp string
			for sc.Scan() {
				if p, ok := strings.CutPrefix(sc.Text(), "PARTIAL "); ok {
					tmp = p
					break
				}
			}
			if tmp == "" {
				_ = cmd.Process.Kill()
				_ = cmd.Wait()
				t.Fatal("helper never reached the point of death")
			}
			_ = cmd.Process.Signal(syscall.SIGKILL)
			_ = cmd.Wait()

			if fi, err := os.Stat(tmp); err != nil || fi.Size() == 0 {
				t.Fatalf("the helper did not die mid-write (temp %v, %v)", fi, err)
			}
			if b, _ := os.ReadFile(filepath.Join(dst, "msg0001.wav")); string(b) != "old version" {
				t.Fatalf("final name holds %d bytes of something else after a crash", len(b))
			}
			ex, _ := NewExcluder(nil)
			r, err := (&Scanner{Root: dst, Exclude: ex}).Scan(context.Background())
			if err != nil || len(r.Entries) != 1 {
				t.Fatalf("a scan sees new or partial files: %+v %v", r.Entries, err)
			}
			if err := (&Scanner{Root: dst}).RemoveTemps(); err != nil {
				t.Fatal(err)
			}
			left, _ := filepath.Glob(filepath.Join(dst, TempPrefix+"*"))
			if len(left) > 0 {
				t.Fatalf("leftover temps not removed: %v", left)
			}
		})
	}
}

// TestCrashHelper is the process the crash test kills.
func TestCrashHelper(t *testing.T) {
	dst := os.Getenv("FSTREE_CRASH_HELPER")
	if dst == "" {
		t.Skip("run by TestCrashMidTransferLeavesNoPartialFile")
	}
	m := memStore{}
	var want []Entry
	add := func(name string, n int) {
		data := make([]byte, n)
		_, _ = rand.Read(data)
		sum := sha256.Sum256(data)
		h := hex.EncodeToString(sum[:])
		m[h] = data
		want = append(want, Entry{Path: name, Kind: KindFile, Mode: 0o644, Size: int64(n), Hash: h, MTime: time.Now().UnixNano()})
	}
	add("msg0001.wav", 4<<20)
	if os.Getenv("FSTREE_CRASH_AT") == "commit" {
		// More files, all new: none may appear before its commit.
		for i := range 2 * groupSync {
			add(fmt.Sprintf("new%02d.wav", i), 64<<10)
		}
		beforeCommit = func(group []*stagedFile) {
			fmt.Printf("PARTIAL %s\n", filepath.Join(group[0].dir.f.Name(), group[0].tmp))
			select {} // wait for the kill
		}
	} else {
		afterPartialWrite = func(tmp string) {
			fmt.Printf("PARTIAL %s\n", tmp)
			select {} // wait for the kill
		}
	}
	Sort(want)
	ex, _ := NewExcluder(nil)
	o := opts(m)
	o.Known = map[string]string{"msg0001.wav": "f:whatever"}
	o.ConflictDir = os.Getenv("FSTREE_CRASH_CONFLICTS")
	_, _ = Apply(context.Background(), &Scanner{Root: dst, Exclude: ex}, want, o)
	t.Fatal("apply finished; it should have been killed")
}

// TestApplyDurabilityModes: whole trees and single files arrive intact
// both when groups are flushed with syncfs and when every file is fsynced
// (older kernels, or FSTREE_NO_SYNCFS).
func TestApplyDurabilityModes(t *testing.T) {
	for _, noSyncfs := range []string{"", "1"} {
		t.Run("no_syncfs="+noSyncfs, func(t *testing.T) {
			t.Setenv("FSTREE_NO_SYNCFS", noSyncfs)
			src, dst := t.TempDir(), t.TempDir()
			m := memStore{}
			for i := range 300 {
				put(t, src, fmt.Sprintf("d%d/f%03d", i%7, i), strings.Repeat("x", i*97))
			}
			ex, _ := NewExcluder(nil)
			sc := &Scanner{Root: dst, Exclude: ex}
			o := opts(m)
			want := scanInto(t, src, nil, m)
			res, err := Apply(context.Background(), sc, want, o)
			if err != nil || res.Files != 300 {
				t.Fatalf("%+v %v", res, err)
			}
			put(t, src, "d1/one", "a single change")
			o.Known = KnownOf(want)
			want = scanInto(t, src, nil, m)
			if res, err = Apply(context.Background(), sc, want, o); err != nil || res.Files != 1 {
				t.Fatalf("%+v %v", res, err)
			}
			got, err := (&Scanner{Root: dst, Exclude: ex}).Scan(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if Digest(got.Entries) != Digest(want) {
				t.Fatal("target differs from the source")
			}
			if left, _ := filepath.Glob(filepath.Join(dst, "*", TempPrefix+"*")); len(left) > 0 {
				t.Fatalf("temps left: %v", left)
			}
		})
	}
}

// TestPartialApply: a progress manifest adds and updates but never
// deletes, and one that would need a deletion is refused whole.
func TestPartialApply(t *testing.T) {
	src, dst := t.TempDir(), t.TempDir()
	m := memStore{}
	put(t, src, "a/msg0000.wav", "audio")
	put(t, dst, "a/old.wav", "only on the target")
	put(t, dst, "b", "a file where the source has a directory")
	ex, _ := NewExcluder(nil)
	sc := &Scanner{Root: dst, Exclude: ex}
	o := opts(m)
	o.Partial = true
	o.ConflictDir = t.TempDir()
	res, err := Apply(context.Background(), sc, scanInto(t, src, nil, m), o)
	if err != nil || res.Files != 1 || res.Deleted != 0 {
		t.Fatalf("%+v %v", res, err)
	}
	for _, p := range []string{"a/old.wav", "b", "a/msg0000.wav"} {
		if _, err := os.Stat(filepath.Join(dst, p)); err != nil {
			t.Fatalf("%s: %v", p, err)
		}
	}
	put(t, src, "b/x", "x")
	if _, err := Apply(context.Background(), sc, scanInto(t, src, nil, m), o); !errors.Is(err, ErrNeedsFull) {
		t.Fatalf("kind change in a partial apply: %v", err)
	}
	if b, _ := os.ReadFile(filepath.Join(dst, "b")); string(b) != "a file where the source has a directory" {
		t.Fatalf("b = %q", b)
	}
}

// TestStoredPart: a progress manifest lists what is stored, and a
// message's .txt only with all of its media.
func TestStoredPart(t *testing.T) {
	es := []Entry{
		{Path: "INBOX", Kind: KindDir},
		{Path: "INBOX/msg0000.WAV", Kind: KindFile, Hash: "w0"},
		{Path: "INBOX/msg0000.txt", Kind: KindFile, Hash: "t0"},
		{Path: "INBOX/msg0000.wav", Kind: KindFile, Hash: "x0"}, // not stored yet
		{Path: "INBOX/msg0001.txt", Kind: KindFile, Hash: "t1"},
		{Path: "INBOX/msg0001.wav", Kind: KindFile, Hash: "w1"},
		{Path: "INBOX/msg0002.txt", Kind: KindFile, Hash: "t2"}, // no media at all
		{Path: "link", Kind: KindSymlink, Link: "INBOX"},
	}
	stored := func(h string) bool { return h != "x0" }
	var got []string
	for _, e := range StoredPart(es, stored) {
		got = append(got, e.Path)
	}
	want := "INBOX INBOX/msg0000.WAV INBOX/msg0001.txt INBOX/msg0001.wav INBOX/msg0002.txt link"
	if strings.Join(got, " ") != want {
		t.Fatalf("got  %s\nwant %s", strings.Join(got, " "), want)
	}
}

func TestKernelAtLeast(t *testing.T) {
	for rel, want := range map[string]bool{"6.1.0-18-amd64": true, "5.8.0": true, "5.7.19": false, "5.10-rc1": true, "4.19.0": false, "x": false} {
		if got := kernelAtLeast(rel, 5, 8); got != want {
			t.Errorf("%s: %v, want %v", rel, got, want)
		}
	}
}
