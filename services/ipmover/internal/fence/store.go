package fence

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"sync"
	"time"
)

// fileVersion is the version of the state's JSON encoding.
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
//
// The file holds two slots (slots.go): a Record writes the slot not holding
// the current state and makes it durable with one fdatasync, because it
// stands between a claim and the address being added. The older layout, the
// state as one JSON document replaced by rename, is still read, and is
// rewritten as slots by the first write.
type Store struct {
	path string
	keep int

	mu    sync.Mutex
	state State
	// file is the slot layout on disk; zero until the file has slots.
	file slotFile
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
		return nil, fmt.Errorf("read state %s: %w", path, err)
	}
	if isSlotFile(b) {
		f, payload, err := readSlots(b)
		if err != nil {
			return nil, fmt.Errorf("%w: %s: %w", ErrCorrupt, path, err)
		}
		st, err := decode(payload)
		if err != nil {
			return nil, fmt.Errorf("%w: %s: newest slot (sequence %d): %w", ErrCorrupt, path, f.seq, err)
		}
		s.state, s.file = st, f
		return s, nil
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
		return State{}, fmt.Errorf("fence: unknown version %d", f.Version)
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
	if err := s.write(next); err != nil {
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
	if err := s.write(next); err != nil {
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
	if err := s.write(next); err != nil {
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

// write makes next the state on disk, returning only once it is durable.
// On error the state on disk is the old one or, if only the final flush
// failed, possibly the new one; memory keeps the old one either way.
func (s *Store) write(next State) error {
	payload, err := json.Marshal(fileFormat{Version: fileVersion, State: next})
	if err != nil {
		return fmt.Errorf("encode state: %w", err)
	}
	if s.file.fits(len(payload)) {
		f, err := writeSlot(s.path, s.file, payload)
		if err != nil {
			return err
		}
		s.file = f
		return nil
	}
	// No slots yet (a new node, or the older layout), or a state grown
	// past its slot: a new file, put in place whole.
	f, err := createSlots(s.path, s.file.seq+1, payload)
	if err != nil {
		return err
	}
	s.file = f
	return nil
}
