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
	"sort"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Fetcher returns the content whose SHA-256 is hash.
type Fetcher func(ctx context.Context, hash string) (io.ReadCloser, error)

// ErrMissingContent is wrapped by a Fetcher's error when the content store
// does not have the hash (the source must send it again).
var ErrMissingContent = errors.New("fstree: content not in the store")

// ErrSafetyValve is wrapped by a *ValveError.
var ErrSafetyValve = errors.New("fstree: safety valve: too many deletions")

// ErrUnsafeManifest means a manifest names a path outside the tree, or
// below one of its own symlinks; nothing of it is applied.
var ErrUnsafeManifest = errors.New("fstree: unsafe manifest")

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
	// Prefetch, when set, is told the contents a batch of writes will
	// fetch, in the order it fetches them, and the batch fetches through
	// the Fetcher it returns (which stops when ctx ends): a store can then
	// ask for many contents at once instead of one at a time.
	Prefetch func(ctx context.Context, hashes []string) Fetcher
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
	// Which owner is the policy's (PreserveOwner).
	Owner   bool
	Workers int
	// Now stamps the conflict directory.
	Now time.Time
	// Partial: want lists only part of the tree (a progress manifest).
	// Nothing absent from it is deleted; a path that would have to change
	// kind (so delete first) makes the whole apply refuse, with
	// ErrNeedsFull, to wait for the full manifest.
	Partial bool
	// TreeFiles, when positive, is how many files the whole tree holds:
	// the safety valve's base when the entries planned are only part of
	// it (a delta). DeletedBefore counts deletions recent deltas already
	// made, judged together with this apply's (so a mass deletion cut
	// into many small deltas still meets the valve).
	TreeFiles, DeletedBefore int

	// The tree's policy for what a manifest may ask (see Validate and
	// Plan). All false is the safe default: symlinks stay inside the tree,
	// owners are the target's own, and setuid, setgid and sticky bits are
	// dropped.
	AllowOutsideSymlinks bool
	PreserveOwner        bool
	PreserveSpecialBits  bool
}

// ErrNeedsFull is returned when a partial apply would have to delete something.
var ErrNeedsFull = errors.New("fstree: partial manifest needs deletions; waiting for the full one")

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

// beforeExecute, when set by a test, runs between the plan and its
// execution: the moment a local process could swap a directory for a
// symlink.
var beforeExecute func()

// Apply makes the scanner's tree match want (a manifest's entries) in
// three steps, each usable alone: validate (is the manifest safe to apply
// here at all?), plan (what must change, with the owner and mode policy
// applied), execute (make the changes). Each file is written to a temp
// file in its directory, synced, given its owner, mode and mtime, then
// renamed over the final name, so a reader (or a crash) sees the old file
// or the new one, never a part. Directories are created parents first and
// removed children first; a voicemail message's .txt is written after its
// media and removed before them, so Asterisk never lists a message whose
// audio is missing. Every change is made through a descriptor of the
// entry's directory, opened beneath the root without following any
// symlink, so nothing outside the tree is ever created, changed or removed.
func Apply(ctx context.Context, sc *Scanner, want []Entry, o ApplyOptions) (ApplyResult, error) {
	wanted, err := Validate(want, o)
	if err != nil {
		return ApplyResult{}, err
	}
	if err := os.MkdirAll(sc.Root, 0o755); err != nil {
		return ApplyResult{}, fmt.Errorf("apply: create root %s: %w", sc.Root, err)
	}
	t, err := sc.root()
	if err != nil {
		return ApplyResult{}, fmt.Errorf("apply: %w", err)
	}
	defer t.close()
	local, err := sc.Scan(ctx)
	if err != nil {
		return ApplyResult{}, fmt.Errorf("apply: scan target: %w", err)
	}
	return planAndExecute(ctx, sc, t, wanted, local.Entries, o, beforeExecute)
}

// planAndExecute plans what turns local into wanted and carries it out,
// calling beforeExecute (when set) once the plan is made.
func planAndExecute(ctx context.Context, sc *Scanner, t *tree, wanted, local []Entry, o ApplyOptions, beforeExecute func()) (ApplyResult, error) {
	p, err := Plan(wanted, local, o, Owner{UID: t.uid, GID: t.gid})
	if err != nil {
		return ApplyResult{}, err
	}
	if beforeExecute != nil {
		beforeExecute()
	}
	return p.execute(ctx, sc, t, o)
}

// Validate checks a manifest's entries against this tree's rules and
// returns those to apply (excluded ones dropped), sorted. It refuses the
// whole manifest (ErrUnsafeManifest) for a malformed entry (see
// CheckEntries), a value entry, a path below one of the manifest's own
// symlinks, and, unless AllowOutsideSymlinks, a symlink whose target is
// absolute or climbs out of the tree.
func Validate(want []Entry, o ApplyOptions) ([]Entry, error) {
	if err := CheckEntries(want); err != nil {
		return nil, err
	}
	var wanted []Entry
	links := map[string]bool{}
	for _, e := range want {
		if e.Kind == KindValue {
			return nil, fmt.Errorf("%w: value entry %q in a file tree", ErrUnsafeManifest, e.Path)
		}
		if o.Exclude.ExcludedAnywhere(e.Path, e.Kind == KindDir) {
			continue
		}
		if e.Kind == KindSymlink {
			inside := LinkStaysInside(e.Path, e.Link)
			if !o.AllowOutsideSymlinks && !inside {
				return nil, fmt.Errorf("%w: symlink %q -> %q leaves the tree (allow_outside_symlinks is off)", ErrUnsafeManifest, e.Path, e.Link)
			}
			// A link into what this tree excludes (node-specific files,
			// spool/outgoing below a spool tree) would let others write
			// there through it.
			if to := path.Join(path.Dir(e.Path), e.Link); inside && to != "." && o.Exclude.ExcludedAnywhere(to, true) {
				return nil, fmt.Errorf("%w: symlink %q -> %q leads into a path this tree excludes", ErrUnsafeManifest, e.Path, e.Link)
			}
			links[e.Path] = true
		}
		wanted = append(wanted, e)
	}
	Sort(wanted)
	for _, e := range wanted {
		for p := path.Dir(e.Path); p != "."; p = path.Dir(p) {
			if links[p] {
				return nil, fmt.Errorf("%w: %q is below the symlink %q", ErrUnsafeManifest, e.Path, p)
			}
		}
	}
	return wanted, nil
}

// LinkStaysInside says whether a symlink at rel whose target is link
// resolves inside the tree. The target must be relative and may climb
// ("..") only at its start, and no higher than rel's depth. A ".." after a
// name is refused even when it cancels out on paper ("a/../b"): the
// kernel resolves a, which may itself be a symlink, before climbing from
// wherever it led. Every other symlink the target passes through is itself
// checked the same way, and rel's directories are plain directories (a
// manifest never puts an entry below a symlink), so the whole resolution
// stays beneath the root.
func LinkStaysInside(rel, link string) bool {
	if link == "" || strings.HasPrefix(link, "/") || strings.ContainsRune(link, 0) {
		return false
	}
	depth := strings.Count(rel, "/") // directories between the root and the link
	named := false
	for _, c := range strings.Split(link, "/") {
		switch c {
		case "", ".":
		case "..":
			if named || depth == 0 {
				return false
			}
			depth--
		default:
			named = true
		}
	}
	return true
}

// Owner is a user and group id.
type Owner struct{ UID, GID int }

// ApplyPlan is what an apply will change.
type ApplyPlan struct {
	// Wanted is the validated manifest with the owner and mode policy
	// applied: what the tree will hold.
	Wanted                   []Entry
	DelFiles, DelDirs        []Entry // local entries to remove
	Writes, MetaFix, NewDirs []Entry

	wm, lm map[string]Entry
	local  []Entry
}

// Plan compares the wanted entries (from Validate) with the local tree
// and decides what to delete, create, write and fix. The owner and mode
// policy is applied here, so an entry whose only difference is one the
// policy overrides is left alone: without PreserveSpecialBits, setuid,
// setgid and sticky bits are dropped; without PreserveOwner, an existing
// entry keeps its local owner and a new one gets root's (the tree root's
// owner). It refuses a partial apply that would have to delete
// (ErrNeedsFull) and a pass over the safety valve (*ValveError).
func Plan(wanted, local []Entry, o ApplyOptions, root Owner) (*ApplyPlan, error) {
	p := &ApplyPlan{wm: make(map[string]Entry, len(wanted)), lm: make(map[string]Entry, len(local)), local: local}
	for _, e := range local {
		p.lm[e.Path] = e
	}
	for _, w := range wanted {
		if !o.PreserveSpecialBits {
			w.Mode &= 0o777
		}
		if !o.PreserveOwner {
			if l, ok := p.lm[w.Path]; ok && l.Kind == w.Kind {
				w.UID, w.GID = l.UID, l.GID
			} else {
				w.UID, w.GID = root.UID, root.GID
			}
		}
		p.Wanted = append(p.Wanted, w)
		p.wm[w.Path] = w
	}
	for _, l := range local {
		w, ok := p.wm[l.Path]
		if ok && w.Kind == l.Kind {
			continue
		}
		if l.Kind == KindDir {
			p.DelDirs = append(p.DelDirs, l)
		} else {
			p.DelFiles = append(p.DelFiles, l)
		}
	}
	for _, w := range p.Wanted {
		l, ok := p.lm[w.Path]
		switch {
		case w.Kind == KindDir:
			if !ok || l.Kind != KindDir {
				p.NewDirs = append(p.NewDirs, w)
			}
		case !ok || !sameContent(l, w):
			p.Writes = append(p.Writes, w)
		case !sameMeta(l, w):
			p.MetaFix = append(p.MetaFix, w)
		}
	}
	if o.Partial {
		for _, l := range append(p.DelFiles, p.DelDirs...) {
			if _, ok := p.wm[l.Path]; ok {
				return nil, fmt.Errorf("%w: %s changes kind", ErrNeedsFull, l.Path)
			}
		}
		p.DelFiles, p.DelDirs = nil, nil
	}
	localFiles := Files(local)
	if o.TreeFiles > 0 {
		localFiles = o.TreeFiles + o.DeletedBefore
	}
	if n := len(p.DelFiles) + o.DeletedBefore; len(p.DelFiles) > 0 && n > o.AllowDeletes && float64(n) > o.MaxDeleteShare*float64(localFiles) {
		return nil, &ValveError{Deletes: n, TargetFiles: localFiles, MaxShare: o.MaxDeleteShare}
	}
	return p, nil
}

// execute makes the planned changes, each through a descriptor of the
// entry's directory opened beneath t's root.
func (p *ApplyPlan) execute(ctx context.Context, sc *Scanner, t *tree, o ApplyOptions) (ApplyResult, error) {
	var res ApplyResult
	touched := map[string]bool{} // directories (relative) whose entries changed
	touch := func(rel string) { touched[path.Dir(rel)] = true }

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
			return errors.New("fstree: apply: local changes to keep, and no conflict directory configured")
		}
		dst := filepath.Join(o.ConflictDir, stamp, filepath.FromSlash(l.Path))
		if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
			return fmt.Errorf("apply: conflict dir: %w", err)
		}
		if err := keepCopy(t, l.Path, dst); err != nil {
			return fmt.Errorf("apply: preserve %s: %w", l.Path, err)
		}
		res.Conflicts = append(res.Conflicts, Conflict{Path: l.Path, Reason: reason, PreservedAs: dst})
		return nil
	}

	// Deletions: .txt first, so a message disappears from listings before
	// its audio does.
	delFiles := slices.Clone(p.DelFiles)
	sort.SliceStable(delFiles, func(i, j int) bool { return isTxt(delFiles[i].Path) && !isTxt(delFiles[j].Path) })
	for _, l := range delFiles {
		if err := preserve(l); err != nil {
			return res, err
		}
		if err := t.remove(l.Path, false); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return res, fmt.Errorf("apply: delete %s: %w", l.Path, err)
		}
		touch(l.Path)
		res.Deleted++
	}
	// Deepest directories first. One that still holds excluded files
	// (node-specific) stays, unless a file must take its place.
	delDirs := slices.Clone(p.DelDirs)
	sort.Slice(delDirs, func(i, j int) bool { return delDirs[i].Path > delDirs[j].Path })
	for _, l := range delDirs {
		err := t.remove(l.Path, true)
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			if _, replace := p.wm[l.Path]; !replace {
				continue
			}
			return res, fmt.Errorf("apply: %s must become a %s but holds files this tree excludes: %w", l.Path, p.wm[l.Path].Kind, err)
		}
		touch(l.Path)
		res.Deleted++
	}

	// Directories, parents first (Wanted is sorted).
	for _, w := range p.NewDirs {
		if err := t.mkdir(w.Path); err != nil {
			return res, fmt.Errorf("apply: mkdir %s: %w", w.Path, err)
		}
		touch(w.Path)
	}

	// Content: media before .txt.
	var first, last []Entry
	for _, w := range p.Writes {
		if l, ok := p.lm[w.Path]; ok && l.Kind == w.Kind {
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
	d, err := newDurability(t)
	if err != nil {
		return res, fmt.Errorf("apply: %w", err)
	}
	defer d.close()
	for _, batch := range [][]Entry{first, last} {
		if err := writeAll(ctx, sc, t, batch, o, &res, d); err != nil {
			return res, err
		}
	}
	if len(res.Missing) > 0 {
		return res, fmt.Errorf("apply: %d contents missing from the store: %w", len(res.Missing), ErrMissingContent)
	}

	var rewrite []Entry
	for _, w := range p.MetaFix {
		err := setMeta(t, w, o.Owner)
		if errors.Is(err, errHardLinked) {
			rewrite = append(rewrite, w)
			continue
		}
		if err != nil {
			return res, fmt.Errorf("apply: %s: %w", w.Path, err)
		}
		res.MetaFixed++
	}
	// A file with other names may be one outside the tree (a hard link a
	// local user made): it gets a copy of its own instead of new metadata.
	if err := writeAll(ctx, sc, t, rewrite, o, &res, d); err != nil {
		return res, err
	}
	if len(res.Missing) > 0 {
		return res, fmt.Errorf("apply: %d contents missing from the store: %w", len(res.Missing), ErrMissingContent)
	}
	// Directory metadata last and deepest first: writing inside a
	// directory moves its mtime.
	for i := len(p.Wanted) - 1; i >= 0; i-- {
		w := p.Wanted[i]
		if w.Kind != KindDir {
			continue
		}
		l, ok := p.lm[w.Path]
		if ok && l.Kind == KindDir && sameMeta(l, w) && l.MTime == w.MTime && !touched[w.Path] {
			continue
		}
		if err := setMeta(t, w, o.Owner); err != nil {
			return res, fmt.Errorf("apply: %s: %w", w.Path, err)
		}
	}
	// Renames are atomic at once, durable only once their directory is.
	if err := d.syncDirs(t, touched); err != nil {
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
func writeAll(ctx context.Context, sc *Scanner, t *tree, batch []Entry, o ApplyOptions, res *ApplyResult, d *durability) error {
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
	if o.Prefetch != nil {
		hashes := make([]string, 0, len(batch))
		for _, w := range batch {
			if w.Kind == KindFile {
				hashes = append(hashes, w.Hash)
			}
		}
		if len(hashes) > 0 {
			pctx, cancel := context.WithCancel(ctx)
			defer cancel() // after every fetcher has returned (wg.Wait below)
			o.Fetch = o.Prefetch(pctx, hashes)
		}
	}
	work := make(chan Entry)
	staged := make(chan *stagedFile, d.queue())
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for w := range work {
				if w.Kind == KindSymlink {
					err := writeSymlink(t, w, o.Owner)
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
				sf, err := stageFile(ctx, t, w, o, d)
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

// stageFile writes w's content to a temp file in w's directory, checks
// its hash and gives it owner, mode and mtime. The file is left open and
// not yet durable: the committer syncs it, then renames it over w's name.
func stageFile(ctx context.Context, t *tree, w Entry, o ApplyOptions, d *durability) (*stagedFile, error) {
	rc, err := o.Fetch(ctx, w.Hash)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	dir, name, err := t.parent(w.Path)
	if err != nil {
		return nil, err
	}
	tmp, tmpName, err := dir.createTemp(name)
	if err != nil {
		dir.close()
		return nil, err
	}
	sf := &stagedFile{w: w, f: tmp, dir: dir, tmp: tmpName, name: name}
	done := false
	defer func() {
		if !done {
			discard([]*stagedFile{sf})
		}
	}()
	// Watch the file system for write-back errors from before the first byte.
	if sf.dev, err = d.watch(tmp); err != nil {
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
		return nil, fmt.Errorf("fstree: content %s arrived with hash %s", w.Hash, got)
	}
	if err := setFileMeta(tmp, w, o.Owner); err != nil {
		return nil, err
	}
	sf.n = n
	done = true
	return d.staged(sf)
}

func writeSymlink(t *tree, w Entry, chown bool) error {
	dir, name, err := t.parent(w.Path)
	if err != nil {
		return err
	}
	defer dir.close()
	tmp := TempPrefix + name + "-link"
	_ = unix.Unlinkat(dir.fd(), tmp, 0)
	if err := unix.Symlinkat(w.Link, dir.fd(), tmp); err != nil {
		return fmt.Errorf("symlink: %w", err)
	}
	if chown {
		if err := unix.Fchownat(dir.fd(), tmp, w.UID, w.GID, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			_ = unix.Unlinkat(dir.fd(), tmp, 0)
			return fmt.Errorf("lchown: %w", err)
		}
	}
	if err := unix.Renameat(dir.fd(), tmp, dir.fd(), name); err != nil {
		_ = unix.Unlinkat(dir.fd(), tmp, 0)
		return fmt.Errorf("rename: %w", err)
	}
	return nil
}

// setMeta gives an existing entry its owner (when chown is set), mode and
// mtime, never following a symlink.
func setMeta(t *tree, w Entry, chown bool) error {
	dir, name, err := t.parent(w.Path)
	if err != nil {
		return err
	}
	defer dir.close()
	if w.Kind == KindSymlink {
		if chown {
			if err := unix.Fchownat(dir.fd(), name, w.UID, w.GID, unix.AT_SYMLINK_NOFOLLOW); err != nil {
				return fmt.Errorf("lchown: %w", err)
			}
		}
		return nil
	}
	f, err := dir.openEntry(name, w.Kind)
	if err != nil {
		return err
	}
	defer f.Close()
	if w.Kind == KindFile {
		var st unix.Stat_t
		if err := unix.Fstat(int(f.Fd()), &st); err != nil {
			return err
		}
		if st.Nlink > 1 {
			return errHardLinked
		}
	}
	return setFileMeta(f, w, chown)
}

// errHardLinked: a file to change in place has other names.
var errHardLinked = errors.New("fstree: file has other hard links")

// mkdir creates the directory rel, readable only by its owner until its
// metadata is set; one that exists is left as it is.
func (t *tree) mkdir(rel string) error {
	dir, name, err := t.parent(rel)
	if err != nil {
		return err
	}
	defer dir.close()
	if err := unix.Mkdirat(dir.fd(), name, 0o700); err != nil && !errors.Is(err, unix.EEXIST) {
		return err
	}
	return nil
}

// remove deletes the file, symlink or (empty) directory rel.
func (t *tree) remove(rel string, isDir bool) error {
	dir, name, err := t.parent(rel)
	if err != nil {
		return err
	}
	defer dir.close()
	flag := 0
	if isDir {
		flag = unix.AT_REMOVEDIR
	}
	return unix.Unlinkat(dir.fd(), name, flag)
}

// keepCopy puts rel's current content at dst: a hard link when possible
// (instant, and the name can then be replaced atomically), else a copy.
// rel itself is never followed.
func keepCopy(t *tree, rel, dst string) error {
	dir, name, err := t.parent(rel)
	if err != nil {
		return err
	}
	defer dir.close()
	if err := unix.Linkat(dir.fd(), name, unix.AT_FDCWD, dst, 0); err == nil {
		return nil
	}
	var st unix.Stat_t
	if err := unix.Fstatat(dir.fd(), name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT == unix.S_IFLNK {
		buf := make([]byte, unix.PathMax)
		n, err := unix.Readlinkat(dir.fd(), name, buf)
		if err != nil {
			return err
		}
		return os.Symlink(string(buf[:n]), dst)
	}
	in, err := dir.openEntry(name, KindFile)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, fs.FileMode(st.Mode&0o777))
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
		p != ".." && !strings.HasPrefix(p, "../") && !strings.Contains(p, "/../") &&
		!strings.ContainsRune(p, 0)
}

// RemoveTemps deletes temp files a crash left in the tree. They are never
// visible under a final name, but they take space. Like Apply it walks
// through directory descriptors and never follows a symlink.
func (s *Scanner) RemoveTemps() error {
	root := s.Root
	t, err := s.root()
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("remove temps in %s: %w", root, err)
	}
	defer t.close()
	var walk func(rel string) error
	walk = func(rel string) error {
		dir, err := t.dir(rel)
		if err != nil {
			if rel != "." && (errors.Is(err, fs.ErrNotExist) || errors.Is(err, ErrOutsideTree)) {
				return nil // gone, or swapped for a symlink: nothing of ours below
			}
			return err
		}
		defer dir.close()
		// A descriptor of its own: the shared one's offset is not ours to move.
		fd, err := unix.Openat(dir.fd(), ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		lf := os.NewFile(uintptr(fd), dir.f.Name())
		des, err := lf.ReadDir(-1)
		lf.Close()
		if err != nil {
			return err
		}
		for _, de := range des {
			child := de.Name()
			if rel != "." {
				child = rel + "/" + de.Name()
			}
			switch {
			case isDirent(de):
				if err := walk(child); err != nil {
					return err
				}
			case strings.HasPrefix(de.Name(), TempPrefix):
				if err := unix.Unlinkat(dir.fd(), de.Name(), 0); err != nil && !errors.Is(err, fs.ErrNotExist) {
					return err
				}
			}
		}
		return nil
	}
	if err := walk("."); err != nil {
		return fmt.Errorf("remove temps in %s: %w", root, err)
	}
	return nil
}
