package store

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"sync"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/services/replicator/internal/fstree"
	"github.com/nats-io/nats.go/jetstream"
)

// prefetchAhead is how many batches of small contents a prefetch may hold
// that its fetchers have not taken yet (each at most batchBytes).
const prefetchAhead = 4

// Prefetch returns a Fetcher for contents about to be fetched, in about the
// order of hashes. Behind it, the metadata of a thousand contents is read
// in one batch request, and the contents of single-chunk objects (every
// file up to 128 KiB) about 4 MiB of them a request, a few batches
// ahead of the fetchers; larger contents are read a batch of chunks per
// request. A hash not in the list is fetched as Get does. It stops when
// ctx ends.
func (s *Store) Prefetch(ctx context.Context, hashes []string) fstree.Fetcher {
	return s.prefetch(ctx, hashes).get
}

func (s *Store) prefetch(ctx context.Context, hashes []string) *prefetch {
	p := &prefetch{s: s, slots: make(map[string]*slot, len(hashes)), tokens: make(chan struct{}, prefetchAhead)}
	var order []string
	for _, h := range hashes {
		if sl, ok := p.slots[h]; ok {
			sl.uses++ // the same content under another path
			continue
		}
		p.slots[h] = &slot{ready: make(chan struct{}), uses: 1}
		order = append(order, h)
	}
	go p.run(ctx, order)
	return p
}

type prefetch struct {
	s      *Store
	slots  map[string]*slot // fixed once run starts; a slot's fields are set before its ready closes
	tokens chan struct{}    // one per batch of contents held

	mu sync.Mutex // guards slot.taken and held.left
}

// slot is one content: its metadata and, for a single-chunk object, its
// bytes; or why it cannot be had.
type slot struct {
	ready chan struct{}
	in    *jetstream.ObjectInfo
	data  []byte
	small bool // data is the whole content
	err   error
	batch *held
	taken bool
	uses  int // fetches still to come; the bytes are dropped after the last
}

// held is a batch of contents that holds one token until each of its
// contents was fetched once (a content shared by a later path stays in its
// slot: counting every use could leave the batches ahead waiting for a
// path far behind).
type held struct{ left int }

func (p *prefetch) get(ctx context.Context, hash string) (io.ReadCloser, error) {
	sl, ok := p.slots[hash]
	if !ok {
		return p.s.Get(ctx, hash)
	}
	select {
	case <-sl.ready:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	p.mu.Lock()
	data := sl.data
	if sl.uses--; sl.uses <= 0 {
		sl.data = nil // held only as long as a fetch of it is to come
	}
	release := false
	if b := sl.batch; b != nil && !sl.taken {
		sl.taken = true
		b.left--
		release = b.left == 0
	}
	p.mu.Unlock()
	if release {
		<-p.tokens
	}
	if sl.err != nil {
		return nil, sl.err
	}
	if sl.small {
		return io.NopCloser(bytes.NewReader(data)), nil
	}
	r, err := p.s.reader(ctx, events.ObjectStreamName(events.ReplBlobBucket), events.ReplBlobBucket, blobPrefix+hash, sl.in)
	if err != nil {
		return nil, fmt.Errorf("get %s: %w", hash, err)
	}
	return r, nil
}

func (p *prefetch) fail(hs []string, err error) {
	for _, h := range hs {
		sl := p.slots[h]
		sl.err = fmt.Errorf("get %s: %w", h, err)
		close(sl.ready)
	}
}

// run reads ahead. When ctx ends it just returns: the fetchers' own
// context has ended then too (the caller cancels ctx only after them).
func (p *prefetch) run(ctx context.Context, order []string) {
	for len(order) > 0 {
		group := order[:min(len(order), maxMultiLast)]
		order = order[len(group):]
		names := make([]string, len(group))
		for i, h := range group {
			names[i] = blobPrefix + h
		}
		infos, err := p.s.infos(ctx, events.ObjectStreamName(events.ReplBlobBucket), events.ReplBlobBucket, names)
		if err != nil {
			if ctx.Err() == nil {
				p.fail(group, err)
				p.fail(order, err)
			}
			return
		}
		// Single-chunk objects are read in batches of about half
		// batchBytes; the others are ready at once (read when fetched).
		var small []string
		size := 0
		for _, h := range group {
			sl := p.slots[h]
			in, ok := infos[blobPrefix+h]
			switch {
			case !ok:
				sl.err = fmt.Errorf("get %s: %w", h, fstree.ErrMissingContent)
			case in.Opts != nil && in.Opts.Link != nil:
				sl.err = fmt.Errorf("get %s: a link, which this store never writes: %w", h, jetstream.ErrBadObjectMeta)
			case in.Chunks == 0:
				sl.in, sl.small = in, true
			case in.Chunks > 1:
				sl.in = in
			default:
				if len(small) > 0 && size+int(in.Size) > batchBytes/2 {
					if !p.fetchSmall(ctx, small, infos) {
						return
					}
					small, size = nil, 0
				}
				sl.in = in
				small = append(small, h)
				size += int(in.Size)
				continue
			}
			close(sl.ready)
		}
		if len(small) > 0 && !p.fetchSmall(ctx, small, infos) {
			return
		}
	}
}

// fetchSmall reads the one chunk of each of hs (single-chunk objects whose
// metadata is in infos) with one multi_last request, fills their slots and
// marks them ready. A chunk not answered (purged since its metadata was
// read) is missing content. It returns false when ctx ended.
func (p *prefetch) fetchSmall(ctx context.Context, hs []string, infos map[string]*jetstream.ObjectInfo) bool {
	select {
	case p.tokens <- struct{}{}:
	case <-ctx.Done():
		return false
	}
	bySubj := make(map[string]*slot, len(hs))
	subjs := make([]string, 0, len(hs))
	for _, h := range hs {
		subj := fmt.Sprintf(chunkSubjTmpl, events.ReplBlobBucket, infos[blobPrefix+h].NUID)
		bySubj[subj] = p.slots[h]
		subjs = append(subjs, subj)
	}
	err := p.s.directBatch(ctx, events.ObjectStreamName(events.ReplBlobBucket), batchRequest{MultiLastFor: subjs, MaxBytes: batchBytes}, func(m batchMsg) error {
		if sl := bySubj[m.Subject]; sl != nil {
			sl.data = m.Data
		}
		return nil
	})
	if err != nil {
		<-p.tokens
		if ctx.Err() != nil {
			return false
		}
		p.fail(hs, err)
		return true
	}
	b := &held{left: len(hs)}
	for _, h := range hs {
		sl := p.slots[h]
		sl.batch = b
		switch {
		case sl.data == nil:
			sl.err = fmt.Errorf("get %s: chunk missing (replaced or deleted): %w", h, fstree.ErrMissingContent)
		case uint64(len(sl.data)) != sl.in.Size:
			sl.err = fmt.Errorf("get %s: %d bytes, metadata says %d: %w", h, len(sl.data), sl.in.Size, fstree.ErrMissingContent)
		default:
			sl.small = true
		}
		close(sl.ready)
	}
	return true
}
