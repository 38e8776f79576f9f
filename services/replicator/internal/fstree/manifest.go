// Package fstree turns a directory tree into a manifest (scan) and makes a
// directory tree match a manifest (apply): atomically per file, with
// ownership, permissions and times kept, excluded paths left alone, a safety
// valve against mass deletion, and local changes preserved as conflicts.
package fstree

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io/fs"
	"path"
	"sort"
	"strings"
	"time"
)

// Kind is what an entry is.
type Kind string

const (
	KindFile    Kind = "f"
	KindDir     Kind = "d"
	KindSymlink Kind = "l"
	// KindValue is a key with an inline value (an AstDB entry), not a file.
	KindValue Kind = "v"
)

// Entry is one path of a tree. Paths are slash separated and relative to the
// tree's root; the root itself is never an entry.
type Entry struct {
	Path  string `json:"p"`
	Kind  Kind   `json:"k"`
	Mode  uint32 `json:"m,omitempty"` // permission, setuid, setgid and sticky bits
	UID   int    `json:"u,omitempty"`
	GID   int    `json:"g,omitempty"`
	MTime int64  `json:"t,omitempty"` // Unix nanoseconds
	Size  int64  `json:"s,omitempty"`
	Hash  string `json:"h,omitempty"` // hex SHA-256 of a file's content
	Link  string `json:"l,omitempty"` // a symlink's target
	Value string `json:"v,omitempty"` // a value entry's value
}

// FileMode returns the entry's mode bits as an fs.FileMode.
func (e Entry) FileMode() fs.FileMode {
	m := fs.FileMode(e.Mode & 0o777)
	if e.Mode&0o4000 != 0 {
		m |= fs.ModeSetuid
	}
	if e.Mode&0o2000 != 0 {
		m |= fs.ModeSetgid
	}
	if e.Mode&0o1000 != 0 {
		m |= fs.ModeSticky
	}
	return m
}

func modeBits(m fs.FileMode) uint32 {
	b := uint32(m.Perm())
	if m&fs.ModeSetuid != 0 {
		b |= 0o4000
	}
	if m&fs.ModeSetgid != 0 {
		b |= 0o2000
	}
	if m&fs.ModeSticky != 0 {
		b |= 0o1000
	}
	return b
}

// sameContent says whether two entries hold the same data (metadata aside).
func sameContent(a, b Entry) bool {
	return a.Kind == b.Kind && a.Hash == b.Hash && a.Link == b.Link && a.Value == b.Value
}

// sameMeta says whether ownership, permissions and (for files) mtime agree.
// Directory mtimes change whenever an entry inside changes, so they are set
// but never compared, or every pass would touch every directory.
func sameMeta(a, b Entry) bool {
	if a.Mode != b.Mode || a.UID != b.UID || a.GID != b.GID {
		return false
	}
	return a.Kind != KindFile || a.MTime == b.MTime
}

// Manifest is a source's full description of one tree at one moment.
type Manifest struct {
	Cluster    string    `json:"cluster"`
	Group      string    `json:"group"`
	Tree       string    `json:"tree"`
	Node       string    `json:"node"`
	Epoch      uint64    `json:"epoch"`
	Generation uint64    `json:"generation"`
	Created    time.Time `json:"created"`
	// Changed is when the oldest change first carried by this generation was
	// noticed on the source: the start of the lag a target's apply ends.
	Changed time.Time `json:"changed"`
	Digest  string    `json:"digest"`
	Entries []Entry   `json:"entries"`
}

// Sort orders entries by path, which puts every directory before its contents.
func Sort(es []Entry) {
	sort.Slice(es, func(i, j int) bool { return es[i].Path < es[j].Path })
}

// Digest hashes entries (sorted) so equal trees have equal digests. A
// directory's mtime is left out: a lock file coming and going inside it
// would otherwise make a new manifest out of nothing.
func Digest(es []Entry) string {
	h := sha256.New()
	enc := json.NewEncoder(h)
	for _, e := range es {
		if e.Kind == KindDir {
			e.MTime = 0
		}
		_ = enc.Encode(e)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// Files counts the entries that are not directories.
func Files(es []Entry) int {
	n := 0
	for _, e := range es {
		if e.Kind != KindDir {
			n++
		}
	}
	return n
}

// StoredPart is the part of a tree (entries, sorted) that a target can
// already be given while the rest is still being uploaded: every directory
// and symlink, every file whose content is stored, and a voicemail .txt
// only when every other file of its message (same path, other extension)
// is in the part too, so Asterisk never lists a message whose audio is
// missing.
func StoredPart(entries []Entry, stored func(hash string) bool) []Entry {
	complete := map[string]bool{} // message stem -> all its media stored
	for _, e := range entries {
		if e.Kind == KindFile && !isTxt(e.Path) {
			stem := strings.TrimSuffix(e.Path, path.Ext(e.Path))
			ok, seen := complete[stem]
			complete[stem] = (ok || !seen) && stored(e.Hash)
		}
	}
	var part []Entry
	for _, e := range entries {
		if e.Kind == KindFile {
			if !stored(e.Hash) {
				continue
			}
			if ok, seen := complete[strings.TrimSuffix(e.Path, ".txt")]; isTxt(e.Path) && seen && !ok {
				continue
			}
		}
		part = append(part, e)
	}
	return part
}
