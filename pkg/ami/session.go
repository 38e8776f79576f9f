package ami

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
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
type Session struct {
	cfg Config
	log *slog.Logger

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
	return &Session{cfg: cfg.withDefaults(), log: logger, dialing: make(chan struct{}, 1)}
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
		return nil, fmt.Errorf("ami: session %s: %w", s.cfg.Addr, ErrClosed)
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
				return nil, fmt.Errorf("ami: session backing off %v: %w", wait.Round(time.Millisecond), s.lastErr)
			}
			t := time.NewTimer(wait)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return nil, ctxError(ctx, "connect to "+s.cfg.Addr)
			}
		}
		c, err := Dial(ctx, s.cfg, s.log)
		if err == nil {
			s.mu.Lock()
			defer s.mu.Unlock()
			if s.closed {
				_ = c.Close()
				return nil, fmt.Errorf("ami: session %s: %w", s.cfg.Addr, ErrClosed)
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

// Close ends the current connection; later actions fail with ErrClosed.
func (s *Session) Close() error {
	s.mu.Lock()
	s.closed = true
	c := s.cur
	s.cur = nil
	s.mu.Unlock()
	if c != nil {
		return c.Close()
	}
	return nil
}
