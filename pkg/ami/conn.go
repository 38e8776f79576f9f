package ami

import (
	"bufio"
	"bytes"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// amiConn is the net.Conn goami2 gets. It exists because goami2's login
// cannot be configured:
//
//   - goami2 sets a fixed 1 s deadline for the login and clears the read
//     deadline when its reader starts. amiConn ignores goami2's deadline
//     calls; Dial and Client set deadlines on the real connection instead.
//   - goami2 reads the banner and the login answer with one Read each and
//     drops whatever else that Read returned (a FullyBooted event sent in the
//     same segment), or fails on half a message. During login amiConn hands
//     out exactly one banner line, then exactly one message, and keeps the
//     rest for the reader that starts afterwards.
//   - goami2's Login action has no way to add "Events: off"; amiConn adds it
//     to the Login goami2 writes.
//
// It also records why reading stopped, for error classification, and closes
// dead when the connection can no longer be read.
type amiConn struct {
	net.Conn // the real TCP connection
	br       *bufio.Reader
	events   bool // keep events: leave the Login alone

	// Only one goroutine reads at a time (goami2's login, then its reader,
	// started after login returns), so these need no lock.
	stage   int    // login units handed out: 0 none, 1 banner
	pending []byte // rest of a login unit that did not fit the caller's buffer

	inLogin atomic.Bool // also read by Write

	mu        sync.Mutex // never held across I/O
	loginResp []byte     // the login answer, to tell ErrAuth apart
	readErr   error      // first read error

	deadOnce sync.Once
	dead     chan struct{}
}

func newAMIConn(raw net.Conn, events bool) *amiConn {
	c := &amiConn{Conn: raw, br: bufio.NewReader(raw), events: events, dead: make(chan struct{})}
	c.inLogin.Store(true)
	return c
}

func (c *amiConn) Read(p []byte) (int, error) {
	if len(c.pending) > 0 {
		n := copy(p, c.pending)
		c.pending = c.pending[n:]
		return n, nil
	}
	if !c.inLogin.Load() {
		n, err := c.br.Read(p)
		if err != nil {
			c.fail(err)
		}
		return n, err
	}
	var unit []byte
	for {
		line, err := c.br.ReadBytes('\n')
		unit = append(unit, line...)
		if err != nil {
			c.fail(err)
			return 0, err
		}
		// The banner is one line; the login answer ends at a blank line.
		if c.stage == 0 || bytes.Equal(line, []byte("\r\n")) {
			break
		}
	}
	c.stage++
	if c.stage == 2 {
		c.mu.Lock()
		c.loginResp = unit
		c.mu.Unlock()
		c.inLogin.Store(false)
		// goami2's reader starts next and must not inherit the login deadline.
		_ = c.Conn.SetReadDeadline(time.Time{})
	}
	n := copy(p, unit)
	c.pending = unit[n:]
	return n, nil
}

func (c *amiConn) fail(err error) {
	c.mu.Lock()
	if c.readErr == nil {
		c.readErr = err
	}
	c.mu.Unlock()
	c.deadOnce.Do(func() { close(c.dead) })
}

var (
	loginAction = []byte("Action: Login\r\n")
	eventsOff   = []byte("Events: off\r\n\r\n")
)

func (c *amiConn) Write(p []byte) (int, error) {
	rewrite := c.inLogin.Load() && !c.events && bytes.HasPrefix(p, loginAction) && bytes.HasSuffix(p, []byte("\r\n\r\n"))
	if !rewrite {
		return c.Conn.Write(p)
	}
	out := append(bytes.Clone(p[:len(p)-2]), eventsOff...)
	if _, err := c.Conn.Write(out); err != nil {
		return 0, err
	}
	return len(p), nil
}

// Deadlines belong to Dial and Client, which set them on the real connection.
func (c *amiConn) SetDeadline(time.Time) error      { return nil }
func (c *amiConn) SetReadDeadline(time.Time) error  { return nil }
func (c *amiConn) SetWriteDeadline(time.Time) error { return nil }

// loginState reports what the login saw, after goami2 gave up on it.
func (c *amiConn) loginState() (resp []byte, readErr error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.loginResp, c.readErr
}

// err is why reading stopped, once dead is closed.
func (c *amiConn) err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.readErr
}
