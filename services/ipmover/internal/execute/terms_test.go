package execute

import (
	"context"
	"errors"
	"testing"

	"github.com/fanpbx/fan/pkg/events"
)

// records is a lease's records by sequence, for the pure checks.
type records struct {
	at    map[uint64]events.LeaseRecord
	reads int
}

func (r *records) At(_ context.Context, seq uint64) (events.LeaseRecord, bool, error) {
	r.reads++
	rec, ok := r.at[seq]
	return rec, ok, nil
}

func (r *records) Last(context.Context) (events.LeaseRecord, uint64, bool, error) {
	r.reads++
	var last uint64
	for s := range r.at {
		last = max(last, s)
	}
	rec, ok := r.at[last]
	return rec, last, ok, nil
}

func TestLeaseTerms(t *testing.T) {
	// Term 10 started at 10 and was renewed at 14; term 20 started at 20
	// and its first record expired, renewed at 25.
	recs := &records{at: map[uint64]events.LeaseRecord{
		10: {Holder: "a"}, 14: {Holder: "a", Epoch: 10}, 25: {Holder: "b", Epoch: 20},
	}}
	terms := NewLeaseTerms(recs)
	for _, tc := range []struct {
		name       string
		epoch, seq uint64
		ok         bool
	}{
		{"starting record present", 10, 30, true},
		{"start expired, current renewal names it", 20, 30, true},
		{"a renewal's sequence is no term", 14, 30, false},
		{"no record at all", 12, 30, false},
		{"zero", 0, 30, false},
		{"at the command's own sequence", 30, 30, false},
		{"above it", 1 << 63, 30, false},
		{"unknown sequence", 10, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := terms.Check(t.Context(), tc.epoch, tc.seq)
			if tc.ok && err != nil {
				t.Fatalf("refused: %v", err)
			}
			if !tc.ok && !errors.Is(err, ErrNoTerm) {
				t.Fatalf("got %v, want ErrNoTerm", err)
			}
		})
	}
	// Known terms cost nothing.
	before := recs.reads
	for range 100 {
		if err := terms.Check(t.Context(), 20, 40); err != nil {
			t.Fatal(err)
		}
	}
	if recs.reads != before {
		t.Errorf("%d reads for a known term", recs.reads-before)
	}
}
