package ami

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"
)

// Redial backoff: quick enough that a restarted Asterisk is found again
// within a probe interval or two, slow enough not to hammer one that is down.
const (
	redialMin = 50 * time.Millisecond
	redialMax = 2 * time.Second
)

// Session is a Client that comes back: it owns at most one connection,
// dials on first use, and dials again (with backoff) once the connection has
// ended. Callers just call Action. It is safe for concurrent use.
//
// An action whose connection ends while it waits fails with ErrClosed and is
// not resent, because not every action is safe to run twice; the next call
// uses a new connection. A timed-out action keeps the connection: a
// deadlocked Asterisk would not answer on a new one either.
//
// With Config.Events the session follows events: it connects at once and
// again after every loss, without waiting for an action, and hands the
// events of all its connections, in the order Asterisk sent them, to one
// queue (Events) of Config.EventBuffer events. Whatever the queue cannot
// take, because its reader fell behind, is dropped, counted
// (DroppedEvents) and signalled on Gaps, as is every new connection (what
// Asterisk raised while there was none is lost): after a signal the reader
// reads again, whole, whatever it follows. Nothing is dropped silently,
// and answers to actions never wait for the events' reader.
type Session struct {
	cfg Config
	log *slog.Logger

	// sink, life and kept are set when the session follows events: the
	// queue, the life of the goroutine that keeps a connection up, and its
	// end.
	sink    *eventSink
	life    context.Context
	endLife context.CancelFunc
	kept    chan struct{}

	// dialing is a one-slot semaphore (waitable with ctx, unlike a mutex):
	// one caller at a time checks and replaces the connection. The backoff
	// state below it is only touched while holding it.
	dialing  chan struct{}
	failures int
	nextDial time.Time
	lastErr  error

	mu     sync.Mutex // guards cur and closed, for Close
	cur    *Client
	closed bool
}

// NewSession returns a session for cfg; it does not dial until the first
// action. logger may be nil.
func NewSession(cfg Config, logger *slog.Logger) *Session {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	s := &Session{cfg: cfg.withDefaults(), log: logger, dialing: make(chan struct{}, 1)}
	if s.cfg.Events {
		s.sink = newEventSink(s.cfg.EventBuffer)
		s.life, s.endLife = context.WithCancel(context.Background())
		s.kept = make(chan struct{})
		go s.keep()
	}
	return s
}

// Events is the queue of the events of every connection (Config.Events;
// nil otherwise). It is never closed: read it until you stop.
func (s *Session) Events() <-chan Event {
	if s.sink == nil {
		return nil
	}
	return s.sink.ch
}

// Gaps receives a signal whenever events may be missing: after each new
// connection and after events were dropped. One waiting signal stands for
// every gap since the last one was taken. Nil without Config.Events.
func (s *Session) Gaps() <-chan struct{} {
	if s.sink == nil {
		return nil
	}
	return s.sink.gaps
}

// DroppedEvents counts the events dropped because Events was full.
func (s *Session) DroppedEvents() uint64 {
	if s.sink == nil {
		return 0
	}
	return s.sink.dropped.Load()
}

// keep holds a connection open while the session follows events, dialing
// again (with backoff) after every loss, and signals a gap on each.
func (s *Session) keep() {
	defer close(s.kept)
	failures := 0
	for {
		c, err := s.client(s.life)
		if err != nil {
			if s.life.Err() != nil {
				return
			}
			// A refused login returns at once: wait before the next one.
			failures++
			t := time.NewTimer(Backoff(failures))
			select {
			case <-t.C:
			case <-s.life.Done():
				t.Stop()
				return
			}
			continue
		}
		failures = 0
		s.sink.gap()
		select {
		case <-c.Done():
		case <-s.life.Done():
			return
		}
	}
}

// eventSink is a following session's queue of events and its gap signal.
type eventSink struct {
	ch      chan Event
	gaps    chan struct{}
	dropped atomic.Uint64
}

func newEventSink(size int) *eventSink {
	return &eventSink{ch: make(chan Event, size), gaps: make(chan struct{}, 1)}
}

// put queues an event without ever waiting: a full queue drops it, counts
// it and signals a gap (the reader reads again what it follows).
func (k *eventSink) put(ev Event, log *slog.Logger) {
	select {
	case k.ch <- ev:
	default:
		if n := k.dropped.Add(1); n&(n-1) == 0 {
			// 1, 2, 4, 8, ...: a burst is told, not every event of it.
			log.Warn("ami event queue full, events dropped; a gap is signalled", "dropped", n, "capacity", cap(k.ch))
		}
		k.gap()
	}
}

func (k *eventSink) gap() {
	select {
	case k.gaps <- struct{}{}:
	default:
	}
}

// Action runs an action on the current connection, dialing first if there
// is none. Dialing is retried with backoff while ctx leaves time for another
// attempt; after that the last dial error is returned (ErrRefused, ErrAuth,
// …), so a probe learns why rather than just "timeout". A refused login is
// not retried within the call.
func (s *Session) Action(ctx context.Context, name string, fields ...Field) (Response, error) {
	for attempt := 0; ; attempt++ {
		c, err := s.client(ctx)
		if err != nil {
			return Response{}, err
		}
		r, err := c.Action(ctx, name, fields...)
		// The connection ended between the liveness check and the send: the
		// action never went out, so it is safe to run it once on a new one.
		if attempt == 0 && errors.Is(err, errUnsent) && errors.Is(err, ErrClosed) && ctx.Err() == nil {
			continue
		}
		return r, err
	}
}

// client returns a live connection, dialing as needed.
func (s *Session) client(ctx context.Context) (*Client, error) {
	select {
	case s.dialing <- struct{}{}:
	case <-ctx.Done():
		return nil, ctxError(ctx, "connect to "+s.cfg.Addr)
	}
	defer func() { <-s.dialing }()

	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, fmt.Errorf("session %s: %w", s.cfg.Addr, ErrClosed)
	}
	c := s.cur
	s.mu.Unlock()
	if c != nil && c.alive() {
		return c, nil
	}
	if c != nil {
		s.log.Info("ami connection lost, dialing again", "addr", s.cfg.Addr, "err", c.Err())
		_ = c.Close()
		s.mu.Lock()
		s.cur = nil
		s.mu.Unlock()
	}
	for {
		if wait := time.Until(s.nextDial); wait > 0 {
			if dl, ok := ctx.Deadline(); ok && time.Until(dl) < wait && s.lastErr != nil {
				return nil, fmt.Errorf("session backing off %v: %w", wait.Round(time.Millisecond), s.lastErr)
			}
			t := time.NewTimer(wait)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return nil, ctxError(ctx, "connect to "+s.cfg.Addr)
			}
		}
		c, err := connect(ctx, s.cfg, s.log, s.sink)
		if err == nil {
			s.mu.Lock()
			defer s.mu.Unlock()
			if s.closed {
				_ = c.Close()
				return nil, fmt.Errorf("session %s: %w", s.cfg.Addr, ErrClosed)
			}
			if s.failures > 0 {
				s.log.Info("ami connected again", "addr", s.cfg.Addr, "failed_attempts", s.failures)
			}
			s.cur, s.failures, s.nextDial, s.lastErr = c, 0, time.Time{}, nil
			return c, nil
		}
		s.failures++
		s.lastErr = err
		s.nextDial = time.Now().Add(Backoff(s.failures))
		s.log.Warn("ami dial failed", "addr", s.cfg.Addr, "attempt", s.failures, "class", Classify(err), "err", err)
		if errors.Is(err, ErrAuth) || ctx.Err() != nil {
			return nil, err
		}
	}
}

// Backoff is the wait before redial number failures (from 1): it doubles
// from 50 ms to 2 s with ±20 % jitter — quick enough to find a restarted
// Asterisk within a probe or two, slow enough not to hammer one that refuses
// us (a wrong secret costs Asterisk a one-second sleep), and jittered so
// several probers do not redial a restarted PBX in lockstep.
func Backoff(failures int) time.Duration {
	d := redialMax
	if failures < 16 {
		d = min(redialMin<<(failures-1), redialMax)
	}
	return time.Duration(float64(d) * (0.8 + 0.4*rand.Float64()))
}

// Close ends the current connection (and, when following events, the
// goroutine that keeps one up); later actions fail with ErrClosed.
func (s *Session) Close() error {
	s.mu.Lock()
	s.closed = true
	c := s.cur
	s.cur = nil
	s.mu.Unlock()
	if s.endLife != nil {
		s.endLife()
		<-s.kept
	}
	if c != nil {
		return c.Close()
	}
	return nil
}
