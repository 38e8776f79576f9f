package fstree

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"slices"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// walkState collects what a walk found: the entries, and which files must
// be read because the cache does not vouch for them (with their stat keys).
type walkState struct {
	entries []Entry
	toHash  []int
	keys    map[int]statKey
}

// walk lists the directory dirfd (rel below the root) and everything below it.
func (s *Scanner) walk(ctx context.Context, t *tree, dirfd int, rel string, ws *walkState) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	// A descriptor of its own to read: ReadDir moves its offset.
	fd, err := unix.Openat(dirfd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("scan %s: %w", t.full(rel), err)
	}
	df := os.NewFile(uintptr(fd), t.full(rel))
	des, err := df.ReadDir(-1)
	df.Close()
	if err != nil {
		return fmt.Errorf("scan %s: %w", t.full(rel), err)
	}
	for _, de := range des {
		r := de.Name()
		if rel != "" {
			r = rel + "/" + de.Name()
		}
		if _, err := s.visit(ctx, t, dirfd, de.Name(), r, ws, true, false); err != nil {
			return err
		}
	}
	return nil
}

// visit adds the entry name of dirfd (r below the root) to ws, and with
// recurse everything below it when it is a directory. anywhere checks r's
// every ancestor against the exclusions too (a path that did not come
// from a walk). It says whether r was found (and not excluded).
func (s *Scanner) visit(ctx context.Context, t *tree, dirfd int, name, r string, ws *walkState, recurse, anywhere bool) (bool, error) {
	var st unix.Stat_t
	if err := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) {
			return false, nil
		}
		return false, fmt.Errorf("scan %s: %w", t.full(r), err)
	}
	e, key, ok := entryOfStat(r, &st)
	if !ok {
		return false, nil
	}
	if anywhere && s.Exclude.ExcludedAnywhere(r, e.Kind == KindDir) || !anywhere && s.Exclude.Excluded(r, e.Kind == KindDir) {
		return false, nil
	}
	switch e.Kind {
	case KindSymlink:
		buf := make([]byte, unix.PathMax)
		n, err := unix.Readlinkat(dirfd, name, buf)
		if err != nil {
			return false, nil
		}
		e.Link = string(buf[:n])
	case KindFile:
		s.mu.Lock()
		c, hit := s.cache[r]
		s.mu.Unlock()
		if hit && c.key == key {
			e.Hash = c.hash
		} else {
			ws.toHash = append(ws.toHash, len(ws.entries))
			ws.keys[len(ws.entries)] = key
		}
	}
	ws.entries = append(ws.entries, e)
	if e.Kind != KindDir || !recurse {
		return true, nil
	}
	sub, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ELOOP) {
		// Gone or swapped since the stat: the next scan sees what it became.
		ws.entries = ws.entries[:len(ws.entries)-1]
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("scan %s: %w", t.full(r), err)
	}
	defer unix.Close(sub)
	return true, s.walk(ctx, t, sub, r, ws)
}

// hashAll reads the files ws could not vouch for, several at a time,
// updating the cache, and says which entries vanished or changed kind
// while it read (gone).
func (s *Scanner) hashAll(ctx context.Context, t *tree, ws *walkState, hashed func(Entry, []byte), res *ScanResult) ([]bool, error) {
	entries := ws.entries
	gone := make([]bool, len(entries))
	var mu sync.Mutex
	var firstErr error
	work := make(chan int)
	var wg sync.WaitGroup
	workers := s.Workers
	if workers <= 0 {
		workers = 4
	}
	for range min(workers, max(len(ws.toHash), 1)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				e := &entries[i]
				keep := int64(-1)
				if hashed != nil && e.Size <= KeepMax {
					keep = e.Size
				}
				h, hashedSize, after, content, err := hashFile(t, e.Path, keep)
				var done Entry
				mu.Lock()
				switch {
				case errors.Is(err, fs.ErrNotExist) || errors.Is(err, ErrOutsideTree) || errors.Is(err, errKindChanged):
					// Gone, or swapped for something else since the
					// stat: the next scan sees what it became.
					gone[i] = true
				case err != nil:
					if firstErr == nil {
						firstErr = err
					}
				default:
					e.Hash = h
					if after.key != ws.keys[i] {
						// Written to while read: publish what was read
						// (its size is the bytes hashed: a recording
						// appended to after the read reached its end is
						// longer than that) and let the next pass settle it.
						res.Unsettled++
						e.Size, e.MTime = hashedSize, after.key.mtime
					} else {
						s.mu.Lock()
						s.cache[e.Path] = cached{key: after.key, hash: h}
						s.mu.Unlock()
					}
					done = *e
				}
				mu.Unlock()
				if hashed != nil && done.Hash != "" {
					hashed(done, content)
				}
			}
		}()
	}
	for _, i := range ws.toHash {
		select {
		case work <- i:
		case <-ctx.Done():
		}
	}
	close(work)
	wg.Wait()
	if firstErr != nil {
		return nil, firstErr
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return gone, nil
}

// ScanPaths lists only the paths rels (and, for each that is a directory
// now, everything below it), reading only files whose stat key the cache
// does not vouch for: what a source looks at after file notifications,
// and a target before it applies a delta, instead of the whole tree.
// Paths that do not exist (or are excluded, or lie below a symlink) are
// absent from the result and listed in gone. With recurse false a
// directory is listed alone.
func (s *Scanner) ScanPaths(ctx context.Context, rels []string, recurse bool) (ScanResult, []string, error) {
	st, err := os.Stat(s.Root)
	if err != nil || !st.IsDir() {
		if err == nil {
			err = errors.New("fstree: not a directory")
		}
		return ScanResult{}, nil, fmt.Errorf("%w: %s: %v", ErrRootMissing, s.Root, err)
	}
	s.mu.Lock()
	if s.cache == nil {
		s.cache = map[string]cached{}
	}
	s.mu.Unlock()
	t, err := s.root()
	if err != nil {
		return ScanResult{}, nil, fmt.Errorf("%w: %s: %v", ErrRootMissing, s.Root, err)
	}
	defer t.close()
	rels = slices.Clone(rels)
	slices.Sort(rels)
	rels = slices.Compact(rels)
	if recurse {
		// A path below another listed one is covered by its walk.
		rels = slices.DeleteFunc(rels, func(r string) bool {
			for p := path.Dir(r); p != "."; p = path.Dir(p) {
				if _, found := slices.BinarySearch(rels, p); found {
					return true
				}
			}
			return false
		})
	}
	ws := &walkState{keys: map[int]statKey{}}
	var gone []string
	for _, r := range rels {
		if !safeRel(r) {
			return ScanResult{}, nil, fmt.Errorf("%w: path %q", ErrUnsafeManifest, r)
		}
		h, name, err := t.parent(r)
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) || errors.Is(err, unix.ENOTDIR) || errors.Is(err, ErrOutsideTree) ||
				errors.Is(err, unix.ELOOP) || errors.Is(err, unix.EXDEV) {
				gone = append(gone, r)
				continue
			}
			return ScanResult{}, nil, fmt.Errorf("scan %s: %w", t.full(r), err)
		}
		found, err := s.visit(ctx, t, h.fd(), name, r, ws, recurse, true)
		h.close()
		if err != nil {
			return ScanResult{}, nil, err
		}
		if !found {
			gone = append(gone, r)
		}
	}
	res := ScanResult{Hashed: len(ws.toHash)}
	vanished, err := s.hashAll(ctx, t, ws, nil, &res)
	if err != nil {
		return ScanResult{}, nil, err
	}
	out := ws.entries[:0]
	for i, e := range ws.entries {
		if vanished[i] {
			if slices.Contains(rels, e.Path) {
				gone = append(gone, e.Path)
			}
			continue
		}
		out = append(out, e)
	}
	Sort(out)
	res.Entries = out
	s.mu.Lock()
	for _, r := range gone {
		delete(s.cache, r)
		if recurse {
			for p := range s.cache {
				if strings.HasPrefix(p, r+"/") {
					delete(s.cache, p)
				}
			}
		}
	}
	s.mu.Unlock()
	return res, gone, nil
}
