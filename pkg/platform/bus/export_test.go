package bus

import (
	"context"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// SetHomeEvery changes how often a connection looks for its preferred
// server, for a test; it returns the previous value.
func SetHomeEvery(d time.Duration) time.Duration {
	prev := homeEvery
	homeEvery = d
	return prev
}

// SetDirectGet puts get in the place of the command stream's direct get,
// for a test of a replica that never answers or is behind.
func SetDirectGet(l *LeaseRecords, get func(ctx context.Context, seq uint64, opts ...jetstream.GetMsgOpt) (*jetstream.RawStreamMsg, error)) {
	l.directGet = get
}
