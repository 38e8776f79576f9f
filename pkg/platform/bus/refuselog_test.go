package bus

import (
	"testing"
	"time"
)

// TestRefusalLogIsRationed: a flood of refusals logs a burst, then one line
// a second carrying how many were left out; another reason has lines of
// its own; a quiet spell gives the burst back.
func TestRefusalLogIsRationed(t *testing.T) {
	now := time.Unix(1000, 0)
	l := refusalLog{now: func() time.Time { return now }}
	logged := 0
	for range 1000 {
		if ok, _ := l.allow("undecodable"); ok {
			logged++
		}
	}
	if logged != refusalBurst {
		t.Fatalf("a flood of 1000 logged %d lines, want the burst of %d", logged, refusalBurst)
	}
	if ok, _ := l.allow("subject_mismatch"); !ok {
		t.Fatal("another reason was silenced by the flood")
	}
	now = now.Add(refusalEvery)
	ok, left := l.allow("undecodable")
	if !ok || left != 1000-refusalBurst {
		t.Fatalf("a second later: logged %v, %d left out, want true and %d", ok, left, 1000-refusalBurst)
	}
	if ok, _ := l.allow("undecodable"); ok {
		t.Fatal("two lines in the same second after the burst")
	}
	now = now.Add(time.Hour)
	logged = 0
	for range refusalBurst + 5 {
		if ok, _ := l.allow("undecodable"); ok {
			logged++
		}
	}
	if logged != refusalBurst {
		t.Fatalf("after a quiet hour %d lines, want the burst of %d again", logged, refusalBurst)
	}
}
