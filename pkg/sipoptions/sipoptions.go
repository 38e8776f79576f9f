// Package sipoptions is a SIP OPTIONS pinger over UDP and TCP for fan's prober, lab,
// end-to-end tests and failover benchmark. It answers one question — who, if anyone,
// answers SIP at this address right now, and how fast — using only the standard library.
//
// A reply counts only if its top Via branch, Call-ID and CSeq (number and method) match a
// request this client sent, so late replies to an earlier probe, strays and garbage are
// ignored instead of being mistaken for the current answer. Provisional (1xx) replies are
// skipped; the first final reply wins.
//
// Over UDP a request is retransmitted like RFC 3261's non-INVITE client transaction
// (timer E: T1, doubling up to T2) until the caller's deadline, so one lost datagram does
// not fail a probe. The caller's context is the whole deadline (timer F): a probe never
// outlives it. Over TCP the pinger keeps one connection, dials again after it breaks, and
// fails the probes waiting on a broken connection at once instead of at their deadline.
package sipoptions

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// DefaultTimeout applies when the context passed to Ping has no deadline.
const DefaultTimeout = time.Second

// RFC 3261 timers for UDP retransmission of a non-INVITE request (§17.1.2.2).
const (
	DefaultT1 = 500 * time.Millisecond
	T2        = 4 * time.Second
)

// ErrClosed is returned by Ping on a closed Pinger.
var ErrClosed = errors.New("sipoptions: pinger closed")

// ErrRefused is returned, with Options.FailFast, when the target reports
// that nothing listens on its port (ICMP port unreachable).
var ErrRefused = errors.New("sipoptions: refused")

// ErrConnLost is returned by a TCP Ping whose connection ended before the answer came.
var ErrConnLost = errors.New("sipoptions: connection lost")

// Transport is how requests travel.
type Transport string

const (
	UDP Transport = "udp"
	TCP Transport = "tcp"
)

func (t Transport) viaName() string {
	if t == TCP {
		return "TCP"
	}
	return "UDP"
}

// Options tune a Pinger. The zero value is UDP with RFC 3261's T1.
type Options struct {
	// Transport is UDP (default) or TCP.
	Transport Transport
	// T1 is the first UDP retransmission interval; each later one doubles, up to T2.
	// Zero means DefaultT1; negative sends each request once. A probe with a short
	// deadline wants a short T1, or it never retransmits.
	T1 time.Duration
	// FailFast connects the UDP socket to the target, so an ICMP port
	// unreachable (a SIP stack that died, its port closed) fails the probes
	// in flight at once with ErrRefused instead of at their deadline. The
	// price: a late ICMP error can fail one probe sent after the port came
	// back, which rise/fall hysteresis absorbs. Health checks want it; a
	// pinger that must not misreport a single probe does not.
	FailFast bool
}

// Reply is a matched final response.
type Reply struct {
	Status int
	Reason string
	// ServerNode is the Server-Node header, which fan's lab Kamailio uses to name the
	// node that answered; empty if absent.
	ServerNode string
	// RTT runs from just before the request was first written to when the reply was read.
	RTT time.Duration
	// From is the source of the reply.
	From netip.AddrPort
	// Sent is how many times the request went out (1 plus UDP retransmissions).
	Sent int
}

// Pinger probes one target over one socket (UDP) or one connection at a time (TCP), so
// high-rate probing (every few ms) does not churn ports and conntrack. Pings may run
// concurrently. The socket belongs to the network namespace of the thread that called
// NewPinger (UDP) or Ping (TCP dials lazily).
type Pinger struct {
	transport Transport
	t1        time.Duration
	target    netip.AddrPort
	local     netip.AddrPort // UDP: the socket; TCP: the source address, port 0
	seq       atomic.Uint32

	udp       *net.UDPConn
	connected bool // FailFast: the UDP socket is connected to target

	// dialing is a one-slot semaphore (waitable with a context, unlike a mutex):
	// one Ping at a time replaces a broken TCP connection.
	dialing chan struct{}

	mu      sync.Mutex
	tcp     *tcpConn          // current TCP connection; nil until dialed or once broken
	pending map[string]*probe // by branch
	closed  bool
	done    chan struct{}
}

type tcpConn struct {
	c     *net.TCPConn
	local netip.AddrPort
	wmu   sync.Mutex // one request on the stream at a time
}

type probe struct {
	callID string
	cseq   uint32
	sent   time.Time
	conn   *tcpConn // TCP: the connection the request went out on
	ch     chan outcome
}

type outcome struct {
	reply Reply
	err   error
}

// NewPinger makes a UDP pinger for target ("ip:port") with RFC 3261's T1. The local
// address is the one the routing table picks for target, and appears in Via, From and
// Contact.
func NewPinger(target string) (*Pinger, error) {
	return NewPingerWith(target, Options{})
}

// NewPingerWith makes a pinger for target ("ip:port") with the given options.
func NewPingerWith(target string, o Options) (*Pinger, error) {
	if o.Transport == "" {
		o.Transport = UDP
	}
	if o.Transport != UDP && o.Transport != TCP {
		return nil, fmt.Errorf("sipoptions: transport %q: want udp or tcp", o.Transport)
	}
	if o.T1 == 0 {
		o.T1 = DefaultT1
	}
	dst, err := netip.ParseAddrPort(target)
	if err != nil {
		return nil, fmt.Errorf("target %q: %w", target, err)
	}
	dst = netip.AddrPortFrom(dst.Addr().Unmap(), dst.Port())
	// A connected socket is only a route lookup here: it tells us the source address
	// without sending anything.
	probeConn, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(dst))
	if err != nil {
		return nil, fmt.Errorf("route to %s: %w", dst, err)
	}
	src := probeConn.LocalAddr().(*net.UDPAddr).AddrPort()
	probeConn.Close()
	p := &Pinger{
		transport: o.Transport,
		t1:        o.T1,
		target:    dst,
		local:     netip.AddrPortFrom(src.Addr().Unmap(), 0),
		dialing:   make(chan struct{}, 1),
		pending:   map[string]*probe{},
		done:      make(chan struct{}),
	}
	if o.Transport == TCP {
		return p, nil
	}
	// Unconnected unless FailFast: a connected UDP socket turns an ICMP port
	// unreachable for one probe into a read error for whichever probe reads next.
	var conn *net.UDPConn
	if o.FailFast {
		conn, err = net.DialUDP("udp", net.UDPAddrFromAddrPort(p.local), net.UDPAddrFromAddrPort(dst))
		p.connected = true
	} else {
		conn, err = net.ListenUDP("udp", net.UDPAddrFromAddrPort(p.local))
	}
	if err != nil {
		return nil, fmt.Errorf("socket from %s: %w", src.Addr(), err)
	}
	p.udp = conn
	la := conn.LocalAddr().(*net.UDPAddr).AddrPort()
	p.local = netip.AddrPortFrom(la.Addr().Unmap(), la.Port())
	go p.readUDP()
	return p, nil
}

// Target is the probed address.
func (p *Pinger) Target() netip.AddrPort { return p.target }

// Transport is how the pinger sends.
func (p *Pinger) Transport() Transport { return p.transport }

// LocalAddr is the pinger's socket address. For TCP it is the current connection's
// address, or the source address with port 0 while there is none.
func (p *Pinger) LocalAddr() netip.AddrPort {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.tcp != nil {
		return p.tcp.local
	}
	return p.local
}

// Close releases the socket; pending Pings return ErrClosed.
func (p *Pinger) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	close(p.done)
	tc := p.tcp
	p.tcp = nil
	p.mu.Unlock()
	if tc != nil {
		_ = tc.c.Close()
	}
	if p.udp != nil {
		return p.udp.Close()
	}
	return nil
}

// Ping sends one OPTIONS and waits for its final reply until ctx is done (or
// DefaultTimeout without a deadline), retransmitting over UDP. A timeout wraps
// context.DeadlineExceeded; a refused TCP connection wraps syscall.ECONNREFUSED.
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
		ch:     make(chan outcome, 1),
	}
	var tc *tcpConn
	if p.transport == TCP {
		var err error
		if tc, err = p.tcpConn(ctx); err != nil {
			return Reply{}, err
		}
		pr.conn = tc
	}

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

	if tc != nil {
		return p.pingTCP(ctx, tc, pr, branch)
	}
	return p.pingUDP(ctx, pr, branch)
}

func (p *Pinger) pingUDP(ctx context.Context, pr *probe, branch string) (Reply, error) {
	msg := buildOptions(p.target, p.local, UDP, branch, randHex(8), pr.callID, pr.cseq)
	pr.sent = time.Now()
	sent := 1
	if err := p.writeUDP(msg); err != nil {
		if p.connected && errors.Is(err, syscall.ECONNREFUSED) {
			return Reply{}, fmt.Errorf("OPTIONS to %s: %w", p.target, ErrRefused)
		}
		return Reply{}, fmt.Errorf("OPTIONS to %s: %w", p.target, err)
	}
	// With retransmission off the timer channel stays nil and never fires.
	var retransmit <-chan time.Time
	interval := p.t1
	var t *time.Timer
	if interval > 0 {
		t = time.NewTimer(interval)
		defer t.Stop()
		retransmit = t.C
	}
	for {
		select {
		case o := <-pr.ch:
			o.reply.Sent = sent
			return o.reply, o.err
		case <-retransmit:
			// A send error here (ENOBUFS, a transient unreachable) is not final:
			// the deadline decides.
			_ = p.writeUDP(msg)
			sent++
			interval = min(2*interval, T2)
			t.Reset(interval)
		case <-ctx.Done():
			return Reply{}, fmt.Errorf("OPTIONS to %s (sent %d times): %w", p.target, sent, ctx.Err())
		case <-p.done:
			return Reply{}, ErrClosed
		}
	}
}

func (p *Pinger) pingTCP(ctx context.Context, tc *tcpConn, pr *probe, branch string) (Reply, error) {
	msg := buildOptions(p.target, tc.local, TCP, branch, randHex(8), pr.callID, pr.cseq)
	pr.sent = time.Now()
	tc.wmu.Lock()
	dl, _ := ctx.Deadline()
	_ = tc.c.SetWriteDeadline(dl)
	_, err := tc.c.Write(msg)
	tc.wmu.Unlock()
	if err != nil {
		// A partial write leaves the stream unusable for everyone.
		p.dropTCP(tc)
		if ctx.Err() != nil {
			return Reply{}, fmt.Errorf("OPTIONS to %s over tcp: %w", p.target, ctx.Err())
		}
		return Reply{}, fmt.Errorf("OPTIONS to %s over tcp: %w: %w", p.target, ErrConnLost, err)
	}
	select {
	case o := <-pr.ch:
		o.reply.Sent = 1
		return o.reply, o.err
	case <-ctx.Done():
		return Reply{}, fmt.Errorf("OPTIONS to %s over tcp: %w", p.target, ctx.Err())
	case <-p.done:
		return Reply{}, ErrClosed
	}
}

// tcpConn returns the live connection, dialing one within ctx if there is none.
func (p *Pinger) tcpConn(ctx context.Context) (*tcpConn, error) {
	select {
	case p.dialing <- struct{}{}:
	case <-ctx.Done():
		return nil, fmt.Errorf("connect to %s: %w", p.target, ctx.Err())
	}
	defer func() { <-p.dialing }()
	p.mu.Lock()
	tc, closed := p.tcp, p.closed
	p.mu.Unlock()
	if closed {
		return nil, ErrClosed
	}
	if tc != nil {
		return tc, nil
	}
	d := net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(p.local), KeepAlive: 10 * time.Second}
	c, err := d.DialContext(ctx, "tcp", p.target.String())
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", p.target, err)
	}
	la := c.LocalAddr().(*net.TCPAddr).AddrPort()
	tc = &tcpConn{c: c.(*net.TCPConn), local: netip.AddrPortFrom(la.Addr().Unmap(), la.Port())}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		_ = c.Close()
		return nil, ErrClosed
	}
	p.tcp = tc
	p.mu.Unlock()
	go p.readTCP(tc)
	return tc, nil
}

// dropTCP forgets a broken connection and fails every probe waiting on it.
func (p *Pinger) dropTCP(tc *tcpConn) {
	_ = tc.c.Close()
	p.mu.Lock()
	if p.tcp == tc {
		p.tcp = nil
	}
	var waiting []*probe
	for b, pr := range p.pending {
		if pr.conn == tc {
			waiting = append(waiting, pr)
			delete(p.pending, b)
		}
	}
	p.mu.Unlock()
	for _, pr := range waiting {
		pr.ch <- outcome{err: fmt.Errorf("OPTIONS to %s over tcp: %w", p.target, ErrConnLost)}
	}
}

func (p *Pinger) readTCP(tc *tcpConn) {
	defer p.dropTCP(tc)
	br := bufio.NewReaderSize(tc.c, 8192)
	for {
		m, err := readStreamMessage(br)
		// A malformed message loses the framing: the connection is done.
		if err != nil {
			return
		}
		p.deliver(m, time.Now(), p.target)
	}
}

func (p *Pinger) writeUDP(msg []byte) error {
	if p.connected {
		_, err := p.udp.Write(msg)
		return err
	}
	_, err := p.udp.WriteToUDPAddrPort(msg, p.target)
	return err
}

// refuseAll fails every probe in flight: on a connected socket an ICMP port
// unreachable can only be about the one target.
func (p *Pinger) refuseAll() {
	p.mu.Lock()
	var failed []*probe
	for branch, pr := range p.pending {
		failed = append(failed, pr)
		delete(p.pending, branch)
	}
	p.mu.Unlock()
	for _, pr := range failed {
		pr.ch <- outcome{err: fmt.Errorf("OPTIONS to %s: %w", p.target, ErrRefused)}
	}
}

func (p *Pinger) readUDP() {
	buf := make([]byte, 65535)
	for {
		n, from, err := p.udp.ReadFromUDPAddrPort(buf)
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
			if p.connected && errors.Is(err, syscall.ECONNREFUSED) {
				p.refuseAll()
			}
			continue
		}
		m, err := parseMessage(buf[:n])
		if err != nil {
			continue
		}
		p.deliver(m, now, netip.AddrPortFrom(from.Addr().Unmap(), from.Port()))
	}
}

// deliver hands a final response to the probe it answers, if any.
func (p *Pinger) deliver(m *message, now time.Time, from netip.AddrPort) {
	if m.status < 200 {
		return
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
		pr.ch <- outcome{reply: Reply{Status: m.status, Reason: m.reason, ServerNode: m.header("server-node"),
			RTT: now.Sub(pr.sent), From: from}}
	}
}

// Ping sends one OPTIONS over UDP to target ("ip:port") from a fresh socket.
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
