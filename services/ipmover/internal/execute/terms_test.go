package execute

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/waittest"
)

// records is a lease's records by sequence, for the pure checks. Reads may
// come concurrently (hedged).
type records struct {
	mu    sync.Mutex
	at    map[uint64]events.LeaseRecord
	reads int
}

func (r *records) At(_ context.Context, seq uint64) (events.LeaseRecord, bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.reads++
	rec, ok := r.at[seq]
	return rec, ok, nil
}

func (r *records) Last(context.Context, func(events.LeaseRecord, uint64) bool) (events.LeaseRecord, uint64, bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
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
	hung  int // reads that hung
}

func (r *hangingRecords) At(ctx context.Context, seq uint64) (events.LeaseRecord, bool, error) {
	r.mu.Lock()
	hang := r.hangs > 0
	if hang {
		r.hangs--
		r.hung++
	}
	r.mu.Unlock()
	if hang {
		<-ctx.Done()
		return events.LeaseRecord{}, false, ctx.Err()
	}
	return r.records.At(ctx, seq)
}

// A read that hangs is asked again beside it after hedgeAfter, so a
// failover's first claim is checked in a fraction of a second instead of
// being refused as stale after the client's 5 s, or waiting out readAttempt
// once per hung read; a read that never answers is bounded by the caller's
// context (the command's deadline).
func TestLeaseTermsHedgesAHungRead(t *testing.T) {
	for hangs := 1; hangs <= 2; hangs++ {
		recs := &hangingRecords{records: records{at: map[uint64]events.LeaseRecord{65: {Holder: "ctl"}}}, hangs: hangs}
		start := time.Now()
		if err := NewLeaseTerms(recs).Check(t.Context(), 65, 70); err != nil {
			t.Fatalf("refused after %d hung reads: %v", hangs, err)
		}
		// The answer comes from the attempt sent hangs × hedgeAfter after
		// the first, while the hung ones are still waiting.
		if d := time.Since(start); d < time.Duration(hangs)*hedgeAfter || d >= readAttempt {
			t.Errorf("%d hung reads: checked in %v, want from %v and before one attempt's bound (%v)",
				hangs, d, time.Duration(hangs)*hedgeAfter, readAttempt)
		}
	}
	never := &hangingRecords{records: records{at: map[uint64]events.LeaseRecord{65: {Holder: "ctl"}}}, hangs: 1 << 30}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	start := time.Now()
	err := NewLeaseTerms(never).Check(ctx, 65, 70)
	if err == nil || errors.Is(err, ErrNoTerm) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("never answered: %v, want the deadline (not a verdict on the term)", err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("gave up after %v, want at the caller's deadline (2s)", d)
	}
	never.mu.Lock()
	defer never.mu.Unlock()
	// Attempts: a new one every hedgeAfter while fewer than maxInFlight
	// wait, each abandoned after readAttempt: well over maxInFlight in 2 s.
	if never.reads != 0 || never.hung <= maxInFlight {
		t.Errorf("attempts: %d hung reads (%d answered), want more than %d", never.hung, never.reads, maxInFlight)
	}
}

// TestHedgedReadKeepsAtMostMaxInFlight: hung reads never pile up beyond
// maxInFlight, and the attempts still in flight when the read returns are
// cancelled, so a Check leaves nothing waiting behind it.
func TestHedgedReadKeepsAtMostMaxInFlight(t *testing.T) {
	var mu sync.Mutex
	inFlight, most, started := 0, 0, 0
	ctx, cancel := context.WithTimeout(t.Context(), 900*time.Millisecond)
	defer cancel()
	_, err := hedgedRead(ctx, func(ctx context.Context) (int, error) {
		mu.Lock()
		inFlight++
		started++
		most = max(most, inFlight)
		mu.Unlock()
		<-ctx.Done()
		mu.Lock()
		inFlight--
		mu.Unlock()
		return 0, ctx.Err()
	})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("hedgedRead = %v, want the deadline", err)
	}
	waittest.Succeeds(t, time.Second, "every attempt finished after the read returned", func() error {
		mu.Lock()
		defer mu.Unlock()
		if inFlight != 0 {
			return fmt.Errorf("%d attempts still waiting", inFlight)
		}
		return nil
	})
	mu.Lock()
	defer mu.Unlock()
	if most != maxInFlight || started <= maxInFlight {
		t.Errorf("at most %d in flight of %d started, want %d at most and more started over 900 ms", most, started, maxInFlight)
	}
}
