package fstree

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

const (
	// maxOpen bounds the temp files held open while waiting for their
	// commit when each is fsynced itself; with syncfs they are closed once
	// written, and up to maxQueued wait, so fetching never waits for a
	// flush (in the profile, fetchers waited 7 s of 26 on a queue of 256).
	maxOpen   = 256
	maxQueued = 4096
	// groupSync: a commit of at least this many files flushes each file
	// system once (syncfs) instead of fsyncing every file; measured here on
	// 10,000 files, one syncfs took 0.55 s where 32 parallel fsyncs took
	// 1.0 s and 4 took 1.5 s. Below it, fsyncing the few files touches less
	// than flushing a file system other programs write to as well.
	groupSync = 8
	// parallelSyncs fsyncs run at once (the journal commits them together).
	parallelSyncs = 16
)

// stagedFile is a complete, verified temp file waiting to be made durable
// and renamed over its final name. f is nil once closed (syncfs mode).
type stagedFile struct {
	w         Entry
	f         *os.File
	dir       *dirHandle // w's directory: the temp file and w's name are in it
	tmp, name string     // names in dir
	n         int64
	dev       uint64
}

// queue is how many staged files may wait for a commit.
func (d *durability) queue() int {
	if d.syncfs {
		return maxQueued
	}
	return maxOpen
}

// staged takes a written temp file into the commit queue. With syncfs its
// descriptor is closed now: the flush goes through the file system's, and
// a small group reopens the file to fsync it (a write-back error nobody has
// seen yet is reported to a descriptor opened after it).
func (d *durability) staged(sf *stagedFile) (*stagedFile, error) {
	if !d.syncfs {
		return sf, nil
	}
	if err := sf.close(); err != nil {
		discard([]*stagedFile{sf})
		return nil, fmt.Errorf("close: %w", err)
	}
	return sf, nil
}

// fsync syncs one staged file through its open descriptor or a new one.
func (sf *stagedFile) fsync() error {
	if sf.f != nil {
		return sf.f.Sync()
	}
	fd, err := unix.Openat(sf.dir.fd(), sf.tmp, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.Fsync(fd)
}

func (sf *stagedFile) close() error {
	if sf.f == nil {
		return nil
	}
	err := sf.f.Close()
	sf.f = nil
	return err
}

// durability makes staged files durable before they get their final names,
// and touched directories durable before an apply reports success.
//
// A file's final name is bound (renamed) only after its data and inode are
// on disk: either its own fsync returned, or a syncfs of its file system
// that started after its last write returned. syncfs is used only on
// kernels that report write-back errors through it (Linux 5.8 and later,
// errors since the descriptor was opened; one is opened on each file system
// before anything is written there): an older kernel's syncfs can lose an
// I/O error, so there every file is fsynced itself.
type durability struct {
	syncfs bool

	mu   sync.Mutex
	devs map[uint64]*os.File
}

func newDurability(t *tree) (*durability, error) {
	d := &durability{syncfs: syncfsReportsErrors(), devs: map[uint64]*os.File{}}
	if _, err := d.device(t.root); err != nil {
		return nil, err
	}
	return d, nil
}

// device returns the file system f is on, keeping a descriptor of it (a
// duplicate of f's) the first time it is seen.
func (d *durability) device(f *os.File) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return 0, fmt.Errorf("stat %s: %w", f.Name(), err)
	}
	dev := uint64(st.Dev)
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, ok := d.devs[dev]; ok || !d.syncfs {
		return dev, nil
	}
	fd, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("keep %s to sync its file system: %w", f.Name(), err)
	}
	d.devs[dev] = os.NewFile(uintptr(fd), f.Name())
	return dev, nil
}

// watch notes the file system of a new temp file before anything is
// written to it, so a later syncfs reports any write-back error of it.
func (d *durability) watch(f *os.File) (uint64, error) {
	return d.device(f)
}

// commit makes a group of staged files durable, then renames each over its
// final name. On error nothing more is renamed and the rest is removed.
func (d *durability) commit(group []*stagedFile) error {
	if beforeCommit != nil {
		beforeCommit(group)
	}
	var err error
	if d.syncfs && len(group) >= groupSync {
		devs := map[uint64]bool{}
		for _, sf := range group {
			devs[sf.dev] = true
		}
		err = d.syncDevs(devs)
	} else {
		err = parallel(len(group), func(i int) error {
			if err := group[i].fsync(); err != nil {
				return fmt.Errorf("fsync %s: %w", group[i].w.Path, err)
			}
			return nil
		})
	}
	if err != nil {
		discard(group)
		return err
	}
	for i, sf := range group {
		err := sf.close()
		if err == nil {
			err = unix.Renameat(sf.dir.fd(), sf.tmp, sf.dir.fd(), sf.name)
		}
		if err != nil {
			discard(group[i:])
			return fmt.Errorf("%s: %w", sf.w.Path, err)
		}
		sf.dir.close()
	}
	return nil
}

func (d *durability) syncDevs(devs map[uint64]bool) error {
	for dev := range devs {
		d.mu.Lock()
		f := d.devs[dev]
		d.mu.Unlock()
		if f == nil {
			return fmt.Errorf("fstree: sync: file system %d not watched", dev)
		}
		if err := unix.Syncfs(int(f.Fd())); err != nil {
			return fmt.Errorf("syncfs %s: %w", f.Name(), err)
		}
	}
	return nil
}

// syncDirs makes the named directories' (relative to t's root) entries
// (renames, creations, deletions) durable. A directory gone since, or
// swapped for a symlink, holds nothing of this apply's.
func (d *durability) syncDirs(t *tree, dirs map[string]bool) error {
	if len(dirs) == 0 {
		return nil
	}
	list := make([]string, 0, len(dirs))
	for dir := range dirs {
		list = append(list, dir)
	}
	gone := func(err error) bool { return errors.Is(err, fs.ErrNotExist) || errors.Is(err, ErrOutsideTree) }
	if d.syncfs && len(list) >= groupSync {
		devs := map[uint64]bool{}
		for _, rel := range list {
			h, err := t.dir(rel)
			if gone(err) {
				continue
			}
			if err != nil {
				return fmt.Errorf("sync %s: %w", rel, err)
			}
			dev, err := d.device(h.f)
			h.close()
			if err != nil {
				return err
			}
			devs[dev] = true
		}
		return d.syncDevs(devs)
	}
	return parallel(len(list), func(i int) error {
		h, err := t.dir(list[i])
		if gone(err) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("sync %s: %w", list[i], err)
		}
		defer h.close()
		if err := h.f.Sync(); err != nil {
			return fmt.Errorf("sync %s: %w", h.f.Name(), err)
		}
		return nil
	})
}

func (d *durability) close() {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, f := range d.devs {
		f.Close()
	}
	d.devs = nil
}

// discard removes staged files that will not be committed.
func discard(group []*stagedFile) {
	for _, sf := range group {
		sf.close()
		_ = unix.Unlinkat(sf.dir.fd(), sf.tmp, 0)
		sf.dir.close()
	}
}

// parallel runs fn(0..n-1), parallelSyncs at a time, and returns the first error.
func parallel(n int, fn func(i int) error) error {
	var wg sync.WaitGroup
	var mu sync.Mutex
	var first error
	sem := make(chan struct{}, parallelSyncs)
	for i := range n {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			if err := fn(i); err != nil {
				mu.Lock()
				if first == nil {
					first = err
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return first
}

// beforeCommit, when set by a test, runs with each group about to be made
// durable and renamed: a crash there must leave only temp files.
var beforeCommit func(group []*stagedFile)

var syncfsOK = sync.OnceValue(func() bool {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return false
	}
	return kernelAtLeast(unix.ByteSliceToString(u.Release[:]), 5, 8)
})

// syncfsReportsErrors says whether syncfs(2) returns write-back errors
// here (Linux 5.8 and later). FSTREE_NO_SYNCFS=1 forces per-file fsync.
func syncfsReportsErrors() bool {
	if os.Getenv("FSTREE_NO_SYNCFS") != "" {
		return false
	}
	return syncfsOK()
}

func kernelAtLeast(release string, major, minor int) bool {
	parts := strings.SplitN(release, ".", 3)
	if len(parts) < 2 {
		return false
	}
	digits := func(s string) string {
		if i := strings.IndexFunc(s, func(r rune) bool { return r < '0' || r > '9' }); i >= 0 {
			return s[:i]
		}
		return s
	}
	ma, err1 := strconv.Atoi(digits(parts[0]))
	mi, err2 := strconv.Atoi(digits(parts[1]))
	if err1 != nil || err2 != nil {
		return false
	}
	return ma > major || (ma == major && mi >= minor)
}
