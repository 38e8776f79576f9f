// Package direct sends a holder's file contents to its peers over the bus
// without storing them. The object store keeps every content it is given
// on every NATS server, which is right for the day's changes (a target that
// was down catches up from the bus alone) and wasteful for a first sync of
// a whole spool: every byte written into the store, read back out and
// written again on the target. A pass too large for the store is instead
// served by the holder's replicator on request (Server) and fetched by the
// targets a batch at a time (Client). The target checks every content
// against its SHA-256 before it is renamed into place, so the answering
// node is trusted with availability only.
package direct

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/services/replicator/internal/fstree"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
)

// ErrorHeader carries why a request was refused (an answer with no body).
const ErrorHeader = "Fan-Content-Error"

// headerRoom is kept free of every answer's body for its headers: the
// lengths of a thousand ranges sharing one answer take a few KiB.
const headerRoom = 16 << 10

// answerBudget is the most body bytes one answer carries on nc; a server
// whose limit is smaller than the header room still gets small answers.
func answerBudget(nc *nats.Conn) int64 {
	return max(nc.MaxPayload()-headerRoom, 4<<10)
}

// answering bounds the requests answered at once: each holds up to one
// answer's worth of file bytes.
const answering = 4

// Opener opens a file of a tree for reading, the way a scan does (beneath
// the root, through no symlink).
type Opener func(rel string) (*os.File, error)

// Server answers content requests for the trees this node is source of.
type Server struct {
	nc      *nats.Conn
	subject string
	group   string
	log     *slog.Logger
	refuse  func(subject string, err error)
	served  prometheus.Counter

	mu    sync.RWMutex
	trees map[string]*servedTree

	bufs sync.Pool
}

type servedTree struct {
	open   Opener
	byHash map[string]fstree.Entry // as Serve was given it, never changed

	// added is what Add gave since.
	mu    sync.RWMutex
	added map[string]fstree.Entry
}

func (t *servedTree) lookup(hash string) (fstree.Entry, bool) {
	if e, ok := t.byHash[hash]; ok {
		return e, true
	}
	t.mu.RLock()
	defer t.mu.RUnlock()
	e, ok := t.added[hash]
	return e, ok
}

// NewServer answers on node's content subject of cluster for group's trees;
// refuse (may be nil) is told of every request refused as malformed.
// served (may be nil) counts the content bytes answered.
func NewServer(nc *nats.Conn, cluster, group, node string, log *slog.Logger, refuse func(subject string, err error), served prometheus.Counter) *Server {
	if refuse == nil {
		refuse = func(string, error) {}
	}
	if served == nil {
		served = prometheus.NewCounter(prometheus.CounterOpts{Name: "unregistered"})
	}
	return &Server{nc: nc, subject: events.ContentSubject(cluster, node), group: group, log: log, refuse: refuse,
		served: served, trees: map[string]*servedTree{}}
}

// Serve makes tree's files of entries available (replacing what was served
// for it): a source calls it with each scan, before it publishes.
func (s *Server) Serve(tree string, open Opener, entries []fstree.Entry) {
	byHash := make(map[string]fstree.Entry, len(entries))
	for _, e := range entries {
		if e.Kind == fstree.KindFile {
			byHash[e.Hash] = e
		}
	}
	s.mu.Lock()
	s.trees[tree] = &servedTree{open: open, byHash: byHash}
	s.mu.Unlock()
}

// Add serves entries' files too, beside what tree already serves: a
// source calls it with each delta, before it publishes. What Serve
// replaced is forgotten with it.
func (s *Server) Add(tree string, open Opener, entries []fstree.Entry) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.trees[tree]
	if st == nil {
		st = &servedTree{open: open, byHash: map[string]fstree.Entry{}}
		s.trees[tree] = st
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.added == nil {
		st.added = map[string]fstree.Entry{}
	}
	for _, e := range entries {
		if e.Kind == fstree.KindFile {
			st.added[e.Hash] = e
		}
	}
}

// Withdraw stops serving tree (this node is no longer its source).
func (s *Server) Withdraw(tree string) {
	s.mu.Lock()
	delete(s.trees, tree)
	s.mu.Unlock()
}

// Run answers until ctx ends.
func (s *Server) Run(ctx context.Context) error {
	sem := make(chan struct{}, answering)
	var wg sync.WaitGroup
	sub, err := s.nc.Subscribe(s.subject, func(m *nats.Msg) {
		if m.Reply == "" {
			return
		}
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			return
		}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			s.answer(m)
		}()
	})
	if err != nil {
		return fmt.Errorf("serve contents on %s: %w", s.subject, err)
	}
	<-ctx.Done()
	_ = sub.Unsubscribe()
	wg.Wait()
	return nil
}

func (s *Server) answer(m *nats.Msg) {
	req, err := events.DecodeContentRequest(m.Data)
	if err == nil && req.Group != s.group {
		err = fmt.Errorf("%w: group %q is not served here", events.ErrInvalidField, req.Group)
	}
	if err != nil {
		s.refuse(m.Subject, err)
		s.reply(m, nil, nil, err.Error())
		return
	}
	s.mu.RLock()
	t := s.trees[req.Tree]
	s.mu.RUnlock()
	if t == nil {
		// Not (or no longer) this tree's source: the requester turns to
		// the store.
		lengths := make([]int64, len(req.Ranges))
		for i := range lengths {
			lengths[i] = -1
		}
		s.reply(m, lengths, nil, "")
		return
	}
	budget := int(answerBudget(s.nc))
	body := s.buffer(budget)
	defer s.bufs.Put(&body)
	var lengths []int64
	var f *os.File
	var open string
	defer func() {
		if f != nil {
			f.Close()
		}
	}()
	for _, rg := range req.Ranges {
		room := budget - len(body)
		if room <= 0 || (rg.Length > int64(room) && len(lengths) > 0) {
			break // asked again for the rest
		}
		e, ok := t.lookup(rg.Hash)
		if !ok || rg.Offset >= e.Size {
			lengths = append(lengths, -1)
			continue
		}
		if open != e.Path {
			if f != nil {
				f.Close()
				f = nil
			}
			open = e.Path
			if f, err = t.open(e.Path); err != nil {
				s.log.Debug("content not readable", "path", e.Path, "err", err)
				open = ""
				lengths = append(lengths, -1)
				continue
			}
		}
		n := min(rg.Length, e.Size-rg.Offset, int64(room))
		start := len(body)
		body = body[:start+int(n)]
		got, err := f.ReadAt(body[start:], rg.Offset)
		if err != nil && !errors.Is(err, io.EOF) {
			s.log.Debug("content not readable", "path", e.Path, "err", err)
		}
		// A file that shrank since the scan answers short; the target's
		// hash check refuses it, as it would a changed file.
		body = body[:start+got]
		lengths = append(lengths, int64(got))
	}
	s.reply(m, lengths, body, "")
}

func (s *Server) buffer(size int) []byte {
	if p, ok := s.bufs.Get().(*[]byte); ok && cap(*p) >= size {
		return (*p)[:0]
	}
	return make([]byte, 0, size)
}

func (s *Server) reply(m *nats.Msg, lengths []int64, body []byte, refused string) {
	out := nats.NewMsg(m.Reply)
	if refused != "" {
		out.Header.Set(ErrorHeader, refused)
	} else {
		out.Header.Set(events.ContentLengthsHeader, events.FormatContentLengths(lengths))
		out.Data = body
	}
	if err := s.nc.PublishMsg(out); err != nil {
		s.log.Debug("content answer not sent", "err", err)
		return
	}
	s.served.Add(float64(len(body)))
}
