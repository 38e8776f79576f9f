package replay

import (
	"fmt"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/events"
)

func TestSameButTimes(t *testing.T) {
	for _, c := range []struct {
		a, b string
		want bool
	}{
		{"healthy for 1s (healthy since 2026-12-01T18:20:47Z)", "healthy for 2s (healthy since 2026-12-01T18:20:46Z)", true},
		{"healthy for 1s", "healthy for 3s", false},                                           // beyond the tolerance
		{"until 2026-12-01T18:20:48Z", "until 2026-12-01T19:20:47Z", false},                   // a different hold-down
		{"claim on n1 not confirmed within 3s", "claim on n2 not confirmed within 3s", false}, // not a time
		{"waits 10m", "waits 10m0.5s", true},
		{"3 consecutive", "4 consecutive", false},
	} {
		if got, _ := sameButTimes(c.a, c.b, time.Second); got != c.want {
			t.Errorf("sameButTimes(%q, %q) = %v, want %v", c.a, c.b, got, c.want)
		}
	}
}

// From an arbiter start, the replay feeds what the arbiter's watch read:
// in each stream, everything from the first input stored at or after the
// announcement's time, wherever the producers' stamps place it in the
// trail; without stored times, what comes after the announcement.
func TestReadFrom(t *testing.T) {
	at := time.Date(2026, 12, 1, 21, 0, 0, 0, time.UTC)
	ms := func(n int) time.Time { return at.Add(time.Duration(n) * time.Millisecond) }
	hb := func(stamp, stored int) Record {
		return Record{Env: events.Envelope{Type: events.TypeNodeHeartbeat, Time: ms(stamp)}, Payload: &events.NodeHeartbeat{}, Stored: ms(stored)}
	}
	res := func(stamp, stored int) Record {
		return Record{Env: events.Envelope{Type: events.TypeCommandResult, Time: ms(stamp)}, Payload: &events.CommandResult{}, Stored: ms(stored)}
	}
	ann := Record{Env: events.Envelope{Type: events.TypeServiceAnnounce, Time: at}, Payload: &events.ServiceAnnounce{}, Stored: ms(1)}
	trail := []Record{
		hb(-300, -299),  // 0: before the start: not read
		res(-200, -199), // 1: not read
		hb(-2, 3),       // 2: stamped before the announcement, stored after it: read
		ann,             // 3
		res(-1, 5),      // 4: read
		hb(100, 101),    // 5: read
	}
	read := readFrom(trail, at, 3)
	var got []int
	for i := range trail {
		if read(i) {
			got = append(got, i)
		}
	}
	if fmt.Sprint(got) != "[2 4 5]" {
		t.Fatalf("read %v, want [2 4 5]", got)
	}
	for i := range trail {
		trail[i].Stored = time.Time{}
	}
	read = readFrom(trail, at, 3)
	got = nil
	for i := range trail {
		if read(i) {
			got = append(got, i)
		}
	}
	if fmt.Sprint(got) != "[4 5]" {
		t.Fatalf("without stored times read %v, want [4 5]", got)
	}
}
