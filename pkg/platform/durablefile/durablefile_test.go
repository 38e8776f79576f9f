package durablefile_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"

	"github.com/fanpbx/fan/pkg/platform/durablefile"
)

// entries lists dir's names, to see that no temporary file is left.
func entries(t *testing.T, dir string) []string {
	t.Helper()
	des, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, de := range des {
		names = append(names, de.Name())
	}
	return names
}

func TestWriteReplacesContentAndSetsTheModeExactly(t *testing.T) {
	// The umask must not narrow a mode, and a file that was more open
	// before (a key rewritten) must not stay so.
	old := syscall.Umask(0o077)
	defer syscall.Umask(old)
	dir := t.TempDir()
	path := filepath.Join(dir, "state")
	for _, c := range []struct {
		data string
		perm fs.FileMode
	}{{"first", 0o644}, {"second, longer than the first", 0o600}, {"3", 0o640}} {
		if err := durablefile.Write(path, []byte(c.data), c.perm); err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != c.data {
			t.Fatalf("content %q, want %q", got, c.data)
		}
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != c.perm {
			t.Fatalf("mode %v, want %v", fi.Mode().Perm(), c.perm)
		}
	}
	if names := entries(t, dir); len(names) != 1 {
		t.Fatalf("directory holds %v, want only the file", names)
	}
}

func TestFailedWriteKeepsTheOldFileAndLeavesNoTemporary(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "list")
	if err := durablefile.Write(path, []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("encoder failed")
	err := durablefile.WriteFrom(path, 0o644, func(w io.Writer) error {
		if _, err := io.WriteString(w, "half of the new"); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("error %v, want one wrapping %v", err, boom)
	}
	if got, _ := os.ReadFile(path); string(got) != "old" {
		t.Fatalf("content after a failed write %q, want the old one", got)
	}
	if names := entries(t, dir); len(names) != 1 || names[0] != "list" {
		t.Fatalf("directory holds %v, want only the file", names)
	}
	if err := durablefile.Write(filepath.Join(dir, "missing", "f"), []byte("x"), 0o600); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("write into a missing directory: %v, want fs.ErrNotExist", err)
	}
}

// A reader racing many writers sees one writer's content whole every time,
// never a mix or a truncated file, and no temporary file outlives them.
func TestConcurrentWritersNeverShowAPartialFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "dispatcher.list")
	const writers, rounds, size = 4, 25, 256 << 10
	contents := make(map[string]bool)
	payload := func(i int) []byte {
		return bytes.Repeat([]byte(fmt.Sprintf("writer %d;", i)), size/10)
	}
	for i := range writers {
		contents[string(payload(i))] = true
	}
	if err := durablefile.Write(path, payload(0), 0o644); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	for i := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range rounds {
				if err := durablefile.Write(path, payload(i), 0o644); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	reads := 0
	go func() { wg.Wait(); close(done) }()
	for {
		select {
		case <-done:
			if reads == 0 {
				t.Fatal("the reader never read while writers wrote")
			}
			if names := entries(t, dir); len(names) != 1 {
				t.Fatalf("directory holds %v after the writers, want only the file", names)
			}
			return
		default:
		}
		got, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		reads++
		if !contents[string(got)] {
			t.Fatalf("read %d bytes that are no writer's whole content", len(got))
		}
	}
}

func TestSyncDirReportsADirectoryItCannotOpen(t *testing.T) {
	if err := durablefile.SyncDir(filepath.Join(t.TempDir(), "gone")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("SyncDir of a missing directory: %v, want fs.ErrNotExist", err)
	}
	if err := durablefile.SyncDir(t.TempDir()); err != nil {
		t.Fatal(err)
	}
}
