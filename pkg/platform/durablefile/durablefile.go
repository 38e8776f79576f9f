// Package durablefile replaces a file whole and durably: a reader sees the
// old content or the new, never a mix, and once a write returns the new
// content survives a power cut under its name.
//
// Every file fan keeps on a node's disk (the fence's state, the list
// Kamailio's dispatcher reads, the replicator's per-tree state, the keys and
// configuration fanctl generates) goes through here, so that the rule is
// kept in one place: a temporary file in the same directory, fsync, rename,
// then fsync of the directory. Without the last step the rename lives only in
// the page cache, and a crash can bring back the old file, or none, after
// the caller acted on the new one.
package durablefile

import (
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
)

// Write replaces path with data, readable as perm exactly (the umask does
// not apply, and a file that was more open before does not stay so).
func Write(path string, data []byte, perm fs.FileMode) error {
	return WriteFrom(path, perm, func(w io.Writer) error {
		_, err := w.Write(data)
		return err
	})
}

// WriteFrom is Write for content produced by a writer function, streamed to
// disk. When fill fails, path keeps its old content and fill's error is
// returned wrapped.
func WriteFrom(path string, perm fs.FileMode, fill func(io.Writer) error) error {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	// A unique name: two writers never share a temporary file, and one left
	// by a crash (a key's, say) is never reopened with its old mode.
	tmp, err := os.CreateTemp(dir, "."+base+".tmp-*")
	if err != nil {
		return fmt.Errorf("replace %s: %w", path, err)
	}
	if err := fillTemp(tmp, perm, fill); err != nil {
		_ = tmp.Close()
		_ = os.Remove(tmp.Name())
		return fmt.Errorf("replace %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		_ = os.Remove(tmp.Name())
		return fmt.Errorf("replace %s: rename: %w", path, err)
	}
	if err := SyncDir(dir); err != nil {
		// The new content is in place; only its durability is in doubt.
		return fmt.Errorf("replace %s: %w", path, err)
	}
	return nil
}

// fillTemp writes and closes tmp; the caller removes it on error.
func fillTemp(tmp *os.File, perm fs.FileMode, fill func(io.Writer) error) error {
	// CreateTemp made it 0600: the mode is set before any byte is written,
	// so a private file is never readable in between.
	if err := tmp.Chmod(perm); err != nil {
		return fmt.Errorf("chmod: %w", err)
	}
	if err := fill(tmp); err != nil {
		return err
	}
	if err := tmp.Sync(); err != nil {
		return fmt.Errorf("fsync: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("close: %w", err)
	}
	return nil
}

// SyncDir makes the entries of dir (a rename into it, a file created or
// removed) durable.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("open directory %s: %w", dir, err)
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("fsync directory %s: %w", dir, err)
	}
	return nil
}
