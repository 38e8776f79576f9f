package window

import (
	"testing"
	"time"
	_ "time/tzdata" // the tests must not depend on the host's zoneinfo either
)

func loc(t *testing.T, name string) *time.Location {
	t.Helper()
	l, err := time.LoadLocation(name)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

var everyDay = []time.Weekday{time.Sunday, time.Monday, time.Tuesday, time.Wednesday, time.Thursday, time.Friday, time.Saturday}

func nightly(t *testing.T, tz string, blackouts ...Date) Schedule {
	return Schedule{{Name: "nightly", Loc: loc(t, tz), Weekly: []Weekly{{Days: everyDay, From: 2 * 60, To: 5 * 60}}, Blackouts: blackouts}}
}

func TestWeeklyInANamedZone(t *testing.T) {
	berlin := loc(t, "Europe/Berlin")
	s := nightly(t, "Europe/Berlin")
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, berlin)
	got := s.Next(now, 2)
	want := []time.Time{time.Date(2026, 12, 1, 2, 0, 0, 0, berlin), time.Date(2026, 12, 2, 2, 0, 0, 0, berlin)}
	if len(got) != 2 || !got[0].Start.Equal(want[0]) || !got[1].Start.Equal(want[1]) || got[0].End.Sub(got[0].Start) != 3*time.Hour {
		t.Fatalf("next windows %+v", got)
	}
	// 02:00 Berlin in winter is 01:00 UTC.
	if got[0].Start.UTC().Hour() != 1 {
		t.Fatalf("zone not applied: %v", got[0].Start.UTC())
	}
}

func TestDaylightSavingNights(t *testing.T) {
	berlin := loc(t, "Europe/Berlin")
	// 2026-03-29: clocks go from 02:00 to 03:00, so 02:00-05:00 lasts 2 h.
	s := nightly(t, "Europe/Berlin")
	r := s.Next(time.Date(2026, 3, 28, 12, 0, 0, 0, berlin), 1)[0]
	if d := r.End.Sub(r.Start); d != 2*time.Hour {
		t.Fatalf("spring-forward night lasts %v, want 2h (%v - %v)", d, r.Start, r.End)
	}
	// 2026-10-25: 03:00 goes back to 02:00, so 02:00 happens twice; Go
	// picks one of them (time.Date documents the choice as unspecified),
	// and the window is 3 h or 4 h long, never shorter or lost.
	r = s.Next(time.Date(2026, 10, 24, 12, 0, 0, 0, berlin), 1)[0]
	if d := r.End.Sub(r.Start); d != 3*time.Hour && d != 4*time.Hour {
		t.Fatalf("fall-back night lasts %v, want 3h or 4h", d)
	}
}

func TestMidnightCrossingAndDays(t *testing.T) {
	ny := loc(t, "America/New_York")
	s := Schedule{{Name: "weekend", Loc: ny, Weekly: []Weekly{{Days: []time.Weekday{time.Saturday}, From: 22 * 60, To: 2 * 60}}}}
	// Sunday 01:00 is still inside Saturday night's window.
	sun := time.Date(2026, 12, 6, 1, 0, 0, 0, ny)
	r, ok := s.Open(sun)
	if !ok || r.Start.Weekday() != time.Saturday || !r.End.Equal(time.Date(2026, 12, 6, 2, 0, 0, 0, ny)) {
		t.Fatalf("open at Sunday 01:00: %v %+v", ok, r)
	}
	if _, ok := s.Open(time.Date(2026, 12, 6, 2, 0, 0, 0, ny)); ok {
		t.Fatal("open at its end")
	}
	next := s.Next(time.Date(2026, 12, 6, 3, 0, 0, 0, ny), 1)[0]
	if !next.Start.Equal(time.Date(2026, 12, 12, 22, 0, 0, 0, ny)) {
		t.Fatalf("next Saturday night %v", next.Start)
	}
}

func TestBlackoutsAndOneOffs(t *testing.T) {
	berlin := loc(t, "Europe/Berlin")
	xmas := Date{2026, 12, 24}
	s := nightly(t, "Europe/Berlin", xmas)
	from := time.Date(2026, 12, 23, 12, 0, 0, 0, berlin)
	got := s.Next(from, 1)[0]
	if !got.Start.Equal(time.Date(2026, 12, 25, 2, 0, 0, 0, berlin)) {
		t.Fatalf("blackout not honoured: next is %v", got.Start)
	}
	// A one-off window adds a range; a blackout still wins over it.
	s[0].Once = []Range{
		{Start: time.Date(2026, 12, 23, 22, 0, 0, 0, berlin), End: time.Date(2026, 12, 24, 1, 0, 0, 0, berlin)},
		{Start: time.Date(2026, 12, 25, 4, 0, 0, 0, berlin), End: time.Date(2026, 12, 25, 6, 0, 0, 0, berlin)},
	}
	both := s.Next(from, 2)
	if len(both) != 2 || !both[0].End.Equal(time.Date(2026, 12, 24, 0, 0, 0, 0, berlin)) || both[0].Kind != "once" {
		t.Fatalf("one-off clipped at the blackout: %+v", both)
	}
	// The one-off overlapping the nightly window merges into one range.
	if !both[1].Start.Equal(time.Date(2026, 12, 25, 2, 0, 0, 0, berlin)) || !both[1].End.Equal(time.Date(2026, 12, 25, 6, 0, 0, 0, berlin)) {
		t.Fatalf("merged range %+v", both[1])
	}
}

func TestTicksAreAlignedAndWakesExact(t *testing.T) {
	berlin := loc(t, "Europe/Berlin")
	s := nightly(t, "Europe/Berlin")
	open := time.Date(2026, 12, 1, 2, 0, 0, 0, berlin)
	tick, wake := s.At(open.Add(-time.Hour), time.Minute)
	if tick != nil || !wake.Equal(open) {
		t.Fatalf("before the window: tick %v, wake %v (want the opening)", tick, wake)
	}
	// Two instances waking 150 ms and 40 s into a minute agree on the tick.
	a, wa := s.At(open.Add(10*time.Minute+150*time.Millisecond), time.Minute)
	b, _ := s.At(open.Add(10*time.Minute+40*time.Second), time.Minute)
	if a == nil || b == nil || !a.Start.Equal(b.Start) || !a.Start.Equal(open.Add(10*time.Minute)) || !wa.Equal(open.Add(11*time.Minute)) {
		t.Fatalf("ticks %+v %+v wake %v", a, b, wa)
	}
	if !a.Range.End.Equal(open.Add(3 * time.Hour)) {
		t.Fatalf("permit validity %v", a.Range.End)
	}
	// The last tick's wake is the window's end, then the next opening.
	_, w := s.At(open.Add(3*time.Hour-time.Second), time.Minute)
	if !w.Equal(open.Add(3 * time.Hour)) {
		t.Fatalf("last wake %v", w)
	}
	tick, w = s.At(open.Add(3*time.Hour), time.Minute)
	if tick != nil || !w.Equal(open.Add(24*time.Hour)) {
		t.Fatalf("at the end: %v %v", tick, w)
	}
}

func TestNoWindowsNoTicks(t *testing.T) {
	tick, wake := Schedule{}.At(time.Now(), time.Minute)
	if tick != nil || !wake.After(time.Now()) {
		t.Fatalf("empty schedule: %v %v", tick, wake)
	}
}
