package check

import (
	"context"
	"fmt"
	"net"
	"time"
)

// TCP is healthy when a connection to the address completes in time. It
// proves a listener, not a working service: prefer a deeper check where one
// exists.
type TCP struct{ addr string }

func NewTCP(addr string) *TCP { return &TCP{addr: addr} }

func (t *TCP) Kind() string   { return "tcp" }
func (t *TCP) Target() string { return t.addr }

func (t *TCP) Run(ctx context.Context) Result {
	start := time.Now()
	// No keepalive: the connection lives for one round trip, and turning it
	// on costs four setsockopt calls per run.
	d := net.Dialer{KeepAlive: -1}
	c, err := d.DialContext(ctx, "tcp", t.addr)
	if err != nil {
		return finish(start, fmt.Errorf("tcp connect %s: %w", t.addr, err))
	}
	_ = c.Close()
	return finish(start, nil)
}

func (t *TCP) Close() error { return nil }
