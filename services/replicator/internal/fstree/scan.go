package fstree

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// ErrRootMissing means a tree's root does not exist or is not a directory:
// an unmounted disk must never read as "everything was deleted".
var ErrRootMissing = errors.New("fstree: tree root missing")

// statKey identifies a file's content without reading it: any write moves
// ctime, so a changed key means the hash must be computed again.
type statKey struct {
	size, mtime, ctime int64
	ino                uint64
}

type cached struct {
	key  statKey
	hash string
}

// Scanner walks one tree. It remembers the hash of every file by its stat
// key, so a pass over an unchanged tree reads no file content.
type Scanner struct {
	Root    string
	Exclude *Excluder
	// Workers hash files in parallel; default 4.
	Workers int

	mu    sync.Mutex
	cache map[string]cached

	pinMu  sync.Mutex
	pinned string // where Root led when it first existed (see root)
}

// ScanResult is a scan's outcome.
type ScanResult struct {
	Entries []Entry // sorted by path
	// Hashed is how many files were read because they were new or changed.
	Hashed int
	// Unsettled files changed while being read; scan again soon.
	Unsettled int
}

// Scan lists the tree. Files that vanish during the scan are left out.
func (s *Scanner) Scan(ctx context.Context) (ScanResult, error) {
	return s.ScanHooked(ctx, ScanHooks{})
}

// KeepMax is the largest file whose content ScanHooks.Hashed is handed
// with its entry (the object store's chunk: a content that goes out in one
// message).
const KeepMax = 128 << 10

// ScanHooks are told of a scan's progress while it runs.
type ScanHooks struct {
	// Walked is called once, when the walk has listed the tree and before
	// any file is read, with a copy of every entry found: files whose
	// content the scanner's cache vouches for (unchanged since it last
	// read them) carry their hash, the others none yet. A source can
	// describe the tree's directories and unchanged files while the rest
	// is still being read.
	Walked func(entries []Entry)
	// Hashed is called with every file the scan reads (new or changed
	// since this scanner last read it) as soon as its hash is known, from
	// several goroutines at once, before the scan returns; content is the
	// file's bytes as hashed when the file is at most KeepMax bytes, else
	// nil. A source sends contents while the rest of the tree is still
	// being read, and a small file is read once, not once to hash and
	// again to send. Hashed may block: reading waits for it.
	Hashed func(e Entry, content []byte)
}

// ScanHooked is Scan, telling hooks of its progress.
func (s *Scanner) ScanHooked(ctx context.Context, hooks ScanHooks) (ScanResult, error) {
	hashed := hooks.Hashed
	st, err := os.Stat(s.Root)
	if err != nil || !st.IsDir() {
		if err == nil {
			err = errors.New("fstree: not a directory")
		}
		return ScanResult{}, fmt.Errorf("%w: %s: %v", ErrRootMissing, s.Root, err)
	}
	s.mu.Lock()
	if s.cache == nil {
		s.cache = map[string]cached{}
	}
	s.mu.Unlock()
	// Everything is read through descriptors, never through a symlink: a
	// local process swapping a directory or file for a link to something
	// it may not read itself must not get it published.
	t, err := s.root()
	if err != nil {
		return ScanResult{}, fmt.Errorf("%w: %s: %v", ErrRootMissing, s.Root, err)
	}
	defer t.close()

	ws := &walkState{keys: map[int]statKey{}}
	if err := s.walk(ctx, t, int(t.root.Fd()), "", ws); err != nil {
		return ScanResult{}, err
	}
	entries := ws.entries

	if hooks.Walked != nil {
		hooks.Walked(slices.Clone(entries))
	}
	if beforeHash != nil {
		beforeHash()
	}
	res := ScanResult{Hashed: len(ws.toHash)}
	gone, err := s.hashAll(ctx, t, ws, hashed, &res)
	if err != nil {
		return ScanResult{}, err
	}
	out := entries[:0]
	for i, e := range entries {
		if !gone[i] {
			out = append(out, e)
		}
	}
	Sort(out)
	res.Entries = out
	s.forgetMissing(out)
	return res, nil
}

// beforeHash, when set by a test, runs between the walk and the reads.
var beforeHash func()

// forgetMissing drops cache entries of deleted files, so the cache does not
// grow with every file that ever existed.
func (s *Scanner) forgetMissing(es []Entry) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.cache) <= len(es) {
		return
	}
	live := make(map[string]bool, len(es))
	for _, e := range es {
		live[e.Path] = true
	}
	for p := range s.cache {
		if !live[p] {
			delete(s.cache, p)
		}
	}
}

// Remember records a file's hash as it is on disk now, so the next scan
// does not read back what Apply just wrote.
func (s *Scanner) Remember(rel, hash string) {
	fi, err := os.Lstat(filepath.Join(s.Root, filepath.FromSlash(rel)))
	if err != nil {
		return
	}
	_, key, ok := entryOf(rel, fi)
	if !ok {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cache == nil {
		s.cache = map[string]cached{}
	}
	s.cache[rel] = cached{key: key, hash: hash}
}

// entryOf builds an entry from an lstat; ok is false for kinds not
// replicated (sockets, devices, fifos).
func entryOf(rel string, fi fs.FileInfo) (Entry, statKey, bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return Entry{}, statKey{}, false
	}
	return entryOfStat(rel, &unix.Stat_t{Mode: st.Mode, Uid: st.Uid, Gid: st.Gid, Size: st.Size, Ino: st.Ino,
		Mtim: unix.Timespec(st.Mtim), Ctim: unix.Timespec(st.Ctim)})
}

// entryOfStat is entryOf from a stat(2) result.
func entryOfStat(rel string, st *unix.Stat_t) (Entry, statKey, bool) {
	e := Entry{Path: path.Clean(rel), Mode: st.Mode & 0o7777, MTime: st.Mtim.Nano(),
		UID: int(st.Uid), GID: int(st.Gid)}
	key := statKey{size: st.Size, mtime: e.MTime, ctime: st.Ctim.Nano(), ino: st.Ino}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		e.Kind, e.Size = KindFile, st.Size
	case unix.S_IFDIR:
		e.Kind = KindDir
	case unix.S_IFLNK:
		e.Kind = KindSymlink
		// A symlink's own mode means nothing on Linux, and its times
		// cannot be set through the portable calls: neither is carried.
		e.Mode, e.MTime = 0, 0
	default:
		return Entry{}, statKey{}, false
	}
	return e, key, true
}

type fileState struct{ key statKey }

// hashFile reads the file rel and returns its SHA-256, how many bytes that
// covers, and its stat after reading. With keep (the size the file had, at
// most KeepMax; -1 for none) it also returns the bytes it hashed, unless
// the file grew past KeepMax.
func hashFile(t *tree, rel string, keep int64) (string, int64, fileState, []byte, error) {
	full := t.full(rel)
	f, err := t.openFile(rel)
	if err != nil {
		return "", 0, fileState{}, nil, fmt.Errorf("hash %s: %w", full, err)
	}
	defer f.Close()
	h := sha256.New()
	var content []byte
	var hashed int64
	whole := false
	if keep >= 0 {
		// One byte more than expected tells a file that grew: then it is
		// hashed to its end and not kept.
		content = make([]byte, keep+1)
		n, rerr := io.ReadFull(f, content)
		content = content[:n]
		h.Write(content)
		hashed += int64(n)
		switch {
		case rerr == nil:
			content = nil
		case errors.Is(rerr, io.EOF) || errors.Is(rerr, io.ErrUnexpectedEOF):
			whole = true
		default:
			err = rerr
		}
	}
	if err == nil && !whole {
		var n int64
		n, err = io.Copy(h, f)
		hashed += n
	}
	if err != nil {
		return "", 0, fileState{}, nil, fmt.Errorf("hash %s: %w", full, err)
	}
	fi, err := f.Stat()
	if err != nil {
		return "", 0, fileState{}, nil, fmt.Errorf("hash %s: %w", full, err)
	}
	_, key, _ := entryOf(filepath.Base(full), fi)
	return hex.EncodeToString(h.Sum(nil)), hashed, fileState{key: key}, content, nil
}
