package fence

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/events"
)

var (
	now    = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	future = now.Add(time.Second)
	past   = now.Add(-time.Nanosecond)
)

func TestCheck(t *testing.T) {
	seen := State{MaxEpoch: 7, Recent: []string{"a", "b"}}
	for _, tc := range []struct {
		name     string
		state    State
		id       string
		epoch    uint64
		notAfter time.Time
		want     Verdict
	}{
		{"fresh state applies", State{}, "x", 1, future, Apply},
		{"same epoch applies", seen, "c", 7, future, Apply},
		{"newer epoch applies", seen, "c", 8, future, Apply},
		{"older epoch refused", seen, "c", 6, future, StaleEpoch},
		{"past deadline refused", seen, "c", 7, past, Expired},
		{"deadline equal to now still in time", seen, "c", 7, now, Apply},
		{"stale wins over expired", seen, "c", 6, past, StaleEpoch},
		{"redelivery is duplicate", seen, "b", 7, future, Duplicate},
		// An applied command redelivered late must still be acknowledged
		// as done, not reported as refused.
		{"duplicate wins over stale epoch", seen, "a", 3, future, Duplicate},
		{"duplicate wins over expired", seen, "a", 7, past, Duplicate},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := tc.state.clone()
			if got := st.Check(tc.id, tc.epoch, tc.notAfter, now); got != tc.want {
				t.Errorf("Check(%q, %d) = %v, want %v", tc.id, tc.epoch, got, tc.want)
			}
		})
	}
}

func TestVerdictOutcome(t *testing.T) {
	for v, want := range map[Verdict]events.Outcome{
		Apply:      events.OutcomeApplied,
		Duplicate:  events.OutcomeDuplicate,
		StaleEpoch: events.OutcomeStaleEpoch,
		Expired:    events.OutcomeExpired,
		Verdict(0): events.OutcomeFailed,
	} {
		if got := v.Outcome(); got != want {
			t.Errorf("%v.Outcome() = %q, want %q", v, got, want)
		}
	}
}

func TestRecord(t *testing.T) {
	for _, tc := range []struct {
		name      string
		state     State
		id        string
		epoch     uint64
		keep      int
		wantEpoch uint64
		wantIDs   []string
	}{
		{"first", State{}, "a", 3, 4, 3, []string{"a"}},
		{"epoch never goes down", State{MaxEpoch: 9}, "a", 3, 4, 9, []string{"a"}},
		{"repeat id not doubled", State{MaxEpoch: 3, Recent: []string{"a"}}, "a", 3, 4, 3, []string{"a"}},
		{"oldest dropped beyond keep", State{MaxEpoch: 1, Recent: []string{"a", "b", "c"}}, "d", 2, 3, 2, []string{"b", "c", "d"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := tc.state.clone()
			st.Record(tc.id, tc.epoch, tc.keep)
			if st.MaxEpoch != tc.wantEpoch || !slices.Equal(st.Recent, tc.wantIDs) {
				t.Errorf("got epoch %d ids %v, want %d %v", st.MaxEpoch, st.Recent, tc.wantEpoch, tc.wantIDs)
			}
		})
	}
}

func TestRecordDefaultKeepBounds(t *testing.T) {
	var st State
	for i := range DefaultKeep + 10 {
		st.Record(fmt.Sprint("cmd-", i), 1, 0)
	}
	if len(st.Recent) != DefaultKeep {
		t.Fatalf("kept %d ids, want %d", len(st.Recent), DefaultKeep)
	}
	if got := st.Check("cmd-0", 1, future, now); got != Apply {
		t.Errorf("evicted id: %v", got) // forgotten, but the epoch still fences it
	}
	if got := st.Check(fmt.Sprint("cmd-", DefaultKeep+9), 1, future, now); got != Duplicate {
		t.Errorf("newest id: %v, want duplicate", got)
	}
}

func TestStoreSurvivesRestart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "fence.json")
	s, err := Open(path, 0)
	if err != nil {
		t.Fatalf("missing file must be a fresh start: %v", err)
	}
	if got := s.Check("claim-1", 5, future, now); got != Apply {
		t.Fatalf("fresh store: %v", got)
	}
	if err := s.Record("claim-1", 5); err != nil {
		t.Fatal(err)
	}

	// A new process reads the same file.
	s2, err := Open(path, 0)
	if err != nil {
		t.Fatal(err)
	}
	if got := s2.Check("claim-1", 5, future, now); got != Duplicate {
		t.Errorf("after restart the applied command is %v, want duplicate (it would be applied twice)", got)
	}
	if got := s2.Check("claim-old", 4, future, now); got != StaleEpoch {
		t.Errorf("after restart an older epoch is %v, want stale_epoch", got)
	}
	if got := s2.Check("claim-2", 5, future, now); got != Apply {
		t.Errorf("after restart a new command is %v, want apply", got)
	}

	// No temporary files are left beside the state file.
	entries, err := os.ReadDir(filepath.Dir(path))
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 {
		t.Errorf("directory holds %d entries, want only the state file", len(entries))
	}
}

func TestStoreCorruptFileIsAnError(t *testing.T) {
	for name, content := range map[string]string{
		"empty":           "",
		"truncated":       `{"version":1,"max_epoch":4`,
		"not json":        "max_epoch=4\n",
		"unknown version": `{"version":2,"max_epoch":4,"recent":[]}`,
		"no version":      `{"max_epoch":4,"recent":[]}`,
	} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "fence.json")
			if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
				t.Fatal(err)
			}
			s, err := Open(path, 0)
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("Open = %v, %v; want ErrCorrupt, never a silent fresh start", s, err)
			}
		})
	}
}

// A Record that cannot be written leaves memory as it was, whether it
// would have put a new file in place (the first record) or written a slot
// of the existing file in place.
func TestStoreRecordFailureRecordsNothing(t *testing.T) {
	for _, tc := range []struct {
		name   string
		before uint64 // epoch recorded before the directory goes; 0: none
	}{
		{"new file by rename", 0},
		{"slot written in place", 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "fan")
			if err := os.Mkdir(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			s, err := Open(filepath.Join(dir, "fence.json"), 0)
			if err != nil {
				t.Fatal(err)
			}
			if tc.before != 0 {
				if err := s.Record("claim-0", tc.before); err != nil {
					t.Fatal(err)
				}
			}
			// Make the directory unwritable in a way root cannot bypass:
			// replace it with a file, so neither a temporary file can be
			// created nor the state file opened.
			if err := os.RemoveAll(dir); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(dir, nil, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := s.Record("claim-1", 4); err == nil {
				t.Fatal("Record succeeded without a writable directory")
			}
			if got := s.Check("claim-1", 4, future, now); got != Apply {
				t.Errorf("after a failed Record the command is %v; memory must not claim it was applied", got)
			}
			if st := s.Snapshot(); st.MaxEpoch != tc.before {
				t.Errorf("epoch is %d after a failed Record, want %d", st.MaxEpoch, tc.before)
			}
		})
	}
}
