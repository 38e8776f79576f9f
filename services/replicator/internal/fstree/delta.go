package fstree

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"time"
)

// Delta is what changed in a source's tree between two of its
// publications: the entries added or changed, and the paths removed (a
// removed directory's every entry is listed). Deltas form a chain per
// source and epoch: Seq numbers it (the full manifest's AsOf names the
// last delta it includes), and Prev is the Generation of what it applies
// on top of (the full manifest or the delta before), so a target applies
// one only right after its predecessor and never out of order.
type Delta struct {
	Cluster    string    `json:"cluster"`
	Group      string    `json:"group"`
	Tree       string    `json:"tree"`
	Node       string    `json:"node"`
	Epoch      uint64    `json:"epoch"`
	Seq        uint64    `json:"seq"`
	Generation uint64    `json:"generation"`
	Prev       uint64    `json:"prev"`
	Created    time.Time `json:"created"`
	Changed    time.Time `json:"changed"`
	// Files is how many files (and symlinks) the tree holds after it.
	Files   int      `json:"files"`
	Digest  string   `json:"digest"`
	Entries []Entry  `json:"entries,omitempty"`
	Deleted []string `json:"deleted,omitempty"`
}

// DeltaDigest hashes a delta's changes (entries sorted, then deletions
// sorted), as Digest does a manifest's.
func DeltaDigest(entries []Entry, deleted []string) string {
	h := sha256.New()
	enc := json.NewEncoder(h)
	for _, e := range entries {
		if e.Kind == KindDir {
			e.MTime = 0
		}
		_ = enc.Encode(e)
	}
	_ = enc.Encode(deleted)
	return hex.EncodeToString(h.Sum(nil))
}

// MaxDeltaBytes bounds a delta's decompressed size, as MaxManifestBytes
// does a manifest's.
const MaxDeltaBytes = MaxManifestBytes

// EncodeDelta writes d as gzipped JSON.
func EncodeDelta(d *Delta) ([]byte, error) {
	var buf bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&buf, gzip.BestSpeed)
	if err := json.NewEncoder(zw).Encode(d); err != nil {
		return nil, fmt.Errorf("encode delta: %w", err)
	}
	if err := zw.Close(); err != nil {
		return nil, fmt.Errorf("encode delta: %w", err)
	}
	return buf.Bytes(), nil
}

// DecodeDelta reads a stored delta and refuses one larger than
// MaxDeltaBytes decompressed, whose entries fail CheckEntries, that
// deletes an unsafe path or a path it also lists, or whose digest does
// not match.
func DecodeDelta(b []byte) (*Delta, error) {
	zr, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		return nil, fmt.Errorf("decode delta: %w", err)
	}
	raw, err := io.ReadAll(io.LimitReader(zr, MaxDeltaBytes+1))
	if err != nil {
		return nil, fmt.Errorf("decode delta: %w", err)
	}
	if len(raw) > MaxDeltaBytes {
		return nil, fmt.Errorf("fstree: decode delta: more than %d bytes decompressed", MaxDeltaBytes)
	}
	var d Delta
	if err := json.Unmarshal(raw, &d); err != nil {
		return nil, fmt.Errorf("decode delta: %w", err)
	}
	if err := CheckEntries(d.Entries); err != nil {
		return nil, fmt.Errorf("decode delta: %w", err)
	}
	listed := make(map[string]bool, len(d.Entries))
	for _, e := range d.Entries {
		listed[e.Path] = true
	}
	for _, p := range d.Deleted {
		if !safeRel(p) || listed[p] {
			return nil, fmt.Errorf("%w: delta deletes %q", ErrUnsafeManifest, p)
		}
	}
	if g := DeltaDigest(d.Entries, d.Deleted); g != d.Digest {
		return nil, fmt.Errorf("fstree: decode delta: digest %s does not match its changes (%s)", d.Digest, g)
	}
	return &d, nil
}

// Diff compares what ScanPaths found (scanned, sorted; gone) for the
// paths rels with the tree as last published (cur) and returns the
// entries added or changed and the paths removed, sorted. A directory
// listed in rels that exists now is compared with everything cur has
// below it (a directory replaced or renamed into place); one gone takes
// everything below it along. A directory's mtime alone is no change.
func Diff(cur map[string]Entry, rels []string, scanned []Entry, gone []string) (changed []Entry, deleted []string) {
	now := make(map[string]bool, len(scanned))
	for _, e := range scanned {
		now[e.Path] = true
		old, ok := cur[e.Path]
		if ok && sameContent(old, e) && sameMeta(old, e) && old.Size == e.Size {
			continue
		}
		changed = append(changed, e)
	}
	dels := map[string]bool{}
	below := func(dir string) {
		prefix := dir + "/"
		for p := range cur {
			if strings.HasPrefix(p, prefix) && !now[p] {
				dels[p] = true
			}
		}
	}
	for _, r := range gone {
		if _, ok := cur[r]; ok {
			dels[r] = true
		}
		if e, ok := cur[r]; !ok || e.Kind == KindDir {
			below(r)
		}
	}
	for _, r := range rels {
		if e, ok := cur[r]; ok && e.Kind == KindDir && now[r] {
			below(r)
		}
	}
	for p := range dels {
		deleted = append(deleted, p)
	}
	Sort(changed)
	sortStrings(deleted)
	return changed, deleted
}

func sortStrings(s []string) {
	es := make([]Entry, len(s))
	for i, p := range s {
		es[i].Path = p
	}
	Sort(es)
	for i := range es {
		s[i] = es[i].Path
	}
}

// ApplyDelta makes the tree take a delta's changes, looking only at the
// paths it names: each entry of changed is written (or has its metadata
// fixed) and each path of deleted removed, with the same validation,
// conflict keeping, ordering and durability as Apply. o.TreeFiles (the
// files the tree holds before it) is the safety valve's base. A path the
// delta removes that is a directory still holding files the delta does
// not name is left for the next full apply.
func ApplyDelta(ctx context.Context, sc *Scanner, changed []Entry, deleted []string, o ApplyOptions) (ApplyResult, error) {
	wanted, err := Validate(changed, o)
	if err != nil {
		return ApplyResult{}, err
	}
	rels := make([]string, 0, len(wanted)+len(deleted))
	for _, e := range wanted {
		rels = append(rels, e.Path)
	}
	for _, p := range deleted {
		if !safeRel(p) {
			return ApplyResult{}, fmt.Errorf("%w: delta deletes %q", ErrUnsafeManifest, p)
		}
		if !o.Exclude.ExcludedAnywhere(p, false) {
			rels = append(rels, p)
		}
	}
	if err := os.MkdirAll(sc.Root, 0o755); err != nil {
		return ApplyResult{}, fmt.Errorf("apply: create root %s: %w", sc.Root, err)
	}
	t, err := sc.root()
	if err != nil {
		return ApplyResult{}, fmt.Errorf("apply: %w", err)
	}
	defer t.close()
	local, _, err := sc.ScanPaths(ctx, rels, false)
	if err != nil {
		return ApplyResult{}, fmt.Errorf("apply: scan target: %w", err)
	}
	// Only the named paths were looked at: a local entry the delta keeps
	// (listed in changed with the same kind) is not deleted, and one it
	// does not name is not seen at all.
	return planAndExecute(ctx, sc, t, wanted, local.Entries, o, beforeExecute)
}

// DiffAll is Diff for a scan of the whole tree: every path of cur that
// the scan did not find was removed.
func DiffAll(cur map[string]Entry, scanned []Entry) (changed []Entry, deleted []string) {
	now := make(map[string]bool, len(scanned))
	for _, e := range scanned {
		now[e.Path] = true
		old, ok := cur[e.Path]
		if ok && sameContent(old, e) && sameMeta(old, e) && old.Size == e.Size {
			continue
		}
		changed = append(changed, e)
	}
	for p := range cur {
		if !now[p] {
			deleted = append(deleted, p)
		}
	}
	Sort(changed)
	sortStrings(deleted)
	return changed, deleted
}

// Drifted says whether have (as found on disk) differs from want (as
// applied) in what every policy carries: kind, content, and a file's
// mtime and permission bits. Owners and special bits depend on the
// tree's policy and are left to a full apply.
func Drifted(want, have Entry) bool {
	if !sameContent(want, have) {
		return true
	}
	return want.Kind == KindFile && (want.MTime != have.MTime || want.Mode&0o777 != have.Mode&0o777)
}
