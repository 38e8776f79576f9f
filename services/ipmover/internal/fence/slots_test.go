package fence

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

func openOrFail(t testing.TB, path string) *Store {
	t.Helper()
	s, err := Open(path, 0)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func recordOrFail(t testing.TB, s *Store, id string, epoch uint64, managed ...string) {
	t.Helper()
	if err := s.Record(id, epoch, managed...); err != nil {
		t.Fatal(err)
	}
}

// TestTornWriteLeavesThePreviousState: a crash while a Record is writing
// leaves its slot failing the checksum; the state read back is the one
// before that Record (which had not returned), never a fresh start.
func TestTornWriteLeavesThePreviousState(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state")
	s := openOrFail(t, path)
	recordOrFail(t, s, "claim-1", 3, "198.51.100.10/24")
	recordOrFail(t, s, "claim-2", 4)
	recordOrFail(t, s, "claim-3", 5)

	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	f, _, err := readSlots(b)
	if err != nil {
		t.Fatal(err)
	}
	// Cut the newest slot's payload short: its last bytes are the old ones.
	start := f.slot*f.size + slotHeaderLen
	for i := start + 20; i < start+60; i++ {
		b[i] ^= 0xff
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	st := openOrFail(t, path).Snapshot()
	if st.MaxEpoch != 4 || !slices.Equal(st.Recent, []string{"claim-1", "claim-2"}) || !slices.Equal(st.Managed, []string{"198.51.100.10/24"}) {
		t.Fatalf("after a torn write the state is %+v, want the one before claim-3", st)
	}
	// The next Record overwrites the torn slot and is the newest again.
	s2 := openOrFail(t, path)
	recordOrFail(t, s2, "claim-4", 6)
	st = openOrFail(t, path).Snapshot()
	if st.MaxEpoch != 6 || !slices.Contains(st.Recent, "claim-4") || slices.Contains(st.Recent, "claim-3") {
		t.Fatalf("after the next Record the state is %+v", st)
	}
}

// TestBothSlotsBadIsCorrupt: no valid slot is ErrCorrupt, never a fresh
// start that would forget the epoch.
func TestBothSlotsBadIsCorrupt(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state")
	s := openOrFail(t, path)
	recordOrFail(t, s, "claim-1", 3)
	recordOrFail(t, s, "claim-2", 4)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	size := len(b) / 2
	b[slotHeaderLen+2] ^= 0xff
	b[size+slotHeaderLen+2] ^= 0xff
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(path, 0); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("Open with both slots torn = %v, want ErrCorrupt", err)
	}
	for name, content := range map[string][]byte{
		"zeros":       make([]byte, 2*minSlotSize),
		"odd length":  append(encodeSlot(1, []byte(`{"version":1,"max_epoch":4}`)), 0),
		"header only": []byte(slotMagic),
	} {
		if err := os.WriteFile(path, content, 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := Open(path, 0); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: Open = %v, want ErrCorrupt", name, err)
		}
	}
}

// TestJSONStateFileIsReadAndRewrittenAsSlots: a state file of the older
// layout (one JSON document) is read as it is, and the first Record turns
// it into slots holding everything.
func TestJSONStateFileIsReadAndRewrittenAsSlots(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.json")
	old := `{"version":1,"max_epoch":9,"recent":["claim-a"],"managed":["198.51.100.10/24"]}`
	if err := os.WriteFile(path, []byte(old), 0o600); err != nil {
		t.Fatal(err)
	}
	s := openOrFail(t, path)
	if got := s.Check("claim-b", 8, future, now); got != StaleEpoch {
		t.Fatalf("epoch 8 after a JSON file recording 9: %v, want stale_epoch", got)
	}
	recordOrFail(t, s, "claim-b", 9)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !isSlotFile(b) {
		t.Fatalf("the file is still JSON after a Record: %.40q", b)
	}
	st := openOrFail(t, path).Snapshot()
	if st.MaxEpoch != 9 || !slices.Equal(st.Recent, []string{"claim-a", "claim-b"}) || !slices.Equal(st.Managed, []string{"198.51.100.10/24"}) {
		t.Fatalf("state after the rewrite %+v", st)
	}
	// A file put back by hand (an operator restoring the JSON) is not
	// written over in place: the next Record writes a new file.
	if err := os.WriteFile(path, []byte(old), 0o600); err != nil {
		t.Fatal(err)
	}
	recordOrFail(t, s, "claim-c", 10)
	st = openOrFail(t, path).Snapshot()
	if st.MaxEpoch != 10 || !slices.Contains(st.Recent, "claim-c") {
		t.Fatalf("state after a Record over a restored file %+v", st)
	}
}

// TestStateOutgrowingItsSlotMovesToALargerFile: a state larger than its
// slot (many managed addresses) is written into a new, larger file, and
// later Records go into its slots.
func TestStateOutgrowingItsSlotMovesToALargerFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state")
	s := openOrFail(t, path)
	recordOrFail(t, s, "claim-0", 1)
	var managed []string
	for i := range 1200 {
		managed = append(managed, fmt.Sprintf("2001:db8::%x/64", i))
	}
	recordOrFail(t, s, "claim-1", 2, managed...)
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() <= 2*minSlotSize {
		t.Fatalf("file is %d bytes after the state outgrew %d-byte slots", fi.Size(), minSlotSize)
	}
	recordOrFail(t, s, "claim-2", 3)
	st := openOrFail(t, path).Snapshot()
	if st.MaxEpoch != 3 || len(st.Managed) != 1200 || !slices.Equal(st.Recent, []string{"claim-0", "claim-1", "claim-2"}) {
		t.Fatalf("state %d epoch, %d managed, recent %v", st.MaxEpoch, len(st.Managed), st.Recent)
	}
	if fi2, err := os.Stat(path); err != nil || fi2.Size() != fi.Size() {
		t.Fatalf("a Record that fits rewrote the file: %d bytes, was %d (%v)", fi2.Size(), fi.Size(), err)
	}
}

// BenchmarkRecord is the cost of one durable Record on this machine's disk
// (run it where state_file will live: TMPDIR=<that directory>): "slot" as
// Records write, "rename" the whole file replaced by rename with an fsync of
// the file and of its directory, as the older layout was written. "slot"
// also reports the median, p99 and worst Record: a failover waits for one,
// so the disk's tail, not its mean, is what a claim may pay (run it with
// -benchtime=2000x beside the host's usual writes to see it).
func BenchmarkRecord(b *testing.B) {
	payload := []byte(`{"version":1,"max_epoch":7,"recent":["0197a6f2-8d4e-7c3b-9a51-3f2e1d0c9b8a"]}`)
	b.Run("slot", func(b *testing.B) {
		s := openOrFail(b, filepath.Join(b.TempDir(), "state"))
		recordOrFail(b, s, "warm", 1)
		took := make([]time.Duration, 0, b.N)
		b.ResetTimer()
		for i := range b.N {
			start := time.Now()
			recordOrFail(b, s, fmt.Sprintf("claim-%d", i), uint64(i+2))
			took = append(took, time.Since(start))
		}
		b.StopTimer()
		slices.Sort(took)
		at := func(q float64) float64 { return float64(took[int(q*float64(len(took)-1))].Microseconds()) }
		b.ReportMetric(at(0.5), "p50_us")
		b.ReportMetric(at(0.99), "p99_us")
		b.ReportMetric(at(1), "max_us")
	})
	b.Run("rename", func(b *testing.B) {
		path := filepath.Join(b.TempDir(), "state")
		for i := range b.N {
			if _, err := createSlots(path, uint64(i+1), payload); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// FuzzOpen: whatever the state file holds, Open returns a state or an
// error wrapping ErrCorrupt, and never panics.
func FuzzOpen(f *testing.F) {
	f.Add([]byte(`{"version":1,"max_epoch":4,"recent":["a"]}`))
	slot := encodeSlot(7, []byte(`{"version":1,"max_epoch":4,"recent":["a"]}`))
	two := make([]byte, 2*len(slot))
	copy(two, slot)
	f.Add(two)
	f.Add(append(slices.Clone(slot), slot...))
	f.Add([]byte(slotMagic + "\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x00\x00\x00\x00"))
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, b []byte) {
		path := filepath.Join(dir, "state")
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
		s, err := Open(path, 0)
		if err != nil && !errors.Is(err, ErrCorrupt) {
			t.Fatalf("Open = %v, want a state or ErrCorrupt", err)
		}
		if err == nil && s == nil {
			t.Fatal("Open returned neither a store nor an error")
		}
	})
}

// A state more than half a slot's largest size still gets a file Open
// reads back: the room to grow is capped, never the state.
func TestLargeStateFileIsReadable(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state")
	payload := make([]byte, maxSlotSize/2+1)
	for i := range payload {
		payload[i] = 'x'
	}
	f, err := createSlots(path, 1, payload)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	got, p, err := readSlots(b)
	if err != nil {
		t.Fatalf("a %d-byte state written as slots of %d bytes cannot be read back: %v", len(payload), f.size, err)
	}
	if got != f || len(p) != len(payload) {
		t.Fatalf("read %+v with %d bytes, wrote %+v with %d", got, len(p), f, len(payload))
	}
	if _, err := createSlots(path, 2, make([]byte, maxSlotSize)); err == nil {
		t.Fatal("a state larger than the largest slot was written")
	}
}
