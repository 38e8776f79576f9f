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
	// Last is the newest record; a replica's answer that settles says
	// so may come before the stream leader's (see *bus.LeaseRecords).
	Last(ctx context.Context, settles func(rec events.LeaseRecord, seq uint64) bool) (rec events.LeaseRecord, seq uint64, found bool, err error)
}

// keepTerms is how many verified terms are remembered: one per leader
// change, so a handful covers commands still in flight across a handover.
const keepTerms = 8

// readAttempt bounds one read of the lease's records. A direct get goes to
// any replica of the command stream, and one on a server just cut off (not
// yet known to be gone) never answers: waiting out the client's 5 s there
// made a failover's first claim "stale" and cost a claim timeout (seen in
// the colocated chaos). Both reads ask the stream's leader at the same
// time, which covers that replica. Another request is routed afresh, so
// reads are retried until the caller's context ends (the command's
// deadline).
const readAttempt = 400 * time.Millisecond

// hedgeAfter is how long a read may go unanswered before the same read is
// sent again beside it, at most maxInFlight at once: one abandoned only
// after readAttempt cost a failover's first claim two of them (0.8 s) in
// the colocated chaos, when two direct gets in a row met the replica on the
// host just cut off. A replica that answers does so in milliseconds.
const (
	hedgeAfter  = 100 * time.Millisecond
	maxInFlight = 3
)

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
	type at struct {
		rec   events.LeaseRecord
		found bool
	}
	got, err := hedgedRead(ctx, func(ctx context.Context) (at, error) {
		rec, found, err := t.rec.At(ctx, epoch)
		return at{rec, found}, err
	})
	if err != nil {
		return fmt.Errorf("check epoch %d: %w", epoch, err)
	}
	if got.found && got.rec.Term(epoch) == epoch {
		t.remember(epoch)
		return nil
	}
	type last struct {
		rec   events.LeaseRecord
		seq   uint64
		found bool
	}
	cur, err := hedgedRead(ctx, func(ctx context.Context) (last, error) {
		// A renewal in the epoch's term proves the term, even from a
		// replica that is behind: the term existed.
		rec, seq, found, err := t.rec.Last(ctx, func(r events.LeaseRecord, seq uint64) bool { return r.Term(seq) == epoch })
		return last{rec, seq, found}, err
	})
	if err != nil {
		return fmt.Errorf("check epoch %d: %w", epoch, err)
	}
	if cur.found && cur.rec.Term(cur.seq) == epoch {
		t.remember(epoch)
		return nil
	}
	if cur.found {
		return fmt.Errorf("%w: no lease record starts term %d, and the current lease is term %d", ErrNoTerm, epoch, cur.rec.Term(cur.seq))
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

// hedgedRead runs read, each attempt bounded by readAttempt, and sends it
// again beside any still unanswered every hedgeAfter (at most maxInFlight
// at once) and after every failure (pausing a little once none is left in
// flight), until one succeeds or ctx ends; it returns the first answer, or
// the last error. Attempts still in flight when it returns are cancelled.
func hedgedRead[T any](ctx context.Context, read func(context.Context) (T, error)) (T, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type answer struct {
		v   T
		err error
	}
	// Room for every attempt that can be in flight when this returns, so
	// none of them blocks on its answer.
	answers := make(chan answer, maxInFlight)
	inFlight := 0
	launch := func() {
		inFlight++
		go func() {
			actx, cancel := context.WithTimeout(ctx, readAttempt)
			defer cancel()
			v, err := read(actx)
			answers <- answer{v, err}
		}()
	}
	var zero T
	var lastErr error
	pause := 25 * time.Millisecond
	hedge := time.NewTicker(hedgeAfter)
	defer hedge.Stop()
	launch()
	for {
		select {
		case a := <-answers:
			inFlight--
			if a.err == nil {
				return a.v, nil
			}
			lastErr = a.err
			if ctx.Err() != nil {
				return zero, lastErr
			}
			if inFlight == 0 {
				select {
				case <-ctx.Done():
					return zero, lastErr
				case <-time.After(pause):
				}
				pause = min(2*pause, 200*time.Millisecond)
				launch()
				hedge.Reset(hedgeAfter)
			}
		case <-hedge.C:
			if inFlight < maxInFlight {
				launch()
			}
		case <-ctx.Done():
			if lastErr == nil {
				lastErr = ctx.Err()
			}
			return zero, lastErr
		}
	}
}
