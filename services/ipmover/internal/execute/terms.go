package execute

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/fanpbx/fan/pkg/events"
)

// ErrNoTerm refuses an epoch that is not a lease term that exists.
var ErrNoTerm = errors.New("epoch is not a lease term")

// LeaseRecords reads the lease's records in the command stream
// (*bus.LeaseRecords).
type LeaseRecords interface {
	At(ctx context.Context, seq uint64) (rec events.LeaseRecord, found bool, err error)
	Last(ctx context.Context) (rec events.LeaseRecord, seq uint64, found bool, err error)
}

// keepTerms is how many verified terms are remembered: one per leader
// change, so a handful covers commands still in flight across a handover.
const keepTerms = 8

// readAttempt bounds one read of the lease's records. A direct get goes to
// any replica of the command stream, and one on a server just cut off (not
// yet known to be gone) never answers: waiting out the client's 5 s there
// made a failover's first claim "stale" and cost a claim timeout (seen in
// the colocated chaos). Another request is routed afresh, so reads are
// retried until the caller's context ends (the command's deadline).
const readAttempt = 400 * time.Millisecond

// LeaseTerms checks epochs against the arbiter lease's records. The lease
// lives in the command stream and a term is the sequence of the record that
// started it, so a command's epoch is a term only if
//   - it is below the command's own sequence (nobody can publish a command
//     under a term that starts after it; this bounds any forged epoch by
//     the stream's length, so 2^64-1 is impossible), and
//   - the record at that sequence is on the lease subject and starts a term,
//     or, once it has expired (records carry the lease TTL), the lease's
//     newest record is a renewal in that term.
//
// A term that has ended and whose records are gone is refused: the arbiter
// fences its commands on the server, so a command of a past term that is
// still undelivered is stale anyway.
//
// Verified terms are cached, so the check costs a read only at the first
// command of a term.
type LeaseTerms struct {
	rec LeaseRecords

	mu    sync.Mutex
	known []uint64
}

// NewLeaseTerms checks terms against rec.
func NewLeaseTerms(rec LeaseRecords) *LeaseTerms { return &LeaseTerms{rec: rec} }

// Check implements Terms.
func (t *LeaseTerms) Check(ctx context.Context, epoch, seq uint64) error {
	switch {
	case epoch == 0:
		return fmt.Errorf("%w: the command carries no epoch", ErrNoTerm)
	case seq == 0:
		return fmt.Errorf("%w: the command's stream sequence is unknown, so epoch %d cannot be checked", ErrNoTerm, epoch)
	case epoch >= seq:
		return fmt.Errorf("%w: epoch %d is not below the command's sequence %d, and no term starts after its commands", ErrNoTerm, epoch, seq)
	}
	t.mu.Lock()
	ok := slices.Contains(t.known, epoch)
	t.mu.Unlock()
	if ok {
		return nil
	}
	var (
		rec   events.LeaseRecord
		found bool
	)
	err := retryRead(ctx, func(ctx context.Context) (err error) {
		rec, found, err = t.rec.At(ctx, epoch)
		return err
	})
	if err != nil {
		return fmt.Errorf("check epoch %d: %w", epoch, err)
	}
	if found && rec.Term(epoch) == epoch {
		t.remember(epoch)
		return nil
	}
	var (
		last    events.LeaseRecord
		lastSeq uint64
	)
	err = retryRead(ctx, func(ctx context.Context) (err error) {
		last, lastSeq, found, err = t.rec.Last(ctx)
		return err
	})
	if err != nil {
		return fmt.Errorf("check epoch %d: %w", epoch, err)
	}
	if found && last.Term(lastSeq) == epoch {
		t.remember(epoch)
		return nil
	}
	if found {
		return fmt.Errorf("%w: no lease record starts term %d, and the current lease is term %d", ErrNoTerm, epoch, last.Term(lastSeq))
	}
	return fmt.Errorf("%w: no lease record starts term %d, and no lease is held", ErrNoTerm, epoch)
}

func (t *LeaseTerms) remember(epoch uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if slices.Contains(t.known, epoch) {
		return
	}
	t.known = append(t.known, epoch)
	if over := len(t.known) - keepTerms; over > 0 {
		t.known = slices.Delete(t.known, 0, over)
	}
}

// retryRead runs read with a readAttempt bound each time until it succeeds
// or ctx ends, pausing a little between attempts; it returns the last error.
func retryRead(ctx context.Context, read func(context.Context) error) error {
	pause := 25 * time.Millisecond
	for {
		actx, cancel := context.WithTimeout(ctx, readAttempt)
		err := read(actx)
		cancel()
		if err == nil || ctx.Err() != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(pause):
		}
		pause = min(2*pause, 200*time.Millisecond)
	}
}
