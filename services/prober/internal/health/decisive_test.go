package health

import (
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/events"
)

func TestDecisiveIsTheRunThatWouldBringTheCheckDown(t *testing.T) {
	cases := []struct {
		name       string
		rise, fall int
		results    string // 1 = ok, 0 = fail
		want       string // after each result: d = the next run decides, . = it does not
	}{
		{"fall 3: after two failures in a row", 2, 3, "11001000", "...d..d."},
		{"down: nothing left to decide", 2, 3, "110000", "...d.."},
		{"fall 2: after one failure", 1, 2, "1010", ".d.d"},
		{"fall 1: no run has a failure behind it", 1, 1, "1010", "...."},
		{"from unknown, as from up", 2, 3, "00", ".d"},
		{"a success starts again", 2, 3, "1001001", "..d..d."},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tr := New(tc.rise, tc.fall)
			if tr.Decisive() {
				t.Fatal("a fresh tracker is decisive")
			}
			for i, r := range tc.results {
				tr.Observe(events.Evidence{At: time.Unix(int64(i), 0), OK: r == '1'})
				if got := tr.Decisive(); got != (tc.want[i] == 'd') {
					t.Fatalf("after result %d (%c): decisive %v, want %c", i, r, got, tc.want[i])
				}
			}
		})
	}
}

func TestRoundTripsWait(t *testing.T) {
	const ms = time.Millisecond
	const margin, most = 10 * ms, 40 * ms
	steady := func(d time.Duration, n int) *RoundTrips {
		var r RoundTrips
		for range n {
			r.Observe(d)
		}
		return &r
	}
	cases := []struct {
		name string
		rt   *RoundTrips
		want func(time.Duration) bool
		says string
	}{
		{"nothing seen waits the timeout", &RoundTrips{}, func(w time.Duration) bool { return w == most }, "== timeout"},
		{"a quiet LAN waits about the margin", steady(300*time.Microsecond, 50),
			func(w time.Duration) bool { return w >= margin && w < margin+ms }, "margin + the round trip"},
		{"a steady slow target gets its round trip plus the margin", steady(20*ms, 50),
			func(w time.Duration) bool { return w >= 30*ms && w < 31*ms }, "about 30ms"},
		{"never past the timeout", steady(35*ms, 50), func(w time.Duration) bool { return w == most }, "== timeout"},
		{"one slow answer after quiet ones raises it at once", func() *RoundTrips {
			r := steady(300*time.Microsecond, 50)
			r.Observe(8 * ms)
			return r
		}(), func(w time.Duration) bool { return w > 8*ms }, "above the slow answer"},
		{"one slower answer than the margin covers raises it past itself", func() *RoundTrips {
			r := steady(300*time.Microsecond, 50)
			r.Observe(30 * ms)
			return r
		}(), func(w time.Duration) bool { return w > 30*ms }, "above the slow answer"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if w := tc.rt.Wait(margin, most); !tc.want(w) {
				t.Fatalf("wait %v, want %s", w, tc.says)
			}
		})
	}
}

func TestRoundTripsForgetASlowSpellGradually(t *testing.T) {
	var r RoundTrips
	for range 20 {
		r.Observe(300 * time.Microsecond)
	}
	quiet := r.Wait(time.Millisecond, time.Second)
	r.Observe(30 * time.Millisecond)
	after := []time.Duration{r.Wait(time.Millisecond, time.Second)}
	for range 10 {
		r.Observe(300 * time.Microsecond)
		after = append(after, r.Wait(time.Millisecond, time.Second))
	}
	for i := 1; i < len(after); i++ {
		if after[i] > after[i-1] {
			t.Fatalf("waits after the slow answer %v: not falling", after)
		}
	}
	if after[5] < 5*quiet {
		t.Fatalf("five quiet answers after a 30 ms one already wait %v (quiet: %v): forgotten too fast", after[5], quiet)
	}
	if after[10] >= after[0]/2 {
		t.Fatalf("ten quiet answers later still %v of %v: never forgets", after[10], after[0])
	}
}
