package execute

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

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
	rec, found, err := t.rec.At(ctx, epoch)
	if err != nil {
		return fmt.Errorf("check epoch %d: %w", epoch, err)
	}
	if found && rec.Term(epoch) == epoch {
		t.remember(epoch)
		return nil
	}
	last, lastSeq, found, err := t.rec.Last(ctx)
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
