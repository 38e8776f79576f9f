package direct

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/services/replicator/internal/fstree"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
)

const (
	// ahead is how many answers a prefetch may hold or wait for that its
	// fetchers have not taken yet (each at most one message).
	ahead = 8
	// requestTimeout bounds each request: a holder that stops answering
	// fails the fetch (and the content is asked of the store next pass)
	// instead of hanging the apply.
	requestTimeout = 30 * time.Second
)

// Client fetches contents from the holder of a group's trees.
type Client struct {
	nc             *nats.Conn
	cluster, group string
	fetched        prometheus.Counter
}

// NewClient fetches for group of cluster over nc; fetched (may be nil)
// counts the content bytes received.
func NewClient(nc *nats.Conn, cluster, group string, fetched prometheus.Counter) *Client {
	if fetched == nil {
		fetched = prometheus.NewCounter(prometheus.CounterOpts{Name: "unregistered"})
	}
	return &Client{nc: nc, cluster: cluster, group: group, fetched: fetched}
}

// Prefetch returns a Fetcher for contents of tree about to be fetched, in
// about the order of hashes, asked of node: small contents many to an
// answer, large ones an answer at a time, a few answers ahead of the
// fetchers. sizes gives each content's size. A content the node does not
// hold, or that cannot be had from it, fails with fstree.ErrMissingContent
// (the source then stores it). A hash not in the list is fetched on its own.
// It stops when ctx ends.
func (c *Client) Prefetch(ctx context.Context, node, tree string, sizes map[string]int64, hashes []string) fstree.Fetcher {
	p := &prefetch{c: c, node: node, tree: tree, sizes: sizes, slots: map[string]*slot{}, tokens: make(chan struct{}, ahead)}
	reqs := p.plan(hashes)
	go p.run(ctx, reqs)
	return p.get
}

type prefetch struct {
	c          *Client
	node, tree string
	sizes      map[string]int64
	slots      map[string]*slot // fixed once run starts
	tokens     chan struct{}

	mu sync.Mutex // guards slot.uses, .active and .read, part.taken and request.left
}

// slot is one content: its parts in order.
type slot struct {
	parts  []*part
	uses   int  // fetches still to come
	active int  // fetches reading it now
	read   bool // a fetch has begun reading it
}

// part is one range of a content, filled by one answer.
type part struct {
	rg    events.ContentRange
	ready chan struct{}
	data  []byte
	err   error
	req   *request
	taken bool
}

// request is one answer's worth of ranges; it holds a token until each of
// its parts was taken once.
type request struct {
	parts []*part
	left  int
}

// plan packs the contents into requests of at most one answer each.
func (p *prefetch) plan(hashes []string) []*request {
	budget := answerBudget(p.c.nc)
	var reqs []*request
	var cur *request
	var curBytes int64
	flush := func() {
		if cur != nil {
			cur.left = len(cur.parts)
			reqs = append(reqs, cur)
			cur, curBytes = nil, 0
		}
	}
	add := func(h string, off, n int64) *part {
		if cur == nil {
			cur = &request{}
		}
		pt := &part{rg: events.ContentRange{Hash: h, Offset: off, Length: n}, ready: make(chan struct{}), req: cur}
		cur.parts = append(cur.parts, pt)
		curBytes += n
		return pt
	}
	for _, h := range hashes {
		if sl, ok := p.slots[h]; ok {
			sl.uses++ // the same content under another path
			continue
		}
		size, known := p.sizes[h]
		sl := &slot{uses: 1}
		p.slots[h] = sl
		switch {
		case !known:
			sl.parts = []*part{settled(fmt.Errorf("%s %s: %w: its size is not in the manifest", p.tree, h, fstree.ErrMissingContent))}
		case size <= 0:
			sl.parts = []*part{settled(nil)} // nothing to ask for: the empty content
		case size <= budget:
			if cur != nil && (curBytes+size > budget || len(cur.parts) == events.MaxContentRanges) {
				flush()
			}
			sl.parts = []*part{add(h, 0, size)}
		default:
			flush()
			for off := int64(0); off < size; off += budget {
				sl.parts = append(sl.parts, add(h, off, min(budget, size-off)))
				flush()
			}
		}
	}
	flush()
	return reqs
}

// run asks for the requests in order, ahead of the fetchers by the tokens.
// When ctx ends it fails what it has not asked for.
func (p *prefetch) run(ctx context.Context, reqs []*request) {
	for i, r := range reqs {
		select {
		case p.tokens <- struct{}{}:
		case <-ctx.Done():
			for _, r := range reqs[i:] {
				fail(r.parts, ctx.Err())
			}
			return
		}
		go p.ask(ctx, r)
	}
}

// settled is a part known without asking: empty, or failed with err. It
// belongs to no request, so it holds no token.
func settled(err error) *part {
	pt := &part{ready: make(chan struct{}), taken: true, err: err}
	close(pt.ready)
	return pt
}

func fail(parts []*part, err error) {
	for _, pt := range parts {
		pt.err = err
		close(pt.ready)
	}
}

// ask fills r's parts, asking again for what an answer left out.
func (p *prefetch) ask(ctx context.Context, r *request) {
	todo := r.parts
	// A range answered in part is asked again from where it stopped.
	partial := map[*part][]byte{}
	for len(todo) > 0 {
		req := events.ContentRequest{Group: p.c.group, Tree: p.tree}
		for _, pt := range todo {
			rg := pt.rg
			if got := partial[pt]; len(got) > 0 {
				rg.Offset += int64(len(got))
				rg.Length -= int64(len(got))
			}
			req.Ranges = append(req.Ranges, rg)
		}
		lengths, body, err := p.c.request(ctx, p.node, req)
		if err != nil {
			fail(todo, fmt.Errorf("%s from %s: %w: %w", p.tree, p.node, fstree.ErrMissingContent, err))
			return
		}
		if len(lengths) == 0 {
			fail(todo, fmt.Errorf("%s from %s: %w: an answer with nothing in it", p.tree, p.node, fstree.ErrMissingContent))
			return
		}
		var rest []*part
		off := 0
		for i, pt := range todo {
			if i >= len(lengths) {
				rest = append(rest, todo[i:]...)
				break
			}
			n := lengths[i]
			if n < 0 {
				fail([]*part{pt}, fmt.Errorf("%s %s: %w: %s does not hold it", p.tree, pt.rg.Hash, fstree.ErrMissingContent, p.node))
				delete(partial, pt)
				continue
			}
			// The answer's bytes are used in place (full slice expressions,
			// so that no append writes into a neighbour's range); only a
			// range answered over several answers is copied together.
			got := body[off : off+int(n) : off+int(n)]
			if prev := partial[pt]; len(prev) > 0 {
				got = append(prev, got...)
			}
			off += int(n)
			switch {
			case int64(len(got)) == pt.rg.Length:
				pt.data = got
				delete(partial, pt)
				close(pt.ready)
			case n == 0:
				fail([]*part{pt}, fmt.Errorf("%s %s: %w: %s answered %d of %d bytes", p.tree, pt.rg.Hash, fstree.ErrMissingContent, p.node, len(got), pt.rg.Length))
				delete(partial, pt)
			default:
				partial[pt] = got
				rest = append(rest, pt)
			}
		}
		todo = rest
	}
}

// request sends one request to node and reads its one answer.
func (c *Client) request(ctx context.Context, node string, req events.ContentRequest) ([]int64, []byte, error) {
	data, err := json.Marshal(req)
	if err != nil {
		return nil, nil, err
	}
	rctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	m, err := c.nc.RequestWithContext(rctx, events.ContentSubject(c.cluster, node), data)
	if err != nil {
		return nil, nil, err
	}
	if why := m.Header.Get(ErrorHeader); why != "" {
		return nil, nil, fmt.Errorf("refused: %s", why)
	}
	lengths, err := events.ParseContentLengths(m.Header.Get(events.ContentLengthsHeader), req, len(m.Data))
	if err != nil {
		return nil, nil, err
	}
	c.fetched.Add(float64(len(m.Data)))
	return lengths, m.Data, nil
}

// get is the prefetch's Fetcher.
func (p *prefetch) get(ctx context.Context, hash string) (io.ReadCloser, error) {
	sl, ok := p.slots[hash]
	if !ok {
		return p.single(ctx, hash)
	}
	p.mu.Lock()
	first := !sl.read
	sl.read = true
	sl.uses--
	sl.active++
	p.mu.Unlock()
	if !first && len(sl.parts) > 1 {
		p.done(sl)
		// A large content already read once: its answers were released.
		return p.single(ctx, hash)
	}
	return &reader{p: p, sl: sl, ctx: ctx, shared: len(sl.parts) == 1}, nil
}

// done ends one fetch of sl; the bytes of a single-answer content go once
// no fetch of it is left to come or running.
func (p *prefetch) done(sl *slot) {
	p.mu.Lock()
	defer p.mu.Unlock()
	sl.active--
	if sl.uses <= 0 && sl.active == 0 && len(sl.parts) == 1 {
		sl.parts[0].data = nil
	}
}

// single fetches one content outside the prefetch's order: a prefetch of
// it alone.
func (p *prefetch) single(ctx context.Context, hash string) (io.ReadCloser, error) {
	return p.c.Prefetch(ctx, p.node, p.tree, p.sizes, []string{hash})(ctx, hash)
}

// take marks pt taken, releasing its request's token after its last part.
func (p *prefetch) take(pt *part) {
	p.mu.Lock()
	release := false
	if !pt.taken {
		pt.taken = true
		pt.req.left--
		release = pt.req.left == 0
	}
	p.mu.Unlock()
	if release {
		<-p.tokens
	}
}

// reader reads a content's parts in order. A content of one answer may be
// read by several fetches (the same bytes under several paths), so its
// bytes stay until the last is done; the parts of a larger one are dropped
// as they are read.
type reader struct {
	p      *prefetch
	sl     *slot
	ctx    context.Context
	shared bool
	i      int
	buf    []byte
	closed bool
}

func (r *reader) Read(b []byte) (int, error) {
	if len(r.buf) == 0 {
		if err := r.fill(); err != nil {
			return 0, err
		}
	}
	n := copy(b, r.buf)
	r.buf = r.buf[n:]
	return n, nil
}

// WriteTo hands w each part whole (io.Copy uses it): one write, and one
// hash update, of up to an answer instead of 32 KiB at a time.
func (r *reader) WriteTo(w io.Writer) (int64, error) {
	var n int64
	for {
		if len(r.buf) == 0 {
			if err := r.fill(); errors.Is(err, io.EOF) {
				return n, nil
			} else if err != nil {
				return n, err
			}
		}
		m, err := w.Write(r.buf)
		n += int64(m)
		r.buf = r.buf[m:]
		if err != nil {
			return n, err
		}
	}
}

// fill waits for the next part with bytes in it.
func (r *reader) fill() error {
	for len(r.buf) == 0 {
		if r.closed || r.i >= len(r.sl.parts) {
			return io.EOF
		}
		pt := r.sl.parts[r.i]
		select {
		case <-pt.ready:
		case <-r.ctx.Done():
			return r.ctx.Err()
		}
		if pt.err != nil {
			return pt.err
		}
		r.buf = pt.data
		if !r.shared {
			pt.data = nil
		}
		r.p.take(pt)
		r.i++
	}
	return nil
}

// Close gives back the tokens of parts never read.
func (r *reader) Close() error {
	if r.closed {
		return nil
	}
	r.closed = true
	for _, pt := range r.sl.parts[r.i:] {
		if pt.req != nil {
			r.p.take(pt)
		}
		if !r.shared {
			go func() { <-pt.ready; r.p.mu.Lock(); pt.data = nil; r.p.mu.Unlock() }()
		}
	}
	r.buf = nil
	r.p.done(r.sl)
	return nil
}
