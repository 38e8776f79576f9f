// Package ami is fan's client for the Asterisk Manager Interface. It reads
// the wire itself (docs/asterisk22.md says what Asterisk 22 sends and what a
// client must not do with it). It frames the stream and keeps the limits
// itself; each message read is parsed into, and each action built as, a
// goami2.Message (github.com/staskobzar/goami2), whose Client fan does not
// use:
//
//   - Login has its own deadline (LoginTimeout, default 3 s), so a wrong
//     password (which Asterisk answers only after sleeping 1 s) comes back
//     as ErrAuth, never as a timeout.
//   - The login and the reader after it share one buffer, so an event that
//     arrives in the login answer's segment (FullyBooted) is kept.
//   - One goroutine per connection reads and hands each message over
//     without ever waiting: responses go to their caller by ActionID,
//     unsolicited events to a bounded channel that drops (and counts) when
//     nobody reads it. Nothing read is dropped because the scheduler ran
//     the reader late. Login says "Events: off" unless asked otherwise.
//   - Lines, messages and header counts are bounded, so a hostile listener
//     on the AMI port cannot make the client buffer without end.
//   - Every action is bounded by its context: a deadlocked Asterisk that
//     accepted TCP and answers nothing gives ErrTimeout, never a hang. Dials
//     use TCP keepalive so a vanished host is noticed too.
//   - Session owns one connection at a time and dials again, with backoff,
//     after the connection ends. With Config.Events it follows events: it
//     keeps a connection up by itself, hands the events of all its
//     connections to one bounded queue, and signals a gap (Gaps) on every
//     new connection and every event the queue had no room for (counted,
//     never dropped silently), so its reader knows when to read whole
//     again what it follows.
//   - Close releases the connection and every goroutine.
//
// Each error callers branch on is a sentinel (ErrAuth, ErrTimeout,
// ErrRefused, ErrProtocol, ErrUnhealthy, ErrClosed) and Classify maps any
// error to the events.ErrorClass a probe result carries.
package ami

import (
	"context"
	"errors"
	"fmt"
	"net"
	"syscall"
	"time"

	"github.com/fanpbx/fan/pkg/events"
)

// Sentinel errors; every error this package returns wraps at most one of them.
var (
	// ErrAuth: the PBX refused the login (wrong user or secret).
	ErrAuth = errors.New("ami: authentication failed")
	// ErrTimeout: no answer within the deadline (dial, login or action).
	ErrTimeout = errors.New("ami: timeout")
	// ErrRefused: nothing listens on the address.
	ErrRefused = errors.New("ami: connection refused")
	// ErrProtocol: the peer answered something that is not the AMI we expect.
	ErrProtocol = errors.New("ami: protocol error")
	// ErrUnhealthy: the PBX answered, and the answer means it is not working
	// (Response: Error to a health check or a Reload). Such errors are
	// *ActionError values carrying Asterisk's message.
	ErrUnhealthy = errors.New("ami: unhealthy answer")
	// ErrClosed: the connection ended (peer closed it, or Close was called)
	// before the answer came.
	ErrClosed = errors.New("ami: connection closed")
)

// Config says where and how to connect. Addr, Username and Secret are required.
type Config struct {
	Addr     string // host:port of the AMI listener
	Username string
	Secret   string
	// DialTimeout bounds the TCP connect; default 3 s.
	DialTimeout time.Duration
	// LoginTimeout bounds banner, Login and its answer together; default 3 s.
	// Keep it above 1 s: Asterisk answers a wrong secret after 1 s.
	LoginTimeout time.Duration
	// KeepAlive is the TCP keepalive period; default 10 s.
	KeepAlive time.Duration
	// Events asks for unsolicited events (Login without "Events: off").
	Events bool
	// EventMask, with Events, is the Login's Events value: the classes of
	// events wanted ("system"). Empty asks for every class the user may
	// read.
	EventMask string
	// EventNames, with Events, narrows the events to these names: right
	// after the login each connection adds a session filter per name
	// (Action: Filter, MatchCriteria: name(<name>); Asterisk 22), so
	// Asterisk does not even send the others. A filter Asterisk refuses
	// is logged and the events come unfiltered.
	EventNames []string
	// EventBuffer is the capacity of the events channel; default 64.
	EventBuffer int
}

func (c Config) withDefaults() Config {
	if c.DialTimeout <= 0 {
		c.DialTimeout = 3 * time.Second
	}
	if c.LoginTimeout <= 0 {
		c.LoginTimeout = 3 * time.Second
	}
	if c.KeepAlive <= 0 {
		c.KeepAlive = 10 * time.Second
	}
	if c.EventBuffer <= 0 {
		c.EventBuffer = 64
	}
	return c
}

// ActionError is a Response: Error to an action whose error means failure.
// It matches ErrUnhealthy with errors.Is.
type ActionError struct {
	Action   string
	Message  string // Asterisk's Message field
	Response Response
}

func (e *ActionError) Error() string {
	// ErrUnhealthy's text carries the package's prefix already.
	return fmt.Sprintf("%v: %s: %s", ErrUnhealthy, e.Action, e.Message)
}

// Is makes errors.Is(err, ErrUnhealthy) true.
func (e *ActionError) Is(target error) bool { return target == ErrUnhealthy }

// Classify maps an error from this package (or from net) to the class a
// probe result reports. A nil error has no class.
func Classify(err error) events.ErrorClass {
	var ne net.Error
	switch {
	case err == nil:
		return ""
	case errors.Is(err, ErrAuth):
		return events.ErrorAuth
	case errors.Is(err, ErrTimeout), errors.Is(err, context.DeadlineExceeded),
		errors.As(err, &ne) && ne.Timeout():
		return events.ErrorTimeout
	case errors.Is(err, ErrRefused), errors.Is(err, syscall.ECONNREFUSED):
		return events.ErrorRefused
	case errors.Is(err, ErrUnhealthy):
		return events.ErrorUnhealth
	case errors.Is(err, ErrProtocol):
		return events.ErrorProtocol
	}
	return events.ErrorOther
}

// ctxError turns an ended context into this package's error: a deadline is
// ErrTimeout (and still context.DeadlineExceeded), a cancel stays a cancel.
func ctxError(ctx context.Context, what string) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return fmt.Errorf("%s: %w (%w)", what, ErrTimeout, ctx.Err())
	}
	return fmt.Errorf("%s: %w", what, ctx.Err())
}
