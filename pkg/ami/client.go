package ami

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// defaultWriteTimeout bounds a write when the action's context has no
// deadline, so a peer that stopped reading cannot hold the write lock forever.
const defaultWriteTimeout = 3 * time.Second

// errUnsent marks an action that was never written, so Session may retry it
// on a fresh connection without sending it twice.
var errUnsent = errors.New("ami: action not sent")

// Client is one logged-in AMI connection. It is safe for concurrent use;
// actions from many goroutines are matched to their responses by ActionID.
// A Client does not reconnect: once Done is closed, every action fails with
// ErrClosed (use Session for a connection that comes back).
type Client struct {
	cfg Config
	log *slog.Logger
	raw net.Conn

	idPrefix string
	seq      atomic.Uint64

	wmu    sync.Mutex // one write at a time
	closed bool       // under wmu: Close was called

	mu      sync.Mutex
	waiters map[string]*waiter
	ended   bool
	endErr  error

	events  chan Event
	dropped atomic.Uint64
	// sink, when set (a Session following events), receives the
	// unsolicited events instead of events, across connections.
	sink *eventSink
	done chan struct{} // closed when the reader has stopped

	closeOnce sync.Once
}

type waiter struct {
	ch       chan struct{} // closed when resp/err are final
	resp     *message
	list     []Event
	complete *message
	err      error
}

// Dial connects and logs in. ctx bounds the dial and the login only; the
// client lives until Close or until the connection ends. logger may be nil.
//
// Errors: ErrRefused (nothing listening), ErrAuth (login refused), ErrTimeout
// (dial or login not answered within DialTimeout/LoginTimeout or ctx's
// deadline), ErrProtocol (not an AMI banner or answer), ErrClosed (the peer
// hung up during login).
func Dial(ctx context.Context, cfg Config, logger *slog.Logger) (*Client, error) {
	return connect(ctx, cfg, logger, nil)
}

// connect is Dial whose client hands its events to sink when it is set.
func connect(ctx context.Context, cfg Config, logger *slog.Logger, sink *eventSink) (*Client, error) {
	cfg = cfg.withDefaults()
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if strings.ContainsAny(cfg.Username, "\r\n") || strings.ContainsAny(cfg.Secret, "\r\n") {
		return nil, fmt.Errorf("ami: login to %s: the username or secret holds a line break", cfg.Addr)
	}
	if err := validEventSelection(cfg); err != nil {
		return nil, fmt.Errorf("login to %s: %w", cfg.Addr, err)
	}
	d := net.Dialer{Timeout: cfg.DialTimeout, KeepAlive: cfg.KeepAlive}
	raw, err := d.DialContext(ctx, "tcp", cfg.Addr)
	if err != nil {
		return nil, dialError(ctx, cfg.Addr, err)
	}
	// The login has a deadline of its own (Asterisk answers a wrong secret
	// only after 1 s, so it must be longer than that) and watches ctx.
	deadline := time.Now().Add(cfg.LoginTimeout)
	if dl, ok := ctx.Deadline(); ok && dl.Before(deadline) {
		deadline = dl
	}
	_ = raw.SetDeadline(deadline)
	stop := context.AfterFunc(ctx, func() { _ = raw.SetDeadline(time.Unix(1, 0)) })
	wr := newWireReader(raw)
	early, err := login(raw, wr, cfg)
	cancelled := !stop()
	if err == nil && cancelled {
		err = ctxError(ctx, "login to "+cfg.Addr)
	}
	if err != nil {
		_ = raw.Close()
		return nil, loginError(ctx, cfg, err)
	}
	_ = raw.SetDeadline(time.Time{})

	var id [4]byte
	_, _ = rand.Read(id[:])
	c := &Client{
		cfg:      cfg,
		log:      logger.With("ami", cfg.Addr),
		raw:      raw,
		idPrefix: "fan-" + hex.EncodeToString(id[:]),
		waiters:  map[string]*waiter{},
		events:   make(chan Event, cfg.EventBuffer),
		sink:     sink,
		done:     make(chan struct{}),
	}
	for _, m := range early {
		c.dispatch(m)
	}
	go c.read(wr)
	if cfg.Events && len(cfg.EventNames) > 0 {
		fctx, cancel := context.WithDeadline(ctx, deadline)
		err := c.addFilters(fctx, cfg.EventNames)
		cancel()
		if err != nil {
			_ = c.Close()
			return nil, fmt.Errorf("login to %s: %w", cfg.Addr, err)
		}
	}
	c.log.Debug("ami logged in", "user", cfg.Username)
	return c, nil
}

// addFilters asks Asterisk to send only the named events. A refusal (an
// older Asterisk, or a user without system write) leaves the events
// unfiltered: more to read, nothing lost.
func (c *Client) addFilters(ctx context.Context, names []string) error {
	for _, n := range names {
		r, err := c.Action(ctx, "Filter", F("Operation", "Add"), F("MatchCriteria", "name("+n+")"))
		if err != nil {
			return fmt.Errorf("event filter %s: %w", n, err)
		}
		if !r.Success() {
			c.log.Warn("ami event filter refused; events come unfiltered", "event", n, "message", r.Message())
		}
	}
	return nil
}

// validEventSelection refuses a mask or event name that would break the
// Login or the Filter action it is sent in.
func validEventSelection(cfg Config) error {
	if strings.ContainsAny(cfg.EventMask, "\r\n") {
		return errors.New("ami: the event mask holds a line break")
	}
	for _, n := range cfg.EventNames {
		if n == "" || strings.ContainsAny(n, "\r\n(),: ") {
			return fmt.Errorf("ami: event name %q cannot be filtered on", n)
		}
	}
	return nil
}

// login reads the banner, sends Login ("Events: off" unless events are
// wanted) and reads its answer. Events that came before the answer are
// returned for the reader to deliver.
func login(raw net.Conn, wr *wireReader, cfg Config) ([]*message, error) {
	if _, err := wr.banner(); err != nil {
		return nil, err
	}
	fields := []Field{F("Username", cfg.Username), F("Secret", cfg.Secret)}
	switch {
	case !cfg.Events:
		fields = append(fields, F("Events", "off"))
	case cfg.EventMask != "":
		fields = append(fields, F("Events", cfg.EventMask))
	}
	if _, err := raw.Write(encodeAction("Login", "", fields)); err != nil {
		return nil, err
	}
	var early []*message
	for {
		m, err := wr.next()
		if err != nil {
			return nil, err
		}
		switch {
		case m.isEvent() && len(early) < cfg.EventBuffer:
			early = append(early, m)
		case m.isEvent():
		case m.isSuccess():
			return early, nil
		case strings.EqualFold(m.get("Response"), "Error"):
			return nil, fmt.Errorf("%w: %s", ErrAuth, m.get("Message"))
		default:
			return nil, fmt.Errorf("%w: login answered %q", ErrProtocol, truncate([]byte(m.String()), 120))
		}
	}
}

func dialError(ctx context.Context, addr string, err error) error {
	var ne net.Error
	switch {
	case ctx.Err() != nil:
		return ctxError(ctx, "dial "+addr)
	case errors.Is(err, syscall.ECONNREFUSED):
		return fmt.Errorf("dial %s: %w", addr, ErrRefused)
	case errors.As(err, &ne) && ne.Timeout():
		return fmt.Errorf("dial %s: %w: %w", addr, ErrTimeout, err)
	}
	return fmt.Errorf("dial %s: %w", addr, err)
}

// loginError says why the login failed in this package's terms.
func loginError(ctx context.Context, cfg Config, err error) error {
	var ne net.Error
	switch {
	case errors.Is(err, ErrAuth):
		return fmt.Errorf("login to %s as %q: %w", cfg.Addr, cfg.Username, err)
	case ctx.Err() != nil:
		return ctxError(ctx, "login to "+cfg.Addr)
	case errors.As(err, &ne) && ne.Timeout():
		return fmt.Errorf("login to %s: %w: no answer within %v", cfg.Addr, ErrTimeout, cfg.LoginTimeout)
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, syscall.ECONNRESET):
		return fmt.Errorf("login to %s: %w by the peer", cfg.Addr, ErrClosed)
	case errors.Is(err, ErrProtocol):
		return fmt.Errorf("login to %s: %w", cfg.Addr, err)
	case errors.Is(err, errMalformed):
		return fmt.Errorf("login to %s: %w: %w", cfg.Addr, ErrProtocol, err)
	}
	return fmt.Errorf("login to %s: %w", cfg.Addr, err)
}

// read is the one goroutine that reads the connection after login. It
// never waits for a consumer (answers go to their waiter, events to a
// channel that drops when full), so nothing it has read is lost however
// late the scheduler runs it.
func (c *Client) read(wr *wireReader) {
	var cause error
	for {
		m, err := wr.next()
		if errors.Is(err, errMalformed) {
			// Its ActionID is lost with it, so its caller will time out.
			c.log.Warn("ami unparsable message dropped", "err", err)
			continue
		}
		if err != nil {
			cause = err
			break
		}
		c.dispatch(m)
	}
	c.end(cause)
	_ = c.raw.Close()
	close(c.events)
	close(c.done)
}

func (c *Client) dispatch(m *message) {
	if id := m.actionID(); id != "" {
		c.mu.Lock()
		w := c.waiters[id]
		switch {
		case w == nil:
		case w.resp == nil && !m.isEvent():
			w.resp = m
			if !isListStart(m) {
				c.finishLocked(id, w, nil)
			}
			c.mu.Unlock()
			return
		case w.resp != nil && m.isEvent():
			if isListComplete(m) {
				w.complete = m
				c.finishLocked(id, w, nil)
			} else {
				w.list = append(w.list, Event{msg: m})
			}
			c.mu.Unlock()
			return
		}
		c.mu.Unlock()
		if !m.isEvent() {
			c.log.Debug("ami late or unknown response dropped", "action_id", id)
			return
		}
	}
	if !m.isEvent() {
		c.log.Debug("ami response without ActionID dropped", "response", m.get("Response"))
		return
	}
	if c.sink != nil {
		c.sink.put(Event{msg: m}, c.log)
		return
	}
	select {
	case c.events <- Event{msg: m}:
	default:
		if c.dropped.Add(1) == 1 {
			c.log.Warn("ami event buffer full, dropping events", "capacity", cap(c.events))
		}
	}
}

func (c *Client) finishLocked(id string, w *waiter, err error) {
	w.err = err
	delete(c.waiters, id)
	close(w.ch)
}

// end fails every waiting action; the connection is gone.
func (c *Client) end(cause error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ended {
		return
	}
	c.ended = true
	if cause == nil {
		c.endErr = ErrClosed
	} else {
		c.endErr = fmt.Errorf("%w: %w", ErrClosed, cause)
	}
	for id, w := range c.waiters {
		c.finishLocked(id, w, c.endErr)
	}
	c.log.Debug("ami connection ended", "cause", cause)
}

// Action sends an action and waits for its response until ctx ends. The
// ActionID is added here; do not pass one. A Response: Error is returned
// as a Response, not an error: what it means is up to the caller.
//
// Errors: ErrTimeout (ctx deadline passed: the PBX did not answer), ErrClosed
// (the connection ended first), or ctx's error if it was cancelled.
func (c *Client) Action(ctx context.Context, name string, fields ...Field) (Response, error) {
	if err := validate(name, fields); err != nil {
		return Response{}, fmt.Errorf("%s: %w", name, errors.Join(err, errUnsent))
	}
	if ctx.Err() != nil {
		return Response{}, errors.Join(ctxError(ctx, "action "+name), errUnsent)
	}
	id := c.idPrefix + "-" + strconv.FormatUint(c.seq.Add(1), 10)
	msg := encodeAction(name, id, fields)
	w := &waiter{ch: make(chan struct{})}
	c.mu.Lock()
	if c.ended {
		err := c.endErr
		c.mu.Unlock()
		return Response{}, fmt.Errorf("action %s: %w", name, errors.Join(err, errUnsent))
	}
	c.waiters[id] = w
	c.mu.Unlock()

	if err := c.send(ctx, msg); err != nil {
		c.forget(id)
		if ctx.Err() != nil {
			return Response{}, ctxError(ctx, "action "+name)
		}
		// A write that fails leaves the stream in an unknown state.
		_ = c.raw.Close()
		return Response{}, fmt.Errorf("action %s: %w", name, err)
	}
	select {
	case <-w.ch:
		if w.err != nil {
			return Response{}, fmt.Errorf("action %s: %w", name, w.err)
		}
		return Response{msg: w.resp, events: w.list, complete: w.complete}, nil
	case <-ctx.Done():
		c.forget(id)
		return Response{}, ctxError(ctx, "action "+name)
	}
}

// forget drops a waiter whose caller gave up; a late response is discarded.
func (c *Client) forget(id string) {
	c.mu.Lock()
	delete(c.waiters, id)
	c.mu.Unlock()
}

func (c *Client) send(ctx context.Context, b []byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.closed {
		return errors.Join(ErrClosed, errUnsent)
	}
	dl, ok := ctx.Deadline()
	if !ok {
		dl = time.Now().Add(defaultWriteTimeout)
	}
	_ = c.raw.SetWriteDeadline(dl)
	if _, err := c.raw.Write(b); err != nil {
		return fmt.Errorf("%w: %w", ErrClosed, err)
	}
	return nil
}

// validate refuses what would break AMI framing: a CR or LF would end the
// header (or the message) early and let a value inject headers.
func validate(name string, fields []Field) error {
	if name == "" || strings.ContainsAny(name, "\r\n:") {
		return fmt.Errorf("ami: invalid action name %q", name)
	}
	for _, f := range fields {
		if f.Name == "" || strings.ContainsAny(f.Name, "\r\n: ") || strings.ContainsAny(f.Value, "\r\n") {
			return fmt.Errorf("ami: invalid field %q: %q", f.Name, f.Value)
		}
		if strings.EqualFold(f.Name, "ActionID") || strings.EqualFold(f.Name, "Action") {
			return fmt.Errorf("ami: field %q is set by the client", f.Name)
		}
	}
	return nil
}

// Events delivers unsolicited events (Config.Events) and events that came
// after their action's caller gave up. It is closed when the connection
// ends. When nobody reads it, events are dropped rather than delaying
// responses; DroppedEvents counts them.
func (c *Client) Events() <-chan Event { return c.events }

// DroppedEvents is the number of events dropped because Events was full.
func (c *Client) DroppedEvents() uint64 { return c.dropped.Load() }

// Done is closed when the connection has ended (peer closed it, it failed,
// or Close was called).
func (c *Client) Done() <-chan struct{} { return c.done }

// Err says why the connection ended, once Done is closed; nil before.
func (c *Client) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.endErr
}

// Close ends the connection, fails waiting actions with ErrClosed and
// returns once the reader goroutine has stopped. It does not send Logoff:
// a health checker's session is not worth a round trip to a sick PBX.
func (c *Client) Close() error {
	c.closeOnce.Do(func() {
		// Closing first also ends a write stuck on a peer that stopped reading.
		_ = c.raw.Close()
		<-c.done
		c.wmu.Lock()
		c.closed = true
		c.wmu.Unlock()
	})
	return nil
}

func (c *Client) alive() bool {
	select {
	case <-c.done:
		return false
	default:
		return true
	}
}
