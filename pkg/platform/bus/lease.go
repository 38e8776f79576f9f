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
// otherwise the stream API's message get: either way one request. At also
// asks the stream's leader at the same time (see At).
type LeaseRecords struct {
	stream  jetstream.Stream
	nc      *nats.Conn
	subject string
	// directGet is stream.GetMsg; a test puts a silent or lagging replica
	// in its place.
	directGet func(ctx context.Context, seq uint64, opts ...jetstream.GetMsgOpt) (*jetstream.RawStreamMsg, error)
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
	return &LeaseRecords{stream: s, nc: b.NC, subject: events.LeaseSubject(b.id.Cluster, name), directGet: s.GetMsg}, nil
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
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type answer struct {
		rec    events.LeaseRecord
		found  bool
		err    error
		leader bool
	}
	answers := make(chan answer, 2)
	go func() {
		m, err := l.directGet(ctx, seq)
		a := answer{err: err}
		switch {
		case errors.Is(err, jetstream.ErrMsgNotFound):
			a.err = nil
		case err == nil:
			a.rec, a.found = l.record(m.Subject, m.Sequence, seq, m.Data)
		}
		answers <- a
	}()
	go func() {
		m, err := leaderGet(ctx, l.nc, CommandsStream, leaderGetRequest{Seq: seq})
		a := answer{err: err, leader: true}
		if err == nil && m != nil {
			a.rec, a.found = l.record(m.Subject, m.Sequence, seq, m.Data)
		}
		answers <- a
	}()
	var notFound bool
	var errs []error
	for range 2 {
		a := <-answers
		switch {
		case a.err != nil:
			errs = append(errs, a.err)
		case a.found || a.leader:
			return a.rec, a.found, nil
		default:
			notFound = true
		}
	}
	if notFound {
		return events.LeaseRecord{}, false, nil
	}
	return events.LeaseRecord{}, false, fmt.Errorf("lease record %d: %w", seq, errors.Join(errs...))
}

// record decodes the message at seq if it is a record of this lease.
func (l *LeaseRecords) record(subject string, stored, seq uint64, data []byte) (events.LeaseRecord, bool) {
	if subject != l.subject || stored != seq {
		return events.LeaseRecord{}, false
	}
	rec, err := events.DecodeLeaseRecord(data, seq)
	if err != nil {
		return events.LeaseRecord{}, false // not a record fan wrote: no term
	}
	return rec, true
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

// Last returns the newest record on the lease subject and its sequence;
// found is false when there is none (no leader, or every record expired).
func (l *LeaseRecords) Last(ctx context.Context) (rec events.LeaseRecord, seq uint64, found bool, err error) {
	m, err := l.stream.GetLastMsgForSubject(ctx, l.subject)
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return events.LeaseRecord{}, 0, false, nil
	case err != nil:
		return events.LeaseRecord{}, 0, false, fmt.Errorf("last lease record: %w", err)
	}
	rec, err = events.DecodeLeaseRecord(m.Data, m.Sequence)
	if err != nil {
		return events.LeaseRecord{}, m.Sequence, false, nil
	}
	return rec, m.Sequence, true, nil
}
