package fence

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"
)

// fileVersion is the state file's format version.
const fileVersion = 1

type fileFormat struct {
	Version int `json:"version"`
	State
}

// ErrCorrupt means the state file exists but cannot be trusted. It is never
// treated as a fresh start: that would forget the highest epoch and re-open
// every older one.
var ErrCorrupt = errors.New("fence: state file corrupt")

// Store is a State kept in a file. Its methods are safe for concurrent use,
// but a Check followed by Record is not atomic: the caller serialises
// command handling (the executor handles one command at a time).
type Store struct {
	path string
	keep int

	mu    sync.Mutex
	state State
}

// Open loads the state file at path. A missing file is a fresh state (first
// start on this node); an unreadable or malformed one is an error wrapping
// ErrCorrupt (for malformed content) so an operator decides, not the code.
// keep <= 0 means DefaultKeep.
func Open(path string, keep int) (*Store, error) {
	if keep <= 0 {
		keep = DefaultKeep
	}
	s := &Store{path: path, keep: keep}
	b, err := os.ReadFile(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return s, nil
	case err != nil:
		return nil, fmt.Errorf("fence: read state %s: %w", path, err)
	}
	st, err := decode(b)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrCorrupt, path, err)
	}
	s.state = st
	return s, nil
}

func decode(b []byte) (State, error) {
	var f fileFormat
	if err := json.Unmarshal(b, &f); err != nil {
		return State{}, err
	}
	if f.Version != fileVersion {
		return State{}, fmt.Errorf("unknown version %d", f.Version)
	}
	return f.State, nil
}

// Check decides what to do with a command; see State.Check.
func (s *Store) Check(cmdID string, epoch uint64, notAfter, now time.Time) Verdict {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.state.Check(cmdID, epoch, notAfter, now)
}

// Record notes cmdID and epoch and returns only once that is on disk. Call it
// before carrying the command out: a crash in between then loses the command
// (the arbiter retries with a new id) rather than applying it twice. On error
// nothing is recorded, in memory either, and the command must not be applied.
//
// managed are the addresses the command may put on the interface (a
// claim's); they are remembered for a release without the bus.
func (s *Store) Record(cmdID string, epoch uint64, managed ...string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	next := s.state.clone()
	next.Record(cmdID, epoch, s.keep, managed...)
	if err := writeAtomic(s.path, fileFormat{Version: fileVersion, State: next}); err != nil {
		return err
	}
	s.state = next
	return nil
}

// ForgetEpoch drops the recorded epoch. The executor calls it only when the
// recorded epoch cannot be a term of the command stream (it is not below the
// sequence of a command whose own epoch is a term that exists): a value
// recorded before epochs were checked, or a stream re-created from nothing.
func (s *Store) ForgetEpoch() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	next := s.state.clone()
	next.MaxEpoch = 0
	if err := writeAtomic(s.path, fileFormat{Version: fileVersion, State: next}); err != nil {
		return err
	}
	s.state = next
	return nil
}

// Manage remembers addresses this node is about to hold without a command
// (a restart re-taking what the arbiter's state says it holds). It writes
// only when something is new.
func (s *Store) Manage(addrs ...string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	next := s.state.clone()
	for _, a := range addrs {
		if !slices.Contains(next.Managed, a) {
			next.Managed = append(next.Managed, a)
		}
	}
	if len(next.Managed) == len(s.state.Managed) {
		return nil
	}
	if err := writeAtomic(s.path, fileFormat{Version: fileVersion, State: next}); err != nil {
		return err
	}
	s.state = next
	return nil
}

// Snapshot returns a copy of the current state (for status and metrics).
func (s *Store) Snapshot() State {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.state.clone()
}

// writeAtomic replaces path so that a reader (or a restart after a crash)
// sees either the old file or the new one, complete: write a temporary file
// in the same directory, fsync it, rename it over, then fsync the directory
// so the rename itself is durable.
func writeAtomic(path string, v any) (err error) {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("fence: encode state: %w", err)
	}
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("fence: create temp state file: %w", err)
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if _, err = tmp.Write(b); err != nil {
		return fmt.Errorf("fence: write %s: %w", tmp.Name(), err)
	}
	if err = tmp.Sync(); err != nil {
		return fmt.Errorf("fence: fsync %s: %w", tmp.Name(), err)
	}
	if err = tmp.Close(); err != nil {
		return fmt.Errorf("fence: close %s: %w", tmp.Name(), err)
	}
	if err = os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("fence: rename state into place: %w", err)
	}
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("fence: open state dir: %w", err)
	}
	defer d.Close()
	if err = d.Sync(); err != nil {
		return fmt.Errorf("fence: fsync state dir %s: %w", dir, err)
	}
	return nil
}
