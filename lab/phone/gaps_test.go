package phone

import (
	"testing"
	"time"
)

// TestGapsOwedToTheSender: a silence is the path's only for the part the
// sender's own stalls do not cover.
func TestGapsOwedToTheSender(t *testing.T) {
	t0 := time.Date(2026, 12, 7, 20, 0, 0, 0, time.UTC)
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	m := &media{}
	// Packets every 20 ms, a 400 ms silence after 100 ms and a 300 ms one
	// after 1000 ms.
	for _, at := range []int{0, 20, 40, 60, 80, 100, 500, 520, 540, 1000, 1300, 1320} {
		m.arrivals = append(m.arrivals, arrival{at: ms(at)})
	}
	gaps := m.gapsOver(ms(0), ms(1400), 200*time.Millisecond)
	if len(gaps) != 3 || !gaps[0].At.Equal(ms(100)) || gaps[0].Longest != 400*time.Millisecond ||
		!gaps[1].At.Equal(ms(540)) || gaps[1].Longest != 460*time.Millisecond || !gaps[2].At.Equal(ms(1000)) {
		t.Fatalf("gaps over 200 ms: %+v", gaps)
	}
	// The window's end counts as a silence that runs to it.
	if tail := m.gapsOver(ms(1300), ms(1700), 200*time.Millisecond); len(tail) != 1 || tail[0].Longest != 380*time.Millisecond {
		t.Fatalf("silence to the window's end: %+v", tail)
	}
	// The sender stalled for 390 of the first gap's 400 ms: 10 ms are the
	// path's. Nothing covers the second.
	stalls := []Stall{{From: ms(105), To: ms(495)}}
	if u := gaps[0].Unexplained(stalls); u != 10*time.Millisecond {
		t.Errorf("first gap: %v unexplained, want 10ms", u)
	}
	if u := gaps[1].Unexplained(nil); u != 460*time.Millisecond {
		t.Errorf("second gap: %v unexplained, want all", u)
	}
	// Stalls reaching past the gap count only inside it.
	if u := gaps[2].Unexplained([]Stall{{From: ms(900), To: ms(1100)}, {From: ms(1250), To: ms(1400)}}); u != 150*time.Millisecond {
		t.Errorf("third gap: %v unexplained, want 150ms", u)
	}
	m.stalls = []Stall{{From: ms(105), To: ms(495)}, {From: ms(2000), To: ms(2100)}}
	if got := m.stallsBetween(ms(0), ms(1400)); len(got) != 1 {
		t.Errorf("stalls between 0 and 1400 ms: %+v", got)
	}
}
