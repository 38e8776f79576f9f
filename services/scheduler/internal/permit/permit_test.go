package permit

import (
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/google/uuid"
)

func TestIDIsADeterministicUUIDv7(t *testing.T) {
	tick := time.Date(2026, 12, 1, 1, 0, 0, 0, time.UTC)
	a := ID("lab", "pbx", "nightly", tick)
	if a != ID("lab", "pbx", "nightly", tick.In(time.FixedZone("x", 3600))) {
		t.Fatal("same tick in another zone gave another id")
	}
	u, err := uuid.Parse(a)
	if err != nil || u.Version() != 7 || u.Variant() != uuid.RFC4122 {
		t.Fatalf("%s: not a UUID v7 (%v)", a, err)
	}
	sec, nsec := u.Time().UnixTime()
	if got := time.Unix(sec, nsec); !got.Equal(tick) {
		t.Fatalf("timestamp %v, want the tick %v", got, tick)
	}
	seen := map[string]bool{a: true}
	for _, other := range []string{
		ID("lab2", "pbx", "nightly", tick), ID("lab", "pbx2", "nightly", tick), ID("lab", "pbx", "weekly", tick),
		ID("lab", "pbx", "nightly", tick.Add(time.Millisecond)),
	} {
		if seen[other] {
			t.Fatalf("collision: %s", other)
		}
		seen[other] = true
	}
	// The envelope accepts it as an id.
	if _, err := events.New(events.Source{Service: "scheduler", Node: "ctl"}, "lab",
		events.FailbackPermit{Group: "pbx", Window: "nightly", ValidFrom: tick, ValidUntil: tick.Add(time.Hour)}, events.WithID(a)); err != nil {
		t.Fatal(err)
	}
}
