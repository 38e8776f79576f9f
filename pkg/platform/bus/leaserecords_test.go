package bus_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/bus/bustest"
)

// silentReplica never answers, as a replica on a host just cut off.
type silentReplica struct{}

func (silentReplica) GetMsg(ctx context.Context, _ uint64, _ ...jetstream.GetMsgOpt) (*jetstream.RawStreamMsg, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

func (silentReplica) GetLastMsgForSubject(ctx context.Context, _ string) (*jetstream.RawStreamMsg, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

// staleReplica answers at once from an older copy of the stream: it holds
// nothing at the sequences it has not stored, and its newest lease record
// is old (nil: none at all).
type staleReplica struct{ last *jetstream.RawStreamMsg }

func (staleReplica) GetMsg(context.Context, uint64, ...jetstream.GetMsgOpt) (*jetstream.RawStreamMsg, error) {
	return nil, jetstream.ErrMsgNotFound
}

func (r staleReplica) GetLastMsgForSubject(context.Context, string) (*jetstream.RawStreamMsg, error) {
	if r.last == nil {
		return nil, jetstream.ErrMsgNotFound
	}
	return r.last, nil
}

// A lease record is read through the stream's leader as well as by a
// direct get: a replica that never answers (on a host just cut off) or one
// that is behind (it has not stored the record yet, or its newest record
// is an older term's) neither holds the answer back nor falsifies it.
func TestLeaseReadsOutliveAReplicaThatIsSilentOrBehind(t *testing.T) {
	s := bustest.Server(t)
	b := bustest.Connect(t, s, bus.Identity{Cluster: "lab", Service: "arbiter", Node: "ctl"})
	subject := events.LeaseSubject("lab", events.ArbiterLease)
	publish := func(rec events.LeaseRecord) uint64 {
		t.Helper()
		data, err := json.Marshal(rec)
		if err != nil {
			t.Fatal(err)
		}
		ack, err := b.JS.Publish(t.Context(), subject, data)
		if err != nil {
			t.Fatal(err)
		}
		return ack.Sequence
	}
	// An older term, then the current one: its start and a renewal.
	oldTerm := publish(events.LeaseRecord{Holder: "other", At: time.Now()})
	oldData, err := json.Marshal(events.LeaseRecord{Holder: "other", At: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	term := publish(events.LeaseRecord{Holder: "ctl", At: time.Now()})
	renewal := publish(events.LeaseRecord{Holder: "ctl", Epoch: term, At: time.Now()})
	old := &jetstream.RawStreamMsg{Subject: subject, Sequence: oldTerm, Data: oldData}

	for _, tc := range []struct {
		name    string
		replica bus.Replica
	}{
		{"silent replica", silentReplica{}},
		{"replica behind, no lease record", staleReplica{}},
		{"replica behind, an older term's record", staleReplica{last: old}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			recs, err := b.LeaseRecords(t.Context(), events.ArbiterLease)
			if err != nil {
				t.Fatal(err)
			}
			bus.SetReplica(recs, tc.replica)
			// A read attempt's own bound, as the executor's term check sets it.
			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
			defer cancel()
			start := time.Now()
			rec, found, err := recs.At(ctx, term)
			if took := time.Since(start); took > time.Second {
				t.Fatalf("At(%d) took %v: it waited for the replica", term, took)
			}
			if err != nil || !found || rec.Holder != "ctl" || rec.Term(term) != term {
				t.Fatalf("At(%d) = %+v found=%v err=%v; want the record starting term %d", term, rec, found, err, term)
			}
			// Past the stream's end nothing is found, and the leader says so
			// even when the replica would never answer.
			if _, found, err = recs.At(ctx, renewal+1000); err != nil || found {
				t.Fatalf("At(%d) found=%v err=%v; want not found", renewal+1000, found, err)
			}
			// The newest record is the leader's, whatever the replica says,
			// when the replica's answer does not settle the question...
			start = time.Now()
			last, seq, found, err := recs.Last(ctx, func(r events.LeaseRecord, seq uint64) bool { return r.Term(seq) == term })
			if took := time.Since(start); took > time.Second {
				t.Fatalf("Last took %v: it waited for the replica", took)
			}
			if err != nil || !found || seq != renewal || last.Term(seq) != term {
				t.Fatalf("Last = %+v seq=%d found=%v err=%v; want the renewal at %d in term %d", last, seq, found, err, renewal, term)
			}
			// ... and with no question to settle.
			if _, seq, found, err = recs.Last(ctx, nil); err != nil || !found || seq != renewal {
				t.Fatalf("Last(nil) seq=%d found=%v err=%v; want the renewal at %d", seq, found, err, renewal)
			}
		})
	}
}
