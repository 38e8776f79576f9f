package config

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
)

// Files a configuration names are checked on the host (HostChecker), so
// `-check-config` (every unit's ExecStartPre) refuses a missing or empty
// credential, certificate or state directory by its key, before the
// service starts and fails later with a less helpful error. An empty path
// is an unset key: nothing to check.

// FileReadable requires path to be a regular file this process can open
// for reading, and not empty (a credential, a certificate, a key, a
// program).
func FileReadable(key, path string) error {
	if path == "" {
		return nil
	}
	st, err := os.Stat(path)
	if err != nil {
		return Errf(key, "%s: %w", path, describe(err))
	}
	if !st.Mode().IsRegular() {
		return Errf(key, "%s is not a regular file", path)
	}
	if st.Size() == 0 {
		return Errf(key, "%s is empty", path)
	}
	f, err := os.Open(path)
	if err != nil {
		return Errf(key, "%s: %w", path, describe(err))
	}
	_ = f.Close()
	return nil
}

// DirExists requires path to be a directory.
func DirExists(key, path string) error {
	if path == "" {
		return nil
	}
	st, err := os.Stat(path)
	if err != nil {
		return Errf(key, "%s: %w", path, describe(err))
	}
	if !st.IsDir() {
		return Errf(key, "%s is not a directory", path)
	}
	return nil
}

// ParentDirExists requires the directory a file is to be written in (a
// state file that does not exist before the first start) to exist.
func ParentDirExists(key, path string) error {
	if path == "" {
		return nil
	}
	if err := DirExists(key, filepath.Dir(path)); err != nil {
		return Errf(key, "%s: its directory: %w", path, errors.Unwrap(err))
	}
	return nil
}

func describe(err error) error {
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return errors.New("no such file or directory")
	case errors.Is(err, fs.ErrPermission):
		return errors.New("permission denied (run -check-config as the service's user)")
	}
	return err
}
