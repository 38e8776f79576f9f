package sipoptions

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"
)

// closedPort returns a loopback UDP port nothing listens on.
func closedPort(t *testing.T) string {
	t.Helper()
	c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	addr := c.LocalAddr().String()
	c.Close()
	return addr
}

func TestFailFastReportsARefusedPortAtOnce(t *testing.T) {
	target := closedPort(t)
	p, err := NewPingerWith(target, Options{FailFast: true})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	start := time.Now()
	_, err = p.Ping(ctx)
	if !errors.Is(err, ErrRefused) {
		t.Fatalf("ping to a closed port: %v, want ErrRefused", err)
	}
	if took := time.Since(start); took > time.Second {
		t.Fatalf("refusal took %v: it should not wait for the deadline", took)
	}
	// The socket stays usable: a second probe is refused the same way.
	if _, err := p.Ping(ctx); !errors.Is(err, ErrRefused) {
		t.Fatalf("second ping: %v", err)
	}
}

func TestWithoutFailFastARefusedPortTimesOut(t *testing.T) {
	p, err := NewPingerWith(closedPort(t), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if _, err := p.Ping(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("unconnected pinger: %v, want the deadline (ICMP errors are not seen)", err)
	}
}
