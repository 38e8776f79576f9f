package fstree

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ErrOutsideTree means a path could only be reached through a symlink (or
// by climbing out of the root): Apply never follows one, so nothing it
// creates, changes or removes can land outside the tree, whatever the
// manifest or a local process put in the tree before or during the apply.
var ErrOutsideTree = errors.New("fstree: path is not a plain directory path beneath the tree root")

// resolveBeneath opens rel below the directory dirfd with flags, following
// no symlink in any component (a source's scan never descends through a
// symlink, so a genuine manifest never needs that) and never leaving the
// directory. openat2(RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS) does it in one
// call; on kernels without openat2 (before 5.6) each component is opened
// with O_NOFOLLOW from its parent's descriptor, which is equivalent.
func resolveBeneath(dirfd int, rel string, flags int) (int, error) {
	if rel == "." {
		return unix.Openat(dirfd, ".", flags|unix.O_CLOEXEC, 0)
	}
	if !safeRel(rel) {
		return -1, fmt.Errorf("%w: %q", ErrOutsideTree, rel)
	}
	if !walkOnly {
		how := unix.OpenHow{
			Flags:   uint64(flags | unix.O_CLOEXEC | unix.O_NOFOLLOW),
			Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
		}
		for try := 0; ; try++ {
			fd, err := unix.Openat2(dirfd, rel, &how)
			switch {
			case err == nil:
				return fd, nil
			case (errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR)) && try < 8:
				continue // a concurrent rename; the kernel asks to retry
			case errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EPERM) && !openat2Seen():
				// No openat2 (or a seccomp filter refusing it): walk.
				return walkBeneath(dirfd, rel, flags)
			case errors.Is(err, unix.ELOOP) || errors.Is(err, unix.EXDEV):
				return -1, fmt.Errorf("%w: %s", ErrOutsideTree, rel)
			case errors.Is(err, unix.ENOTDIR):
				// A symlink where a directory is wanted, or a file: the
				// walk tells which.
				return walkBeneath(dirfd, rel, flags)
			default:
				return -1, err
			}
		}
	}
	return walkBeneath(dirfd, rel, flags)
}

// walkOnly, set by tests, forces the component walk.
var walkOnly bool

// openat2Seen says whether openat2 worked here once, so an EPERM from it
// is a real permission error rather than a filter refusing the call.
var openat2Seen = sync.OnceValue(func() bool {
	how := unix.OpenHow{Flags: unix.O_RDONLY | unix.O_DIRECTORY | unix.O_CLOEXEC, Resolve: unix.RESOLVE_BENEATH}
	fd, err := unix.Openat2(unix.AT_FDCWD, ".", &how)
	if err != nil {
		return false
	}
	unix.Close(fd)
	return true
})

func walkBeneath(dirfd int, rel string, flags int) (int, error) {
	parts := strings.Split(rel, "/")
	cur := dirfd
	defer func() {
		if cur != dirfd {
			unix.Close(cur)
		}
	}()
	for i, p := range parts {
		f := unix.O_RDONLY | unix.O_DIRECTORY
		if i == len(parts)-1 {
			f = flags
		}
		fd, err := unix.Openat(cur, p, f|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			var st unix.Stat_t
			if (errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR)) &&
				unix.Fstatat(cur, p, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT == unix.S_IFLNK {
				return -1, fmt.Errorf("%w: %s", ErrOutsideTree, rel)
			}
			return -1, err
		}
		if cur != dirfd {
			unix.Close(cur)
		}
		cur = fd
	}
	fd := cur
	cur = dirfd
	return fd, nil
}

// tree holds the root of one apply and hands out descriptors of the
// directories below it. Every change Apply makes is a *at call on such a
// descriptor with a single-component name, so a directory swapped for a
// symlink between a check and a use cannot redirect it.
type tree struct {
	root     *os.File
	path     string
	uid, gid int // the root's owner: new entries' owner by default

	// Open directories are shared: staged files waiting for their commit
	// hold their directory's handle, and one per file could exhaust the
	// descriptor limit on a large pass.
	mu   sync.Mutex
	open map[string]*dirHandle
}

// root opens the scanner's tree root. Where the configured root leads is
// resolved once, the first time it exists (an administrator's symlink,
// such as /etc/asterisk -> /srv/asterisk, is trusted), and from then on
// that path is opened from / without following any symlink: a local user
// who owns a directory above the root (asterisk owns /var/spool/asterisk)
// and swaps the root for a symlink to /etc is refused, not obeyed.
func (s *Scanner) root() (*tree, error) {
	s.pinMu.Lock()
	pinned := s.pinned
	if pinned == "" {
		real, err := filepath.EvalSymlinks(s.Root)
		if err == nil {
			real, err = filepath.Abs(real)
		}
		if err != nil {
			s.pinMu.Unlock()
			return nil, fmt.Errorf("open tree root: %w", err)
		}
		s.pinned, pinned = real, real
	}
	s.pinMu.Unlock()
	return openTree(pinned)
}

// openTree opens the directory at the absolute path root, through no
// symlink.
func openTree(root string) (*tree, error) {
	slash, err := os.Open("/")
	if err != nil {
		return nil, fmt.Errorf("open tree root: %w", err)
	}
	defer slash.Close()
	rel := strings.TrimPrefix(filepath.Clean(root), "/")
	if rel == "" {
		rel = "."
	}
	fd, err := resolveBeneath(int(slash.Fd()), rel, unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return nil, fmt.Errorf("open tree root %s: %w", root, err)
	}
	f := os.NewFile(uintptr(fd), root)
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		f.Close()
		return nil, fmt.Errorf("stat tree root: %w", err)
	}
	return &tree{root: f, path: root, uid: int(st.Uid), gid: int(st.Gid), open: map[string]*dirHandle{}}, nil
}

func (t *tree) close() { t.root.Close() }

// dirHandle is an open directory beneath the root, shared by reference.
type dirHandle struct {
	t    *tree
	f    *os.File
	rel  string // "." for the root
	refs int
}

func (h *dirHandle) fd() int { return int(h.f.Fd()) }

// close drops one reference; the last closes the descriptor.
func (h *dirHandle) close() {
	h.t.mu.Lock()
	defer h.t.mu.Unlock()
	if h.refs--; h.refs == 0 {
		delete(h.t.open, h.rel)
		h.f.Close()
	}
}

// dir opens the directory rel ("." for the root) beneath the root.
func (t *tree) dir(rel string) (*dirHandle, error) {
	t.mu.Lock()
	if h := t.open[rel]; h != nil {
		h.refs++
		t.mu.Unlock()
		return h, nil
	}
	t.mu.Unlock()
	fd, err := resolveBeneath(int(t.root.Fd()), rel, unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return nil, fmt.Errorf("open directory %s: %w", rel, err)
	}
	f := os.NewFile(uintptr(fd), t.full(rel))
	t.mu.Lock()
	defer t.mu.Unlock()
	if h := t.open[rel]; h != nil {
		f.Close()
		h.refs++
		return h, nil
	}
	h := &dirHandle{t: t, f: f, rel: rel, refs: 1}
	t.open[rel] = h
	return h, nil
}

// parent opens rel's directory and returns it with rel's last component.
func (t *tree) parent(rel string) (*dirHandle, string, error) {
	h, err := t.dir(path.Dir(rel))
	if err != nil {
		return nil, "", err
	}
	return h, path.Base(rel), nil
}

// full is rel's path, for messages only.
func (t *tree) full(rel string) string { return filepath.Join(t.path, filepath.FromSlash(rel)) }

// createTemp creates a new temp file for name in h, readable only by its
// owner until its mode is set.
func (h *dirHandle) createTemp(name string) (*os.File, string, error) {
	for range 16 {
		var r [6]byte
		_, _ = rand.Read(r[:])
		tmp := TempPrefix + name + "-" + hex.EncodeToString(r[:])
		fd, err := unix.Openat(h.fd(), tmp, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if errors.Is(err, unix.EEXIST) {
			continue
		}
		if err != nil {
			return nil, "", fmt.Errorf("temp file in %s: %w", h.f.Name(), err)
		}
		return os.NewFile(uintptr(fd), filepath.Join(h.f.Name(), tmp)), tmp, nil
	}
	return nil, "", fmt.Errorf("fstree: temp file in %s: no free name", h.f.Name())
}

// openEntry opens name in h without following it, and checks that it is
// of kind k: a FIFO or device put there in the meantime is never opened
// for I/O (O_NONBLOCK) nor changed.
func (h *dirHandle) openEntry(name string, k Kind) (*os.File, error) {
	flags := unix.O_RDONLY | unix.O_NOFOLLOW | unix.O_NONBLOCK | unix.O_NOCTTY | unix.O_CLOEXEC
	if k == KindDir {
		flags |= unix.O_DIRECTORY
	}
	fd, err := unix.Openat(h.fd(), name, flags, 0)
	if err != nil {
		if errors.Is(err, unix.ELOOP) {
			return nil, fmt.Errorf("%w: %s is a symlink", ErrOutsideTree, name)
		}
		return nil, err
	}
	f := os.NewFile(uintptr(fd), filepath.Join(h.f.Name(), name))
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		f.Close()
		return nil, err
	}
	want := uint32(unix.S_IFREG)
	if k == KindDir {
		want = unix.S_IFDIR
	}
	if st.Mode&unix.S_IFMT != want {
		f.Close()
		return nil, fmt.Errorf("%s: %w", name, errKindChanged)
	}
	return f, nil
}

// errKindChanged: an entry is no longer of the kind it was planned as.
var errKindChanged = errors.New("fstree: no longer of the kind it was")

// openFile opens the regular file rel for reading, beneath the root and
// without following any symlink.
func (t *tree) openFile(rel string) (*os.File, error) {
	fd, err := resolveBeneath(int(t.root.Fd()), rel, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), t.full(rel))
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		f.Close()
		return nil, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		f.Close()
		return nil, fmt.Errorf("%s: %w", rel, errKindChanged)
	}
	return f, nil
}

// OpenFile opens the regular file rel of the tree for reading the way a
// scan does: beneath the root, through no symlink, and only if it is still
// a regular file (a FIFO swapped in is not waited on).
func (s *Scanner) OpenFile(rel string) (*os.File, error) {
	t, err := s.root()
	if err != nil {
		return nil, err
	}
	defer t.close()
	return t.openFile(rel)
}

// setFileMeta gives an open file or directory its owner (when chown is
// set), mode bits and mtime, through its descriptor.
func setFileMeta(f *os.File, w Entry, chown bool) error {
	fd := int(f.Fd())
	if chown {
		if err := unix.Fchown(fd, w.UID, w.GID); err != nil {
			return fmt.Errorf("chown: %w", err)
		}
	}
	// Fchown clears setuid and setgid, so the mode comes after it.
	if err := unix.Fchmod(fd, w.Mode&0o7777); err != nil {
		return fmt.Errorf("chmod: %w", err)
	}
	if err := futimens(fd, time.Unix(0, w.MTime)); err != nil {
		return fmt.Errorf("chtimes: %w", err)
	}
	return nil
}

// futimens sets a descriptor's access and modification times
// (utimensat with a NULL path, as the C library's futimens does).
func futimens(fd int, t time.Time) error {
	ts := [2]unix.Timespec{unix.NsecToTimespec(t.UnixNano()), unix.NsecToTimespec(t.UnixNano())}
	_, _, e := unix.Syscall6(unix.SYS_UTIMENSAT, uintptr(fd), 0, uintptr(unsafe.Pointer(&ts[0])), 0, 0, 0)
	if e != 0 {
		return e
	}
	return nil
}

// isDirent reports whether a ReadDir entry is a plain directory (not a
// symlink to one).
func isDirent(de fs.DirEntry) bool { return de.Type()&fs.ModeType == fs.ModeDir }
