// Package sipoptions is a minimal SIP-over-UDP OPTIONS pinger for fan's lab, end-to-end
// tests and failover benchmark. It answers one question — who, if anyone, answers SIP at
// this address right now, and how fast — using only the standard library.
//
// A reply counts only if its top Via branch, Call-ID and CSeq (number and method) match a
// request this client sent, so late replies to an earlier probe, strays and garbage are
// ignored instead of being mistaken for the current answer. Provisional (1xx) replies are
// skipped; the first final reply wins.
package sipoptions

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultTimeout applies when the context passed to Ping has no deadline.
const DefaultTimeout = time.Second

// ErrClosed is returned by Ping on a closed Pinger.
var ErrClosed = errors.New("sipclient: pinger closed")

// Reply is a matched final response.
type Reply struct {
	Status int
	Reason string
	// ServerNode is the Server-Node header, which fan's lab Kamailio uses to name the
	// node that answered; empty if absent.
	ServerNode string
	// RTT runs from just before the request was written to when the reply was read.
	RTT time.Duration
	// From is the source of the reply.
	From netip.AddrPort
}

// Pinger probes one target over one UDP socket, so high-rate probing (every few ms) does
// not churn ports and conntrack. Pings may run concurrently. The socket belongs to the
// network namespace of the thread that called NewPinger.
type Pinger struct {
	conn   *net.UDPConn
	target netip.AddrPort
	local  netip.AddrPort
	seq    atomic.Uint32

	mu      sync.Mutex
	pending map[string]*probe // by branch
	closed  bool
	done    chan struct{}
}

type probe struct {
	callID string
	cseq   uint32
	sent   time.Time
	ch     chan Reply
}

// NewPinger makes a pinger for target ("ip:port"). The local address is the one the
// routing table picks for target, and appears in Via, From and Contact.
func NewPinger(target string) (*Pinger, error) {
	dst, err := netip.ParseAddrPort(target)
	if err != nil {
		return nil, fmt.Errorf("sipclient: target %q: %w", target, err)
	}
	dst = netip.AddrPortFrom(dst.Addr().Unmap(), dst.Port())
	// A connected socket is only a route lookup here: it tells us the source address
	// without sending anything.
	probeConn, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(dst))
	if err != nil {
		return nil, fmt.Errorf("sipclient: route to %s: %w", dst, err)
	}
	src := probeConn.LocalAddr().(*net.UDPAddr).AddrPort()
	probeConn.Close()
	// Unconnected on purpose: a connected UDP socket turns an ICMP port unreachable for
	// one probe into a read error for whichever probe reads next.
	conn, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(src.Addr().Unmap(), 0)))
	if err != nil {
		return nil, fmt.Errorf("sipclient: listen on %s: %w", src.Addr(), err)
	}
	p := &Pinger{
		conn:    conn,
		target:  dst,
		local:   conn.LocalAddr().(*net.UDPAddr).AddrPort(),
		pending: map[string]*probe{},
		done:    make(chan struct{}),
	}
	p.local = netip.AddrPortFrom(p.local.Addr().Unmap(), p.local.Port())
	go p.readLoop()
	return p, nil
}

// Target is the probed address.
func (p *Pinger) Target() netip.AddrPort { return p.target }

// LocalAddr is the pinger's socket address.
func (p *Pinger) LocalAddr() netip.AddrPort { return p.local }

// Close releases the socket; pending Pings return ErrClosed.
func (p *Pinger) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	close(p.done)
	p.mu.Unlock()
	return p.conn.Close()
}

// Ping sends one OPTIONS and waits for its final reply until ctx is done (or
// DefaultTimeout without a deadline). A timeout wraps context.DeadlineExceeded.
func (p *Pinger) Ping(ctx context.Context) (Reply, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultTimeout)
		defer cancel()
	}
	branch := "z9hG4bK" + randHex(12)
	pr := &probe{
		callID: randHex(16) + "@" + p.local.Addr().String(),
		cseq:   p.seq.Add(1),
		ch:     make(chan Reply, 1),
	}
	msg := buildOptions(p.target, p.local, branch, randHex(8), pr.callID, pr.cseq)

	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return Reply{}, ErrClosed
	}
	p.pending[branch] = pr
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.pending, branch)
		p.mu.Unlock()
	}()

	pr.sent = time.Now()
	if _, err := p.conn.WriteToUDPAddrPort(msg, p.target); err != nil {
		return Reply{}, fmt.Errorf("sipclient: OPTIONS to %s: %w", p.target, err)
	}
	select {
	case r := <-pr.ch:
		return r, nil
	case <-ctx.Done():
		return Reply{}, fmt.Errorf("sipclient: OPTIONS to %s: %w", p.target, ctx.Err())
	case <-p.done:
		return Reply{}, ErrClosed
	}
}

func (p *Pinger) readLoop() {
	buf := make([]byte, 65535)
	for {
		n, from, err := p.conn.ReadFromUDPAddrPort(buf)
		now := time.Now()
		if err != nil {
			select {
			case <-p.done:
				return
			default:
			}
			// Transient errors (e.g. ENOBUFS) must not end probing; a closed socket
			// is caught above.
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		m, err := parseMessage(buf[:n])
		if err != nil || m.status < 200 {
			continue
		}
		p.mu.Lock()
		pr, ok := p.pending[m.branch]
		if ok && pr.callID == m.callID && pr.cseq == m.cseq && m.cseqMethod == "OPTIONS" {
			delete(p.pending, m.branch)
		} else {
			ok = false
		}
		p.mu.Unlock()
		if ok {
			pr.ch <- Reply{Status: m.status, Reason: m.reason, ServerNode: m.header("server-node"),
				RTT: now.Sub(pr.sent), From: netip.AddrPortFrom(from.Addr().Unmap(), from.Port())}
		}
	}
}

// Ping sends one OPTIONS to target ("ip:port") from a fresh socket.
func Ping(ctx context.Context, target string) (Reply, error) {
	p, err := NewPinger(target)
	if err != nil {
		return Reply{}, err
	}
	defer p.Close()
	return p.Ping(ctx)
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // crypto/rand.Read never fails on Linux
	return hex.EncodeToString(b)
}
