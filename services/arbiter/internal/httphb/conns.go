package httphb

import (
	"net"
	"net/netip"
	"sync"
)

// Defaults of the connection limits: a host posts over one connection at
// a time; the total bounds the descriptors an attacker can hold open (each
// for at most the header timeout).
const (
	DefaultConnsPerSource = 16
	DefaultMaxConns       = 1024
)

// LimitConns wraps the endpoint's listener: a connection beyond perSource
// open ones from its address, or beyond max in all, is closed at once,
// logged and counted (too_many_connections), before any byte is read.
func (h *Handler) LimitConns(ln net.Listener, perSource, max int) net.Listener {
	if perSource <= 0 {
		perSource = DefaultConnsPerSource
	}
	if max <= 0 {
		max = DefaultMaxConns
	}
	return &connLimit{Listener: ln, h: h, perSource: perSource, max: max, open: map[netip.Addr]int{}}
}

type connLimit struct {
	net.Listener
	h              *Handler
	perSource, max int

	mu    sync.Mutex
	total int
	open  map[netip.Addr]int
}

func (l *connLimit) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		src := hostOf(c.RemoteAddr().String())
		l.mu.Lock()
		ok := l.total < l.max && l.open[src] < l.perSource
		if ok {
			l.total++
			l.open[src]++
		}
		l.mu.Unlock()
		if ok {
			return &limitedConn{Conn: c, l: l, src: src}, nil
		}
		l.h.refused.WithLabelValues(refusedConns).Inc()
		l.h.log.Warn("http heartbeat refused", "source", c.RemoteAddr().String(), "reason", refusedConns,
			"err", "too many open connections")
		_ = c.Close()
	}
}

func (l *connLimit) release(src netip.Addr) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.total--
	if l.open[src]--; l.open[src] <= 0 {
		delete(l.open, src)
	}
}

type limitedConn struct {
	net.Conn
	l    *connLimit
	src  netip.Addr
	once sync.Once
}

func (c *limitedConn) Close() error {
	c.once.Do(func() { c.l.release(c.src) })
	return c.Conn.Close()
}
