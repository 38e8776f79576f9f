package bus

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fanpbx/fan/pkg/events"
)

// LeaseRecords reads one lease's records from the command stream. Reads are
// direct gets when the stream allows them (provisioning sets allow_direct),
// otherwise the stream API's message get: either way one request.
type LeaseRecords struct {
	stream  jetstream.Stream
	subject string
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
	return &LeaseRecords{stream: s, subject: events.LeaseSubject(b.id.Cluster, name)}, nil
}

// At returns the lease record stored at seq; found is false when the message
// at seq is gone (expired) or is not on the lease subject.
func (l *LeaseRecords) At(ctx context.Context, seq uint64) (rec events.LeaseRecord, found bool, err error) {
	m, err := l.stream.GetMsg(ctx, seq)
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return events.LeaseRecord{}, false, nil
	case err != nil:
		return events.LeaseRecord{}, false, fmt.Errorf("lease record %d: %w", seq, err)
	case m.Subject != l.subject || m.Sequence != seq:
		return events.LeaseRecord{}, false, nil
	}
	rec, err = events.DecodeLeaseRecord(m.Data, seq)
	if err != nil {
		return events.LeaseRecord{}, false, nil // not a record fan wrote: no term
	}
	return rec, true, nil
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
