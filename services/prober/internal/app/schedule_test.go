package app

import (
	"testing"
	"time"
)

func TestScheduleKeepsPeriodAndSlots(t *testing.T) {
	s := newSchedule(200*time.Millisecond, 40*time.Millisecond)
	if s.slot != 10*time.Millisecond {
		t.Fatalf("slot %v, want 10ms", s.slot)
	}
	base := s.base
	for range 1000 {
		d := s.due()
		if off := d.Sub(epoch) % s.slot; off != 0 {
			t.Fatalf("due %v is %v off the slot grid", d, off)
		}
		if late := d.Sub(s.base); late < 0 || late >= 40*time.Millisecond+s.slot {
			t.Fatalf("due %v after its turn, want within jitter + one slot", late)
		}
	}
	s.next()
	if got := s.base.Sub(base); got != 200*time.Millisecond {
		t.Fatalf("next turn %v later, want one interval", got)
	}
	if small := newSchedule(50*time.Millisecond, 0); small.slot != 50*time.Millisecond/16 {
		t.Fatalf("slot %v for a 50ms interval, want 1/16 of it", small.slot)
	}
}

// A run that ended after the next turn began is followed at once by that
// turn (as a ticker would); turns missed entirely are skipped.
func TestScheduleLateTurns(t *testing.T) {
	s := newSchedule(100*time.Millisecond, 0)
	s.base = time.Now().Add(-150 * time.Millisecond) // the turn that just ran
	s.next()
	if late := time.Since(s.base); late < 40*time.Millisecond || late >= 100*time.Millisecond {
		t.Fatalf("the turn already begun should run now, base %v ago", late)
	}
	s.base = time.Now().Add(-1050 * time.Millisecond)
	s.next()
	if late := time.Since(s.base); late < 0 || late >= 100*time.Millisecond {
		t.Fatalf("missed turns should be skipped, base %v ago", late)
	}
}
