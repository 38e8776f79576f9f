package health

import (
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/events"
)

func TestRiseAndFallExactly(t *testing.T) {
	const U, D, N = events.HealthUp, events.HealthDown, events.Health("")
	cases := []struct {
		name       string
		rise, fall int
		results    string // 1 = ok, 0 = fail
		want       []events.Health
	}{
		{"comes up after rise", 2, 3, "11", []events.Health{N, U}},
		{"one blip never goes down", 2, 3, "110110110", []events.Health{N, U, N, N, N, N, N, N, N}},
		{"goes down after fall", 2, 3, "11000", []events.Health{N, U, N, N, D}},
		{"starts down from unknown", 2, 3, "000", []events.Health{N, N, D}},
		{"flapping follows rise and fall", 2, 2, "1100110011", []events.Health{N, U, N, D, N, U, N, D, N, U}},
		{"rise 1 fall 1", 1, 1, "1010", []events.Health{U, D, U, D}},
		{"recovery needs rise in a row", 3, 1, "0110111", []events.Health{D, N, N, N, N, N, U}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tr := New(tc.rise, tc.fall)
			for i, r := range tc.results {
				got, ok := tr.Observe(events.Evidence{At: time.Unix(int64(i), 0), OK: r == '1'})
				if !ok {
					got.To = N
				}
				if got.To != tc.want[i] {
					t.Fatalf("result %d (%c): transition to %q, want %q", i, r, got.To, tc.want[i])
				}
				if ok {
					need := tc.fall
					if got.To == U {
						need = tc.rise
					}
					if len(got.Evidence) != need || got.Consecutive != need {
						t.Fatalf("transition carries %d results (consecutive %d), want %d", len(got.Evidence), got.Consecutive, need)
					}
					for _, e := range got.Evidence {
						if e.OK != (got.To == U) {
							t.Fatalf("evidence %+v contradicts the transition to %s", e, got.To)
						}
					}
				}
			}
		})
	}
}
