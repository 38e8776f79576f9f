package bus

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fanpbx/fan/pkg/events"
)

// LeaseRecords reads one lease's records from the command stream. Reads are
// direct gets when the stream allows them (provisioning sets allow_direct),
// otherwise the stream API's message get: either way one request. At and
// Last also ask the stream's leader at the same time (see At).
type LeaseRecords struct {
	stream  jetstream.Stream
	nc      *nats.Conn
	subject string
	// replica answers the direct gets: the stream itself, or in a test a
	// replica that is silent or behind.
	replica replica
}

// replica is the part of jetstream.Stream that At and Last read through.
type replica interface {
	GetMsg(ctx context.Context, seq uint64, opts ...jetstream.GetMsgOpt) (*jetstream.RawStreamMsg, error)
	GetLastMsgForSubject(ctx context.Context, subject string) (*jetstream.RawStreamMsg, error)
}

// LeaseRecords opens the records of the lease named name (events.ArbiterLease)
// in this bus's cluster.
func (b *Bus) LeaseRecords(ctx context.Context, name string) (*LeaseRecords, error) {
	var s jetstream.Stream
	err := retry(ctx, b, "lease records", func(ctx context.Context) error {
		var err error
		s, err = b.JS.Stream(ctx, CommandsStream)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", CommandsStream, err)
	}
	return &LeaseRecords{stream: s, nc: b.NC, subject: events.LeaseSubject(b.id.Cluster, name), replica: s}, nil
}

// leaseRead is one answer to a read of the lease's records.
type leaseRead struct {
	rec   events.LeaseRecord
	seq   uint64
	found bool
}

// At returns the lease record stored at seq; found is false when the message
// at seq is gone (expired) or is not on the lease subject.
//
// It sends a direct get and a get through the stream's leader at once. The
// direct get may go to any replica, and one on a host just cut off (not
// yet known to be gone) never answers: an executor checking a new term's
// first command, the claim of the failover that very cut called for, lost
// 200 to 500 ms to it in the colocated chaos, one 100 ms hedge after
// another. The leader answers for every replica. A record found is final
// whoever found it (the message at a sequence never changes); "not found"
// from a replica may only be a replica behind, so it waits for the
// leader's word until the leader fails or ctx ends.
func (l *LeaseRecords) At(ctx context.Context, seq uint64) (rec events.LeaseRecord, found bool, err error) {
	got, err := l.read(ctx, leaderGetRequest{Seq: seq},
		func(ctx context.Context) (*jetstream.RawStreamMsg, error) { return l.replica.GetMsg(ctx, seq) },
		func(r leaseRead) bool { return r.found })
	if err != nil {
		return events.LeaseRecord{}, false, fmt.Errorf("lease record %d: %w", seq, err)
	}
	return got.rec, got.found, nil
}

// Last returns the newest record on the lease subject and its sequence;
// found is false when there is none (no leader, or every record expired).
//
// Like At it asks a replica directly and the stream's leader at once, for
// the same reason: an executor checking a command of a term whose first
// record has expired (any term older than the lease's TTL) reads the
// newest record, on the failover's path. Only the leader's answer is surely
// the newest, since a replica may be behind; a replica's answer is taken
// first when settles says it answers the caller's question anyway (nil:
// never), else only once the leader has failed.
func (l *LeaseRecords) Last(ctx context.Context, settles func(rec events.LeaseRecord, seq uint64) bool) (rec events.LeaseRecord, seq uint64, found bool, err error) {
	got, err := l.read(ctx, leaderGetRequest{LastBySubject: l.subject},
		func(ctx context.Context) (*jetstream.RawStreamMsg, error) {
			return l.replica.GetLastMsgForSubject(ctx, l.subject)
		},
		func(r leaseRead) bool { return r.found && settles != nil && settles(r.rec, r.seq) })
	if err != nil {
		return events.LeaseRecord{}, 0, false, fmt.Errorf("last lease record: %w", err)
	}
	return got.rec, got.seq, got.found, nil
}

// read asks for one message of the lease both ways at once (askBoth):
// directly, and through the stream's leader with req. A message that is
// gone, or is not the lease's, reads as not found.
func (l *LeaseRecords) read(ctx context.Context, req leaderGetRequest, direct func(context.Context) (*jetstream.RawStreamMsg, error), final func(leaseRead) bool) (leaseRead, error) {
	return askBoth(ctx,
		func(ctx context.Context) (leaseRead, error) {
			m, err := direct(ctx)
			if errors.Is(err, jetstream.ErrMsgNotFound) {
				return leaseRead{}, nil
			}
			if err != nil {
				return leaseRead{}, err
			}
			return l.record(m.Subject, m.Sequence, req.Seq, m.Data), nil
		},
		func(ctx context.Context) (leaseRead, error) {
			m, err := leaderGet(ctx, l.nc, CommandsStream, req)
			if err != nil || m == nil {
				return leaseRead{}, err
			}
			return l.record(m.Subject, m.Sequence, req.Seq, m.Data), nil
		},
		final)
}

// askBoth runs a direct read and the same read through the leader at once.
// The leader's answer is final. The direct one is returned first when final
// says it is, and otherwise stands only if the leader fails; the error is
// both reads' when both fail.
func askBoth[T any](ctx context.Context, direct, leader func(context.Context) (T, error), final func(T) bool) (T, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type answer struct {
		v      T
		err    error
		leader bool
	}
	answers := make(chan answer, 2)
	go func() {
		v, err := direct(ctx)
		answers <- answer{v: v, err: err}
	}()
	go func() {
		v, err := leader(ctx)
		answers <- answer{v: v, err: err, leader: true}
	}()
	var (
		zero, held T
		haveHeld   bool
		errs       []error
	)
	for range 2 {
		a := <-answers
		switch {
		case a.err != nil:
			errs = append(errs, a.err)
		case a.leader || final(a.v):
			return a.v, nil
		default:
			held, haveHeld = a.v, true
		}
	}
	if haveHeld {
		return held, nil
	}
	return zero, errors.Join(errs...)
}

// record decodes the message stored at seq if it is a record of this
// lease; want is the sequence asked for (0: the newest, wherever it is).
func (l *LeaseRecords) record(subject string, seq, want uint64, data []byte) leaseRead {
	if subject != l.subject || (want != 0 && seq != want) {
		return leaseRead{}
	}
	rec, err := events.DecodeLeaseRecord(data, seq)
	if err != nil {
		return leaseRead{seq: seq} // not a record fan wrote: no term
	}
	return leaseRead{rec: rec, seq: seq, found: true}
}

// StoredAt returns when the message at seq was stored, if it is still
// stored and is on the lease subject.
func (l *LeaseRecords) StoredAt(ctx context.Context, seq uint64) (stored time.Time, found bool, err error) {
	m, err := l.stream.GetMsg(ctx, seq)
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return time.Time{}, false, nil
	case err != nil:
		return time.Time{}, false, fmt.Errorf("lease record %d: %w", seq, err)
	case m.Subject != l.subject || m.Sequence != seq:
		return time.Time{}, false, nil
	}
	return m.Time, true, nil
}

// LastStored returns the sequence and the server's storage time of the
// newest message on the lease subject, whatever it holds.
func (l *LeaseRecords) LastStored(ctx context.Context) (seq uint64, stored time.Time, found bool, err error) {
	m, err := l.stream.GetLastMsgForSubject(ctx, l.subject)
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return 0, time.Time{}, false, nil
	case err != nil:
		return 0, time.Time{}, false, fmt.Errorf("last lease record: %w", err)
	}
	return m.Sequence, m.Time, true, nil
}
