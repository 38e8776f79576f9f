package execute

import (
	"context"
	"errors"
	"testing"
	"time"

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

// hangingRecords never answers its first hangs reads (a direct get routed
// to a replica that was just cut off), then answers from recs.
type hangingRecords struct {
	records
	hangs int
}

func (r *hangingRecords) At(ctx context.Context, seq uint64) (events.LeaseRecord, bool, error) {
	if r.hangs > 0 {
		r.hangs--
		<-ctx.Done()
		return events.LeaseRecord{}, false, ctx.Err()
	}
	return r.records.At(ctx, seq)
}

// A read that hangs is abandoned after readAttempt and asked again, so a
// failover's first claim is checked in about a second instead of being
// refused as stale after the client's 5 s; a read that never answers is
// bounded by the caller's context (the command's deadline).
func TestLeaseTermsRetriesAHungRead(t *testing.T) {
	recs := &hangingRecords{records: records{at: map[uint64]events.LeaseRecord{65: {Holder: "ctl"}}}, hangs: 1}
	start := time.Now()
	if err := NewLeaseTerms(recs).Check(t.Context(), 65, 70); err != nil {
		t.Fatalf("refused after one hung read: %v", err)
	}
	if d := time.Since(start); d < readAttempt || d > readAttempt+time.Second {
		t.Errorf("checked in %v, want one abandoned attempt (%v) and an answer", d, readAttempt)
	}
	never := &hangingRecords{records: records{at: recs.at}, hangs: 1 << 30}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	start = time.Now()
	err := NewLeaseTerms(never).Check(ctx, 65, 70)
	if err == nil || errors.Is(err, ErrNoTerm) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("never answered: %v, want the deadline (not a verdict on the term)", err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("gave up after %v, want at the caller's deadline (2s)", d)
	}
	if never.reads != 0 || never.hangs > 1<<30-2 {
		t.Errorf("attempts: %d hung reads, want at least two", 1<<30-never.hangs)
	}
}
