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

// A lease record is read through the stream's leader as well as by a
// direct get: a replica that never answers (on a host just cut off) or one
// that is behind (it has not stored the record yet) does not hold the
// answer back or falsify it.
func TestLeaseRecordAtOutlivesAReplicaThatIsSilentOrBehind(t *testing.T) {
	s := bustest.Server(t)
	b := bustest.Connect(t, s, bus.Identity{Cluster: "lab", Service: "arbiter", Node: "ctl"})
	data, err := json.Marshal(events.LeaseRecord{Holder: "ctl", At: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	ack, err := b.JS.Publish(t.Context(), events.LeaseSubject("lab", events.ArbiterLease), data)
	if err != nil {
		t.Fatal(err)
	}
	term := ack.Sequence

	for _, tc := range []struct {
		name   string
		direct func(ctx context.Context, seq uint64, _ ...jetstream.GetMsgOpt) (*jetstream.RawStreamMsg, error)
	}{
		{"silent replica", func(ctx context.Context, _ uint64, _ ...jetstream.GetMsgOpt) (*jetstream.RawStreamMsg, error) {
			<-ctx.Done()
			return nil, ctx.Err()
		}},
		{"replica behind", func(context.Context, uint64, ...jetstream.GetMsgOpt) (*jetstream.RawStreamMsg, error) {
			return nil, jetstream.ErrMsgNotFound
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			recs, err := b.LeaseRecords(t.Context(), events.ArbiterLease)
			if err != nil {
				t.Fatal(err)
			}
			bus.SetDirectGet(recs, tc.direct)
			// A read attempt's own bound, as the executor's term check sets it.
			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
			defer cancel()
			start := time.Now()
			rec, found, err := recs.At(ctx, term)
			took := time.Since(start)
			if err != nil || !found || rec.Holder != "ctl" || rec.Term(term) != term {
				t.Fatalf("At(%d) = %+v found=%v err=%v; want the record starting term %d", term, rec, found, err, term)
			}
			if took > time.Second {
				t.Fatalf("At(%d) took %v: it waited for the replica", term, took)
			}
			// Past the stream's end nothing is found, and the leader says so
			// even when the replica would never answer.
			_, found, err = recs.At(ctx, term+1000)
			if err != nil || found {
				t.Fatalf("At(%d) found=%v err=%v; want not found", term+1000, found, err)
			}
		})
	}
}
