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
	"sort"
	"strings"
	"sync"
	"time"
)

// Fetcher returns the content whose SHA-256 is hash.
type Fetcher func(ctx context.Context, hash string) (io.ReadCloser, error)

// ErrMissingContent is wrapped by a Fetcher's error when the content store
// does not have the hash (the source must send it again).
var ErrMissingContent = errors.New("content not in the store")

// ErrSafetyValve is wrapped by a *ValveError.
var ErrSafetyValve = errors.New("safety valve: too many deletions")

// ErrUnsafeManifest means a manifest names a path outside the tree, or
// below one of its own symlinks; nothing of it is applied.
var ErrUnsafeManifest = errors.New("unsafe manifest")

// ValveError says how many deletions a refused pass would have made.
type ValveError struct {
	Deletes, TargetFiles int
	MaxShare             float64
}

func (e *ValveError) Error() string {
	return fmt.Sprintf("%v: pass would delete %d of %d files (%.0f%%), more than %.0f%%; nothing applied",
		ErrSafetyValve, e.Deletes, e.TargetFiles, 100*float64(e.Deletes)/float64(max(e.TargetFiles, 1)), 100*e.MaxShare)
}

func (e *ValveError) Unwrap() error { return ErrSafetyValve }

// ApplyOptions say how to make a local tree match a manifest.
type ApplyOptions struct {
	Exclude *Excluder
	Fetch   Fetcher
	// Known maps each path to ContentKey of what this node last published
	// or applied. A local file that is about to be replaced or removed and
	// differs from Known was changed here, not by replication: it is
	// preserved under ConflictDir. nil means nothing is known, so every
	// replaced or removed file is preserved.
	Known       map[string]string
	ConflictDir string
	// MaxDeleteShare of the local files may be deleted in one pass;
	// AllowDeletes deletions are always allowed (a small tree losing one
	// file is not a disaster). Beyond both, nothing is applied.
	MaxDeleteShare float64
	AllowDeletes   int
	// Owner sets ownership (needs root); without it only modes and times.
	Owner   bool
	Workers int
	// Now stamps the conflict directory.
	Now time.Time
	// Partial: want lists only part of the tree (a progress manifest).
	// Nothing absent from it is deleted; a path that would have to change
	// kind (so delete first) makes the whole apply refuse, with
	// ErrNeedsFull, to wait for the full manifest.
	Partial bool
}

// ErrNeedsFull: a partial apply would have to delete something.
var ErrNeedsFull = errors.New("partial manifest needs deletions; waiting for the full one")

// Conflict is a local file preserved before replication replaced it.
type Conflict struct {
	Path, Reason, PreservedAs string
}

// ApplyResult counts what an apply changed.
type ApplyResult struct {
	Files, Bytes, Deleted, MetaFixed int64
	Conflicts                        []Conflict
	Missing                          []string
}

// ContentKey identifies an entry's content for conflict detection.
func ContentKey(e Entry) string {
	switch e.Kind {
	case KindFile:
		return "f:" + e.Hash
	case KindSymlink:
		return "l:" + e.Link
	case KindValue:
		return "v:" + e.Value
	}
	return string(e.Kind)
}

// KnownOf builds the Known map of a manifest's entries.
func KnownOf(es []Entry) map[string]string {
	m := make(map[string]string, len(es))
	for _, e := range es {
		if e.Kind != KindDir {
			m[e.Path] = ContentKey(e)
		}
	}
	return m
}

// afterPartialWrite, when set by a test, runs after half of a file's
// content is in its temp file: the moment a crash must leave no trace.
var afterPartialWrite func(tmp string)

// Apply makes the scanner's tree match want (a manifest's entries). Each
// file is written to a temp file in its directory, synced, given its
// owner, mode and mtime, then renamed over the final name, so a reader (or
// a crash) sees the old file or the new one, never a part. Directories are
// created parents first and removed children first; a voicemail message's
// .txt is written after its media and removed before them, so Asterisk
// never lists a message whose audio is missing.
func Apply(ctx context.Context, sc *Scanner, want []Entry, o ApplyOptions) (ApplyResult, error) {
	var res ApplyResult
	if err := os.MkdirAll(sc.Root, 0o755); err != nil {
		return res, fmt.Errorf("apply: create root %s: %w", sc.Root, err)
	}
	wm := make(map[string]Entry, len(want))
	var wanted []Entry
	links := map[string]bool{}
	for _, e := range want {
		if !safeRel(e.Path) {
			return res, fmt.Errorf("%w: path %q", ErrUnsafeManifest, e.Path)
		}
		if e.Kind == KindValue {
			return res, fmt.Errorf("%w: value entry %q in a file tree", ErrUnsafeManifest, e.Path)
		}
		if o.Exclude.ExcludedAnywhere(e.Path, e.Kind == KindDir) {
			continue
		}
		wm[e.Path] = e
		wanted = append(wanted, e)
		if e.Kind == KindSymlink {
			links[e.Path] = true
		}
	}
	Sort(wanted)
	for _, e := range wanted {
		for p := path.Dir(e.Path); p != "."; p = path.Dir(p) {
			if links[p] {
				return res, fmt.Errorf("%w: %q is below the symlink %q", ErrUnsafeManifest, e.Path, p)
			}
		}
	}

	local, err := sc.Scan(ctx)
	if err != nil {
		return res, fmt.Errorf("apply: scan target: %w", err)
	}
	lm := make(map[string]Entry, len(local.Entries))
	for _, e := range local.Entries {
		lm[e.Path] = e
	}

	// Plan.
	var delFiles, delDirs []Entry
	var writes, metaFix []Entry
	for _, l := range local.Entries {
		w, ok := wm[l.Path]
		if ok && w.Kind == l.Kind {
			continue
		}
		if l.Kind == KindDir {
			delDirs = append(delDirs, l)
		} else {
			delFiles = append(delFiles, l)
		}
	}
	for _, w := range wanted {
		l, ok := lm[w.Path]
		switch {
		case w.Kind == KindDir:
			// created or fixed below
		case !ok || !sameContent(l, w):
			writes = append(writes, w)
		case !sameMeta(l, w):
			metaFix = append(metaFix, w)
		}
	}
	if o.Partial {
		for _, l := range append(delFiles, delDirs...) {
			if _, ok := wm[l.Path]; ok {
				return res, fmt.Errorf("%w: %s changes kind", ErrNeedsFull, l.Path)
			}
		}
		delFiles, delDirs = nil, nil
	}
	localFiles := Files(local.Entries)
	if n := len(delFiles); n > o.AllowDeletes && float64(n) > o.MaxDeleteShare*float64(localFiles) {
		return res, &ValveError{Deletes: n, TargetFiles: localFiles, MaxShare: o.MaxDeleteShare}
	}

	touched := map[string]bool{}
	touch := func(rel string) { touched[filepath.Dir(filepath.Join(sc.Root, filepath.FromSlash(rel)))] = true }

	// Local changes about to be overridden are kept, not lost.
	stamp := o.Now.UTC().Format("20060102T150405.000Z")
	preserve := func(l Entry) error {
		reason := ""
		known, ok := o.Known[l.Path]
		switch {
		case o.Known == nil || !ok:
			reason = "local_only"
		case known != ContentKey(l):
			reason = "modified_locally"
		default:
			return nil
		}
		if o.ConflictDir == "" {
			return errors.New("apply: local changes to keep, and no conflict directory configured")
		}
		src := filepath.Join(sc.Root, filepath.FromSlash(l.Path))
		dst := filepath.Join(o.ConflictDir, stamp, filepath.FromSlash(l.Path))
		if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
			return fmt.Errorf("apply: conflict dir: %w", err)
		}
		if err := keepCopy(src, dst); err != nil {
			return fmt.Errorf("apply: preserve %s: %w", l.Path, err)
		}
		res.Conflicts = append(res.Conflicts, Conflict{Path: l.Path, Reason: reason, PreservedAs: dst})
		return nil
	}

	// Deletions: .txt first, so a message disappears from listings before
	// its audio does.
	sort.SliceStable(delFiles, func(i, j int) bool { return isTxt(delFiles[i].Path) && !isTxt(delFiles[j].Path) })
	for _, l := range delFiles {
		if err := preserve(l); err != nil {
			return res, err
		}
		full := filepath.Join(sc.Root, filepath.FromSlash(l.Path))
		if err := os.Remove(full); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return res, fmt.Errorf("apply: delete %s: %w", l.Path, err)
		}
		touch(l.Path)
		res.Deleted++
	}
	// Deepest directories first. One that still holds excluded files
	// (node-specific) stays, unless a file must take its place.
	sort.Slice(delDirs, func(i, j int) bool { return delDirs[i].Path > delDirs[j].Path })
	for _, l := range delDirs {
		full := filepath.Join(sc.Root, filepath.FromSlash(l.Path))
		err := os.Remove(full)
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			if _, replace := wm[l.Path]; !replace {
				continue
			}
			return res, fmt.Errorf("apply: %s must become a %s but holds files this tree excludes: %w", l.Path, wm[l.Path].Kind, err)
		}
		touch(l.Path)
		res.Deleted++
	}

	// Directories, parents first.
	for _, w := range wanted {
		if w.Kind != KindDir {
			continue
		}
		if l, ok := lm[w.Path]; ok && l.Kind == KindDir {
			continue
		}
		full := filepath.Join(sc.Root, filepath.FromSlash(w.Path))
		if err := os.Mkdir(full, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
			return res, fmt.Errorf("apply: mkdir %s: %w", w.Path, err)
		}
		touch(w.Path)
	}

	// Content: media before .txt.
	var first, last []Entry
	for _, w := range writes {
		if l, ok := lm[w.Path]; ok && l.Kind == w.Kind {
			if err := preserve(l); err != nil {
				return res, err
			}
		}
		if isTxt(w.Path) {
			last = append(last, w)
		} else {
			first = append(first, w)
		}
		touch(w.Path)
	}
	d, err := newDurability(sc.Root)
	if err != nil {
		return res, fmt.Errorf("apply: %w", err)
	}
	defer d.close()
	for _, batch := range [][]Entry{first, last} {
		if err := writeAll(ctx, sc, batch, o, &res, d); err != nil {
			return res, err
		}
	}
	if len(res.Missing) > 0 {
		return res, fmt.Errorf("apply: %d contents missing from the store: %w", len(res.Missing), ErrMissingContent)
	}

	for _, w := range metaFix {
		if err := setMeta(filepath.Join(sc.Root, filepath.FromSlash(w.Path)), w, o.Owner); err != nil {
			return res, err
		}
		res.MetaFixed++
	}
	// Directory metadata last and deepest first: writing inside a
	// directory moves its mtime.
	for i := len(wanted) - 1; i >= 0; i-- {
		w := wanted[i]
		if w.Kind != KindDir {
			continue
		}
		full := filepath.Join(sc.Root, filepath.FromSlash(w.Path))
		l, ok := lm[w.Path]
		if ok && l.Kind == KindDir && sameMeta(l, w) && l.MTime == w.MTime && !touched[full] {
			continue
		}
		if err := setMeta(full, w, o.Owner); err != nil {
			return res, err
		}
	}
	// Renames are atomic at once, durable only once their directory is.
	if err := d.syncDirs(touched); err != nil {
		return res, fmt.Errorf("apply: %w", err)
	}
	return res, nil
}

// writeAll writes a batch of files and symlinks. Workers fetch each
// content into a temp file next to its final name; a committer makes the
// temp files durable and only then renames them into place. It commits
// whatever the workers staged while its previous commit ran, so one file
// costs one fsync while a large sync shares one flush among hundreds
// (group commit): per-file fsync was half the target's blocking time in the
// profile of a 10,000-file sync. Every file of the batch is renamed before
// writeAll returns, which keeps the media-before-.txt order of the batches.
func writeAll(ctx context.Context, sc *Scanner, batch []Entry, o ApplyOptions, res *ApplyResult, d *durability) error {
	workers := o.Workers
	if workers <= 0 {
		workers = 4
	}
	// Fetching mostly waits on the bus: twice as many as hash.
	workers *= 2
	var mu sync.Mutex
	var firstErr error
	fail := func(err error) {
		mu.Lock()
		if firstErr == nil {
			firstErr = err
		}
		mu.Unlock()
	}
	failed := func() bool {
		mu.Lock()
		defer mu.Unlock()
		return firstErr != nil
	}
	work := make(chan Entry)
	staged := make(chan *stagedFile, d.queue())
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for w := range work {
				full := filepath.Join(sc.Root, filepath.FromSlash(w.Path))
				if w.Kind == KindSymlink {
					err := writeSymlink(full, w, o.Owner)
					mu.Lock()
					if err != nil {
						if firstErr == nil {
							firstErr = fmt.Errorf("apply: %s: %w", w.Path, err)
						}
					} else {
						res.Files++
					}
					mu.Unlock()
					continue
				}
				sf, err := stageFile(ctx, full, w, o, d)
				switch {
				case errors.Is(err, ErrMissingContent):
					mu.Lock()
					res.Missing = append(res.Missing, w.Hash)
					mu.Unlock()
				case err != nil:
					fail(fmt.Errorf("apply: %s: %w", w.Path, err))
				default:
					staged <- sf
				}
			}
		}()
	}
	committed := make(chan struct{})
	go func() {
		defer close(committed)
		var group []*stagedFile
		for sf := range staged {
			group = append(group[:0], sf)
			// Take whatever else is ready (group commit), up to the queue.
		more:
			for len(group) < d.queue() {
				select {
				case sf, ok := <-staged:
					if !ok {
						break more
					}
					group = append(group, sf)
				default:
					break more
				}
			}
			if failed() || ctx.Err() != nil {
				discard(group)
				continue
			}
			if err := d.commit(group); err != nil {
				fail(fmt.Errorf("apply: %w", err))
				continue
			}
			mu.Lock()
			for _, sf := range group {
				res.Files++
				res.Bytes += sf.n
			}
			mu.Unlock()
			for _, sf := range group {
				sc.Remember(sf.w.Path, sf.w.Hash)
			}
		}
	}()
	for _, w := range batch {
		if failed() {
			break
		}
		select {
		case work <- w:
		case <-ctx.Done():
		}
	}
	close(work)
	wg.Wait()
	close(staged)
	<-committed
	if firstErr != nil {
		return firstErr
	}
	return ctx.Err()
}

// stageFile writes w's content to a temp file next to full, checks its
// hash and gives it owner, mode and mtime. The file is left open and not
// yet durable: the committer syncs it, then renames it over full.
func stageFile(ctx context.Context, full string, w Entry, o ApplyOptions, d *durability) (*stagedFile, error) {
	rc, err := o.Fetch(ctx, w.Hash)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	tmp, err := os.CreateTemp(filepath.Dir(full), TempPrefix+filepath.Base(full)+"-*")
	if err != nil {
		return nil, fmt.Errorf("temp file: %w", err)
	}
	done := false
	defer func() {
		if !done {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	// Watch the file system for write-back errors from before the first byte.
	dev, err := d.watch(tmp)
	if err != nil {
		return nil, err
	}
	h := sha256.New()
	dst := io.MultiWriter(tmp, h)
	var n int64
	if hook := afterPartialWrite; hook != nil {
		n, err = io.CopyN(dst, rc, w.Size/2)
		if err == nil {
			hook(tmp.Name())
		}
	}
	if err == nil || errors.Is(err, io.EOF) {
		var m int64
		m, err = io.Copy(dst, rc)
		n += m
	}
	if err != nil {
		return nil, fmt.Errorf("fetch %s: %w", w.Hash, err)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != w.Hash {
		return nil, fmt.Errorf("content %s arrived with hash %s", w.Hash, got)
	}
	if o.Owner {
		if err := tmp.Chown(w.UID, w.GID); err != nil {
			return nil, fmt.Errorf("chown: %w", err)
		}
	}
	if err := tmp.Chmod(w.FileMode()); err != nil {
		return nil, fmt.Errorf("chmod: %w", err)
	}
	mt := time.Unix(0, w.MTime)
	if err := os.Chtimes(tmp.Name(), mt, mt); err != nil {
		return nil, fmt.Errorf("chtimes: %w", err)
	}
	done = true
	return d.staged(&stagedFile{w: w, f: tmp, full: full, n: n, dev: dev})
}

func writeSymlink(full string, w Entry, owner bool) error {
	tmp := filepath.Join(filepath.Dir(full), TempPrefix+filepath.Base(full)+"-link")
	_ = os.Remove(tmp)
	if err := os.Symlink(w.Link, tmp); err != nil {
		return fmt.Errorf("symlink: %w", err)
	}
	if owner {
		if err := os.Lchown(tmp, w.UID, w.GID); err != nil {
			os.Remove(tmp)
			return fmt.Errorf("lchown: %w", err)
		}
	}
	if err := os.Rename(tmp, full); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("rename: %w", err)
	}
	return nil
}

func setMeta(full string, w Entry, owner bool) error {
	if w.Kind == KindSymlink {
		if owner {
			if err := os.Lchown(full, w.UID, w.GID); err != nil {
				return fmt.Errorf("apply: lchown %s: %w", w.Path, err)
			}
		}
		return nil
	}
	if owner {
		if err := os.Chown(full, w.UID, w.GID); err != nil {
			return fmt.Errorf("apply: chown %s: %w", w.Path, err)
		}
	}
	if err := os.Chmod(full, w.FileMode()); err != nil {
		return fmt.Errorf("apply: chmod %s: %w", w.Path, err)
	}
	mt := time.Unix(0, w.MTime)
	if err := os.Chtimes(full, mt, mt); err != nil {
		return fmt.Errorf("apply: chtimes %s: %w", w.Path, err)
	}
	return nil
}

// keepCopy puts src's current content at dst: a hard link when possible
// (instant, and the name can then be replaced atomically), else a copy.
func keepCopy(src, dst string) error {
	if err := os.Link(src, dst); err == nil {
		return nil
	}
	fi, err := os.Lstat(src)
	if err != nil {
		return err
	}
	if fi.Mode()&fs.ModeSymlink != 0 {
		target, err := os.Readlink(src)
		if err != nil {
			return err
		}
		return os.Symlink(target, dst)
	}
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, fi.Mode().Perm())
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

func isTxt(p string) bool { return strings.HasSuffix(p, ".txt") }

func safeRel(p string) bool {
	return p != "" && p != "." && !strings.HasPrefix(p, "/") && path.Clean(p) == p &&
		p != ".." && !strings.HasPrefix(p, "../") && !strings.Contains(p, "/../")
}

// RemoveTemps deletes temp files a crash left in the tree. They are never
// visible under a final name, but they take space.
func RemoveTemps(root string) error {
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if !d.IsDir() && strings.HasPrefix(d.Name(), TempPrefix) {
			if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("remove temps in %s: %w", root, err)
	}
	return nil
}
