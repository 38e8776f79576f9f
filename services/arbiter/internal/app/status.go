package app

import (
	"context"
	"encoding/json"
	"log/slog"
	"sync"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/nats-io/nats.go/jetstream"
)

// statusWriter stores the groups' status (fanctl status, executors
// restarting) beside the decision loop, never in its way. Each status is
// one key-value write waiting for the server's answer: done in the loop,
// a thousand nodes in 400 groups stalled it for 400 round trips at every
// refresh, and claims expired before they were published. The loop posts
// what changed; the writer stores the newest status of each group, a
// status posted while an older one of the same group waits superseding it.
type statusWriter struct {
	kv      jetstream.KeyValue
	cluster string
	log     *slog.Logger
	// may reports whether a status computed under epoch may still be
	// written: this replica commands under that term. A replica that lost
	// the lease must not overwrite its successor's status.
	may func(epoch uint64) bool

	mu      sync.Mutex
	pending map[string]events.GroupStatus // group -> newest status not yet stored
	wake    chan struct{}
}

// statusRetry spaces the retries of a status the bucket did not store.
const statusRetry = 250 * time.Millisecond

func newStatusWriter(kv jetstream.KeyValue, cluster string, may func(uint64) bool, log *slog.Logger) *statusWriter {
	return &statusWriter{kv: kv, cluster: cluster, log: log, may: may, pending: map[string]events.GroupStatus{}, wake: make(chan struct{}, 1)}
}

// post queues st for writing and returns at once.
func (w *statusWriter) post(st events.GroupStatus) {
	w.mu.Lock()
	w.pending[st.Group] = st
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// run writes what is posted until ctx ends.
func (w *statusWriter) run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.wake:
		}
		if !w.flush(ctx) {
			select {
			case <-ctx.Done():
				return
			case <-time.After(statusRetry):
			}
			select {
			case w.wake <- struct{}{}:
			default:
			}
		}
	}
}

// flush writes every pending status once and reports whether all were
// stored. One that failed waits again, unless a newer one was posted.
func (w *statusWriter) flush(ctx context.Context) bool {
	w.mu.Lock()
	batch := w.pending
	w.pending = map[string]events.GroupStatus{}
	w.mu.Unlock()
	ok := true
	for group, st := range batch {
		if !w.may(st.Epoch) {
			continue
		}
		b, err := json.Marshal(st)
		if err != nil {
			continue
		}
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		_, err = w.kv.Put(pctx, events.GroupStatusKey(w.cluster, group), b)
		cancel()
		if err == nil {
			continue
		}
		if ctx.Err() != nil {
			return true
		}
		ok = false
		w.log.Warn("write group status failed", "group", group, "err", err)
		w.mu.Lock()
		if _, newer := w.pending[group]; !newer {
			w.pending[group] = st
		}
		w.mu.Unlock()
	}
	return ok
}
