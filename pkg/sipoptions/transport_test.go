package sipoptions

import (
	"bufio"
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// A lost request is sent again, identically, until an answer comes: the retransmission
// is the same transaction (same branch, Call-ID and CSeq), as RFC 3261 §17.1.2 requires.
func TestUDPRetransmitsUntilAnswered(t *testing.T) {
	var n atomic.Int32
	r := newResponder(t, func(req *message, _ string) [][]byte {
		if n.Add(1) < 3 {
			return nil // the first two are "lost"
		}
		return [][]byte{response(req, 200, "OK", nil)}
	})
	p, err := NewPingerWith(r.addr(), Options{T1: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	rep, err := p.Ping(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Status != 200 || rep.Sent != 3 {
		t.Fatalf("reply %+v, want 200 after 3 sends", rep)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.raws) != 3 || r.raws[0] != r.raws[1] || r.raws[1] != r.raws[2] {
		t.Fatalf("%d requests, want 3 identical retransmissions:\n%q", len(r.raws), r.raws)
	}
	// The reply's RTT counts from the first send, so a lossy path shows as slow.
	if rep.RTT < 20*time.Millisecond+40*time.Millisecond {
		t.Errorf("RTT %v should include the two retransmission intervals", rep.RTT)
	}
}

func TestUDPRetransmitIntervalsDouble(t *testing.T) {
	var mu sync.Mutex
	var at []time.Time
	r := newResponder(t, func(*message, string) [][]byte {
		mu.Lock()
		at = append(at, time.Now())
		mu.Unlock()
		return nil
	})
	p, err := NewPingerWith(r.addr(), Options{T1: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err = p.Ping(ctx)
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "sent 4 times") {
		t.Fatalf("err = %v, want a timeout after 4 sends (0, 20, 60, 140 ms)", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(at) != 4 {
		t.Fatalf("%d sends, want 4", len(at))
	}
	// Gaps of 20, 40 and 80 ms: each at least the interval, and growing.
	// Timestamps are taken where the copies arrive, so a copy delivered a
	// little late shortens the next gap: allow the receiver 5 ms of jitter.
	const jitter = 5 * time.Millisecond
	for i, want := range []time.Duration{20, 40, 80} {
		if gap := at[i+1].Sub(at[i]); gap < want*time.Millisecond-jitter {
			t.Errorf("gap %d = %v, want at least %v ms", i, gap, want)
		}
	}
}

func TestUDPNoRetransmitWhenDisabled(t *testing.T) {
	r := newResponder(t, func(*message, string) [][]byte { return nil })
	p, err := NewPingerWith(r.addr(), Options{T1: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 80*time.Millisecond)
	defer cancel()
	if _, err := p.Ping(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v", err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.reqs) != 1 {
		t.Fatalf("%d sends, want 1", len(r.reqs))
	}
}

// tcpResponder is an in-test SIP peer over TCP. reply decides what each request gets;
// returning nil for the connection closes it.
type tcpResponder struct {
	ln      net.Listener
	mu      sync.Mutex
	accepts int
	reqs    []*message
}

func newTCPResponder(t *testing.T, reply func(req *message) ([][]byte, bool)) *tcpResponder {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &tcpResponder{ln: ln}
	var wg sync.WaitGroup
	var conns sync.Map
	t.Cleanup(func() {
		ln.Close()
		conns.Range(func(k, _ any) bool { k.(net.Conn).Close(); return true })
		wg.Wait()
	})
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns.Store(c, true)
			r.mu.Lock()
			r.accepts++
			r.mu.Unlock()
			wg.Go(func() {
				defer c.Close()
				br := bufio.NewReader(c)
				for {
					m, err := readStreamMessage(br)
					if err != nil {
						return
					}
					r.mu.Lock()
					r.reqs = append(r.reqs, m)
					r.mu.Unlock()
					out, keep := reply(m)
					for _, b := range out {
						if _, err := c.Write(b); err != nil {
							return
						}
					}
					if !keep {
						return
					}
				}
			})
		}
	})
	return r
}

func (r *tcpResponder) addr() string { return r.ln.Addr().String() }

func TestTCPPingReusesConnection(t *testing.T) {
	r := newTCPResponder(t, func(req *message) ([][]byte, bool) {
		// CRLF keepalives, a stale answer and an answer with a body come first: the
		// framing must hold and only the matching reply count.
		body := strings.Replace(string(response(req, 200, "OK", nil, "Server-Node: body")), "Content-Length: 0", "Content-Length: 5", 1) + "hello"
		return [][]byte{
			[]byte("\r\n\r\n"),
			response(req, 200, "OK", withBranch(req, "z9hG4bKstale"), "Server-Node: stale"),
			[]byte(body[:20]), []byte(body[20:]),
			response(req, 401, "Unauthorized", nil, "Server-Node: right"),
		}, true
	})
	p, err := NewPingerWith(r.addr(), Options{Transport: TCP})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for i := range 3 {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		rep, err := p.Ping(ctx)
		cancel()
		if err != nil {
			t.Fatalf("ping %d: %v", i, err)
		}
		// The body-carrying 200 matches too (same transaction); whichever final reply
		// comes first wins, and it must not be the stale one.
		if rep.ServerNode != "body" || rep.Sent != 1 {
			t.Fatalf("ping %d: %+v", i, rep)
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.accepts != 1 {
		t.Fatalf("%d connections for 3 pings, want 1", r.accepts)
	}
	req := r.reqs[0]
	if !strings.HasPrefix(req.header("via"), "SIP/2.0/TCP "+p.LocalAddr().String()+";") || req.uri != "sip:"+r.addr()+";transport=tcp" {
		t.Fatalf("request %s, Via %q, local %s", req.uri, req.header("via"), p.LocalAddr())
	}
}

// A peer that closes the connection fails the waiting probe at once, not at its
// deadline, and the next probe dials again.
func TestTCPConnectionLossFailsFastAndRedials(t *testing.T) {
	var n atomic.Int32
	r := newTCPResponder(t, func(req *message) ([][]byte, bool) {
		if n.Add(1) == 1 {
			return nil, false
		}
		return [][]byte{response(req, 200, "OK", nil)}, true
	})
	p, err := NewPingerWith(r.addr(), Options{Transport: TCP})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	start := time.Now()
	if _, err := p.Ping(ctx); !errors.Is(err, ErrConnLost) {
		t.Fatalf("first ping: %v, want ErrConnLost", err)
	}
	if el := time.Since(start); el > 2*time.Second {
		t.Fatalf("connection loss noticed after %v", el)
	}
	if rep, err := p.Ping(ctx); err != nil || rep.Status != 200 {
		t.Fatalf("second ping: %+v %v", rep, err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.accepts != 2 {
		t.Fatalf("%d connections, want 2", r.accepts)
	}
}

func TestTCPRefused(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	p, err := NewPingerWith(addr, Options{Transport: TCP})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if _, err := p.Ping(ctx); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("err = %v, want ECONNREFUSED", err)
	}
}

// A TCP peer that accepts and never answers (a frozen PBX) costs the deadline, no more.
func TestTCPFrozenPeerTimesOut(t *testing.T) {
	r := newTCPResponder(t, func(*message) ([][]byte, bool) { return nil, true })
	p, err := NewPingerWith(r.addr(), Options{Transport: TCP})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	if _, err := p.Ping(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v", err)
	}
	if el := time.Since(start); el > time.Second {
		t.Fatalf("returned after %v", el)
	}
}

func TestBadTransport(t *testing.T) {
	if _, err := NewPingerWith("127.0.0.1:5060", Options{Transport: "sctp"}); err == nil {
		t.Fatal("sctp accepted")
	}
}
