// Package fstree turns a directory tree into a manifest (scan) and makes a
// directory tree match a manifest (apply): atomically per file, with
// ownership, permissions and times kept, excluded paths left alone, a safety
// valve against mass deletion, and local changes preserved as conflicts.
package fstree

import (
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"path"
	"sort"
	"strings"
	"time"

	"github.com/fanpbx/fan/pkg/events"
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
	// AsOf, in an AstDB tree's manifest, is the last delta (its
	// events.AstDBDelta Seq) whose changes the entries include.
	AsOf    uint64  `json:"as_of,omitempty"`
	Entries []Entry `json:"entries"`
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

// MaxManifestBytes bounds a manifest's decompressed size: a 10,000-file
// tree's is about 2 MB, so this allows some 500,000 entries while a
// compressed bomb of a few kilobytes cannot make a target allocate
// gigabytes.
const MaxManifestBytes = 128 << 20

// EncodeManifest writes m as gzipped JSON, the form manifests are stored in.
func EncodeManifest(m *Manifest) ([]byte, error) {
	var buf bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&buf, gzip.BestSpeed)
	if err := json.NewEncoder(zw).Encode(m); err != nil {
		return nil, fmt.Errorf("encode manifest: %w", err)
	}
	if err := zw.Close(); err != nil {
		return nil, fmt.Errorf("encode manifest: %w", err)
	}
	return buf.Bytes(), nil
}

// DecodeManifest reads a stored manifest (gzipped JSON) and refuses one
// that is larger than MaxManifestBytes once decompressed, whose entries
// fail CheckEntries, or whose digest does not match its entries. What it
// returns may still be refused by a tree's own rules (Validate).
func DecodeManifest(b []byte) (*Manifest, error) {
	return decodeManifest(b, MaxManifestBytes)
}

// decodeManifest is DecodeManifest with a bound of limit bytes (the fuzz
// target's is smaller, so a bomb costs it milliseconds, not seconds).
func decodeManifest(b []byte, limit int64) (*Manifest, error) {
	zr, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		return nil, fmt.Errorf("decode manifest: %w", err)
	}
	raw, err := io.ReadAll(io.LimitReader(zr, limit+1))
	if err != nil {
		return nil, fmt.Errorf("decode manifest: %w", err)
	}
	if int64(len(raw)) > limit {
		return nil, fmt.Errorf("fstree: decode manifest: more than %d bytes decompressed", limit)
	}
	var m Manifest
	dec := json.NewDecoder(bytes.NewReader(raw))
	if err := dec.Decode(&m); err != nil {
		return nil, fmt.Errorf("decode manifest: %w", err)
	}
	if err := CheckEntries(m.Entries); err != nil {
		return nil, fmt.Errorf("decode manifest: %w", err)
	}
	if d := Digest(m.Entries); d != m.Digest {
		return nil, fmt.Errorf("fstree: decode manifest: digest %s does not match its entries (%s)", m.Digest, d)
	}
	return &m, nil
}

// CheckEntries refuses (ErrUnsafeManifest) entries that no scan produces:
// a path that is empty, absolute, not clean, climbs with "..", or holds a
// NUL; a path listed twice; an unknown kind; a file without a SHA-256 or
// with a negative size; a symlink without a target; mode bits beyond
// permissions, setuid, setgid and sticky; an AstDB key or value holding a
// line break or NUL (it would end the AMI action it is sent in and start
// another of the sender's choosing).
func CheckEntries(es []Entry) error {
	seen := make(map[string]bool, len(es))
	for _, e := range es {
		if e.Kind == KindValue {
			if e.Path == "" || strings.ContainsAny(e.Path, "\x00\r\n") || strings.ContainsAny(e.Value, "\x00\r\n") {
				return fmt.Errorf("%w: value entry %q holds a line break or NUL", ErrUnsafeManifest, e.Path)
			}
		} else if !safeRel(e.Path) {
			return fmt.Errorf("%w: path %q", ErrUnsafeManifest, e.Path)
		}
		if seen[e.Path] {
			return fmt.Errorf("%w: path %q listed twice", ErrUnsafeManifest, e.Path)
		}
		seen[e.Path] = true
		if e.Mode&^0o7777 != 0 {
			return fmt.Errorf("%w: %q has mode %o", ErrUnsafeManifest, e.Path, e.Mode)
		}
		switch e.Kind {
		case KindDir, KindValue:
		case KindFile:
			if !events.ValidContentHash(e.Hash) || e.Size < 0 {
				return fmt.Errorf("%w: file %q has hash %q and size %d", ErrUnsafeManifest, e.Path, e.Hash, e.Size)
			}
		case KindSymlink:
			if e.Link == "" || strings.ContainsRune(e.Link, 0) {
				return fmt.Errorf("%w: symlink %q has no usable target", ErrUnsafeManifest, e.Path)
			}
		default:
			return fmt.Errorf("%w: %q has unknown kind %q", ErrUnsafeManifest, e.Path, e.Kind)
		}
	}
	return nil
}
