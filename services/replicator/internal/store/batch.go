package store

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/services/replicator/internal/fstree"
	"github.com/nats-io/nats.go/jetstream"
)

// Batch direct gets: one request, many answers. A stream with direct gets
// allowed (every object store's is) answers a batch request with each
// message asked for, each as its own reply, then an end-of-batch status,
// so a thousand small objects cost one round trip instead of two thousand.
// Profiled on a 10,000-file sync, the per-object requests (metadata, then
// each 128 KiB chunk) were where a target's fetchers waited.

const (
	// maxMultiLast is the most subjects one multi_last request may name
	// (the server answers at most 1,024 messages to one).
	maxMultiLast = 1000
	// batchBytes bounds one batch's answer: the server stops after the
	// message that crosses it, and what is left is asked again.
	batchBytes = 8 << 20
)

// batchRequest is the server's direct-get request (JSApiMsgGetRequest):
// either the last message of each subject in MultiLastFor, or up to Batch
// messages on NextFor from sequence Seq.
type batchRequest struct {
	Seq          uint64   `json:"seq,omitempty"`
	NextFor      string   `json:"next_by_subj,omitempty"`
	Batch        int      `json:"batch,omitempty"`
	MaxBytes     int      `json:"max_bytes,omitempty"`
	MultiLastFor []string `json:"multi_last,omitempty"`
}

// batchMsg is one message of a batch's answer. Data belongs to the caller.
type batchMsg struct {
	Subject string
	Seq     uint64
	Data    []byte
}

// apiPrefix is the JetStream API prefix js sends its requests under.
func apiPrefix(js jetstream.JetStream) string {
	o := js.Options()
	switch {
	case o.APIPrefix != "":
		return strings.TrimSuffix(o.APIPrefix, ".") + "."
	case o.Domain != "":
		return "$JS." + o.Domain + ".API."
	}
	return jetstream.DefaultAPIPrefix
}

// directBatch sends one batch request to stream and calls fn with each
// message of the answer, in the order they come, until the end of the
// batch. Nothing found (404) is no messages and no error. Each wait for
// the next message is bounded by requestTimeout, so a lost answer fails
// the caller instead of hanging it.
func (s *Store) directBatch(ctx context.Context, stream string, req batchRequest, fn func(batchMsg) error) error {
	body, err := json.Marshal(req)
	if err != nil {
		return err
	}
	nc := s.js.Conn()
	inbox := nc.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return fmt.Errorf("batch get %s: %w", stream, err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	// The answer is bounded by MaxBytes (and 1,024 messages); the
	// subscription must hold all of it, however slowly it is read.
	_ = sub.SetPendingLimits(-1, -1)
	if err := nc.PublishRequest(s.api+"DIRECT.GET."+stream, inbox, body); err != nil {
		return fmt.Errorf("batch get %s: %w", stream, err)
	}
	for {
		mctx, cancel := context.WithTimeout(ctx, requestTimeout)
		m, err := sub.NextMsgWithContext(mctx)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("batch get %s: %w", stream, err)
		}
		if st := m.Header.Get("Status"); st != "" && len(m.Data) == 0 {
			switch st {
			case "204": // end of batch
				return nil
			case "404": // nothing (more) found
				return nil
			}
			return fmt.Errorf("batch get %s: status %s %s", stream, st, m.Header.Get("Description"))
		}
		seq, err := strconv.ParseUint(m.Header.Get(jetstream.SequenceHeader), 10, 64)
		if err != nil {
			return fmt.Errorf("batch get %s: answer without a sequence: %w", stream, err)
		}
		subj := m.Header.Get(jetstream.SubjectHeader)
		if subj == "" {
			return fmt.Errorf("batch get %s: answer without a subject", stream)
		}
		if err := fn(batchMsg{Subject: subj, Seq: seq, Data: m.Data}); err != nil {
			return err
		}
	}
}

// metaSubject is the subject of an object's metadata in bucket.
func metaSubject(bucket, name string) string {
	return fmt.Sprintf(metaSubjTmpl, bucket, base64.URLEncoding.EncodeToString([]byte(name)))
}

// infos reads the metadata of many objects of bucket (whose stream is
// stream) with multi_last batches; a name missing from the result is not
// stored (or deleted).
func (s *Store) infos(ctx context.Context, stream, bucket string, names []string) (map[string]*jetstream.ObjectInfo, error) {
	out := make(map[string]*jetstream.ObjectInfo, len(names))
	bySubj := make(map[string]string, min(len(names), maxMultiLast))
	for len(names) > 0 {
		n := min(len(names), maxMultiLast)
		subjs := make([]string, 0, n)
		clear(bySubj)
		for _, name := range names[:n] {
			subj := metaSubject(bucket, name)
			bySubj[subj] = name
			subjs = append(subjs, subj)
		}
		names = names[n:]
		err := s.directBatch(ctx, stream, batchRequest{MultiLastFor: subjs, MaxBytes: batchBytes}, func(m batchMsg) error {
			name, ok := bySubj[m.Subject]
			if !ok {
				return nil
			}
			var in jetstream.ObjectInfo
			if err := json.Unmarshal(m.Data, &in); err != nil {
				return fmt.Errorf("%s: %w", name, jetstream.ErrBadObjectMeta)
			}
			if !in.Deleted {
				out[name] = &in
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

// chunkBatch is how many chunks (of 128 KiB) one request of a reader asks
// for: 4 MiB a round trip instead of 128 KiB.
const chunkBatch = 32

// nextChunks fills c.queue with the object's next chunks, in one batch.
func (c *chunkReader) nextChunks() error {
	want := min(int(c.left), chunkBatch)
	got := 0
	err := c.s.directBatch(c.ctx, c.stream, batchRequest{NextFor: c.subj, Seq: c.next, Batch: want, MaxBytes: batchBytes}, func(m batchMsg) error {
		if m.Subject != c.subj || got == want {
			return nil
		}
		c.queue = append(c.queue, m.Data)
		c.next = m.Seq + 1
		got++
		return nil
	})
	if err != nil {
		return fmt.Errorf("%s: %w", c.name, err)
	}
	if got == 0 {
		return fmt.Errorf("%s: chunk missing (replaced or deleted): %w", c.name, fstree.ErrMissingContent)
	}
	c.left -= uint32(got)
	return nil
}

// Lookup learns which of hashes the bucket holds with a few batch requests
// instead of one per content: those are known from now on, and a Put of
// any other one skips its own look-up.
func (s *Store) Lookup(ctx context.Context, hashes []string) error {
	names := make([]string, 0, len(hashes))
	for _, h := range hashes {
		if !s.Has(h) {
			names = append(names, blobPrefix+h)
		}
	}
	found, err := s.infos(ctx, events.ObjectStreamName(events.ReplBlobBucket), events.ReplBlobBucket, names)
	if err != nil {
		return fmt.Errorf("look up contents: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, name := range names {
		h := strings.TrimPrefix(name, blobPrefix)
		if _, ok := found[name]; ok {
			s.known[h] = true
		} else {
			s.absent[h] = true
		}
	}
	return nil
}
