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
	"sync"
	"syscall"
)

// ErrRootMissing means a tree's root does not exist or is not a directory:
// an unmounted disk must never read as "everything was deleted".
var ErrRootMissing = errors.New("tree root missing")

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
	st, err := os.Stat(s.Root)
	if err != nil || !st.IsDir() {
		if err == nil {
			err = errors.New("not a directory")
		}
		return ScanResult{}, fmt.Errorf("%w: %s: %v", ErrRootMissing, s.Root, err)
	}
	s.mu.Lock()
	if s.cache == nil {
		s.cache = map[string]cached{}
	}
	s.mu.Unlock()

	var entries []Entry
	var toHash []int
	keys := map[int]statKey{}
	var walk func(dir, rel string) error
	walk = func(dir, rel string) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		des, err := os.ReadDir(dir)
		if err != nil {
			if rel != "" && errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return fmt.Errorf("scan %s: %w", dir, err)
		}
		for _, de := range des {
			r := de.Name()
			if rel != "" {
				r = rel + "/" + de.Name()
			}
			full := filepath.Join(dir, de.Name())
			fi, err := os.Lstat(full)
			if err != nil {
				if errors.Is(err, fs.ErrNotExist) {
					continue
				}
				return fmt.Errorf("scan %s: %w", full, err)
			}
			e, key, ok := entryOf(r, fi)
			if !ok || s.Exclude.Excluded(r, e.Kind == KindDir) {
				continue
			}
			switch e.Kind {
			case KindSymlink:
				if e.Link, err = os.Readlink(full); err != nil {
					continue
				}
			case KindFile:
				s.mu.Lock()
				c, hit := s.cache[r]
				s.mu.Unlock()
				if hit && c.key == key {
					e.Hash = c.hash
				} else {
					toHash = append(toHash, len(entries))
					keys[len(entries)] = key
				}
			}
			entries = append(entries, e)
			if e.Kind == KindDir {
				if err := walk(full, r); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if err := walk(s.Root, ""); err != nil {
		return ScanResult{}, err
	}

	res := ScanResult{Hashed: len(toHash)}
	gone := make([]bool, len(entries))
	var mu sync.Mutex
	var firstErr error
	work := make(chan int)
	var wg sync.WaitGroup
	workers := s.Workers
	if workers <= 0 {
		workers = 4
	}
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				e := &entries[i]
				full := filepath.Join(s.Root, filepath.FromSlash(e.Path))
				h, after, err := hashFile(full)
				mu.Lock()
				switch {
				case errors.Is(err, fs.ErrNotExist):
					gone[i] = true
				case err != nil:
					if firstErr == nil {
						firstErr = err
					}
				default:
					e.Hash = h
					if after.key != keys[i] {
						// Written to while read: publish what was read
						// and let the next pass settle it.
						res.Unsettled++
						e.Size, e.MTime = after.key.size, after.key.mtime
					} else {
						s.mu.Lock()
						s.cache[e.Path] = cached{key: after.key, hash: h}
						s.mu.Unlock()
					}
				}
				mu.Unlock()
			}
		}()
	}
	for _, i := range toHash {
		select {
		case work <- i:
		case <-ctx.Done():
		}
	}
	close(work)
	wg.Wait()
	if firstErr != nil {
		return ScanResult{}, firstErr
	}
	if err := ctx.Err(); err != nil {
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
	e := Entry{Path: path.Clean(rel), Mode: modeBits(fi.Mode()), MTime: fi.ModTime().UnixNano()}
	var key statKey
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		e.UID, e.GID = int(st.Uid), int(st.Gid)
		key = statKey{size: st.Size, mtime: e.MTime, ctime: st.Ctim.Nano(), ino: st.Ino}
	}
	switch {
	case fi.Mode().IsRegular():
		e.Kind, e.Size = KindFile, fi.Size()
	case fi.IsDir():
		e.Kind = KindDir
	case fi.Mode()&fs.ModeSymlink != 0:
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

// hashFile reads a file and returns its SHA-256 and its stat after reading.
func hashFile(full string) (string, fileState, error) {
	f, err := os.Open(full)
	if err != nil {
		return "", fileState{}, fmt.Errorf("hash %s: %w", full, err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fileState{}, fmt.Errorf("hash %s: %w", full, err)
	}
	fi, err := f.Stat()
	if err != nil {
		return "", fileState{}, fmt.Errorf("hash %s: %w", full, err)
	}
	_, key, _ := entryOf(filepath.Base(full), fi)
	return hex.EncodeToString(h.Sum(nil)), fileState{key: key}, nil
}
