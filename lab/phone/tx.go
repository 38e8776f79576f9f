package phone

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"time"
)

// RFC 3261 §17 transactions over UDP. A client transaction sends its
// request again on Timer A (INVITE: T1, doubling) or Timer E (others: T1,
// doubling up to T2, every T2 once a provisional answer came) until a
// final response, and gives up after 64×T1 (Timer B, Timer F). A final
// non-2xx answer to an INVITE is acknowledged by the transaction itself,
// and again for each retransmission of it during Timer D (32 s); a 2xx is
// acknowledged by the dialog (call.go). A server transaction answers a
// retransmitted request with its last response, and sends a non-2xx final
// answer to an INVITE again on Timer G (T1 doubling up to T2) until the
// ACK comes or Timer H (64×T1) runs out.

// ErrTimeout is a client transaction that got no final answer in 64×T1:
// RFC 3261 treats it as a 408.
var ErrTimeout = errors.New("no final answer (transaction timeout)")

const timerD = 32 * time.Second

type clientTx struct {
	key    string
	req    *message
	wire   []byte
	dest   netip.AddrPort
	invite bool
	in     chan *message
	final  chan *message
	onProv func(*message)
	// abandoned closes when the caller stops waiting.
	abandoned chan struct{}
}

func txKey(branch, method string) string { return branch + "|" + method }

// transact runs a client transaction for req to dest and returns its final
// response. onProvisional, when set, sees each 1xx. When ctx ends first it
// returns ctx's error; the transaction goes on by itself (an INVITE's
// CANCEL is the caller's business) until it ends or 64×T1 pass.
func (p *Phone) transact(ctx context.Context, req *message, dest netip.AddrPort, onProvisional func(*message)) (*message, error) {
	_, method := req.cseq()
	tx := &clientTx{key: txKey(req.branch(), method), req: req, wire: req.bytes(), dest: dest, invite: method == "INVITE",
		in: make(chan *message, 16), final: make(chan *message, 1), onProv: onProvisional, abandoned: make(chan struct{})}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, ErrClosed
	}
	p.clientTx[tx.key] = tx
	p.mu.Unlock()
	p.send(tx.wire, dest, req, false)
	p.wg.Add(1)
	go p.runClientTx(tx)
	select {
	case r := <-tx.final:
		if r == nil {
			return nil, fmt.Errorf("%s to %s: %w", method, dest, ErrTimeout)
		}
		return r, nil
	case <-ctx.Done():
		close(tx.abandoned)
		return nil, ctx.Err()
	case <-p.done:
		return nil, ErrClosed
	}
}

func (p *Phone) runClientTx(tx *clientTx) {
	defer p.wg.Done()
	defer func() {
		p.mu.Lock()
		delete(p.clientTx, tx.key)
		p.mu.Unlock()
	}()
	t1, t2 := p.cfg.T1, p.cfg.T2
	interval := t1
	retransmit := time.NewTimer(interval)
	defer retransmit.Stop()
	timeout := time.NewTimer(64 * t1)
	defer timeout.Stop()
	proceeding := false
	abandoned := tx.abandoned
	for {
		select {
		case <-p.done:
			return
		case <-abandoned:
			// The caller gave up (an INVITE it then CANCELs): the final
			// answer still needs its ACK, for 64×T1 at most.
			abandoned = nil
			timeout.Reset(64 * t1)
		case <-retransmit.C:
			if tx.invite && proceeding {
				continue // Timer A stops in Proceeding
			}
			p.send(tx.wire, tx.dest, tx.req, true)
			if tx.invite {
				interval *= 2
			} else if proceeding {
				interval = t2
			} else {
				interval = min(interval*2, t2)
			}
			retransmit.Reset(interval)
		case <-timeout.C:
			if tx.invite && proceeding && abandoned != nil {
				// No Timer B in Proceeding: a call rings until answered or
				// cancelled (the caller's context).
				continue
			}
			tx.final <- nil
			return
		case r := <-tx.in:
			if r.status < 200 {
				if !proceeding && !tx.invite {
					interval = t2
					retransmit.Reset(interval)
				}
				proceeding = true
				if tx.onProv != nil {
					tx.onProv(r)
				}
				continue
			}
			tx.final <- r
			switch {
			case tx.invite && r.status >= 300:
				p.completeInvite(tx, r)
			case !tx.invite:
				// Timer K: retransmissions of the final answer are absorbed
				// here rather than taken for strays.
				p.linger(tx, p.cfg.T4)
			}
			return
		}
	}
}

// completeInvite acknowledges a non-2xx final answer to an INVITE, and
// each retransmission of it for Timer D.
func (p *Phone) completeInvite(tx *clientTx, r *message) {
	ack := ackFor(tx.req, r)
	wire := ack.bytes()
	p.send(wire, tx.dest, ack, false)
	end := time.NewTimer(timerD)
	defer end.Stop()
	for {
		select {
		case <-p.done:
			return
		case <-end.C:
			return
		case r2 := <-tx.in:
			if r2.status >= 300 {
				p.send(wire, tx.dest, ack, true)
			}
		}
	}
}

func (p *Phone) linger(tx *clientTx, d time.Duration) {
	end := time.NewTimer(d)
	defer end.Stop()
	for {
		select {
		case <-p.done:
			return
		case <-end.C:
			return
		case <-tx.in:
		}
	}
}

// ackFor is the ACK of a non-2xx final answer (RFC 3261 §17.1.1.3): the
// INVITE's Request-URI, top Via, Route, From, Call-ID and CSeq number,
// the answer's To.
func ackFor(invite, r *message) *message {
	num, _ := invite.cseq()
	ack := &message{request: true, method: "ACK", uri: invite.uri}
	ack.add("via", invite.all("via")[0])
	for _, rt := range invite.all("route") {
		ack.add("route", rt)
	}
	ack.add("max-forwards", "70")
	ack.add("from", invite.get("from"))
	ack.add("to", r.get("to"))
	ack.add("call-id", invite.get("call-id"))
	ack.add("cseq", fmt.Sprintf("%d ACK", num))
	return ack
}

// serverTx remembers the last response to a request, to send it again
// when the request comes again, until it expires.
type serverTx struct {
	last    []byte
	lastMsg *message
	dest    netip.AddrPort
	expires time.Time
	// acked stops Timer G of a non-2xx final answer to an INVITE.
	acked chan struct{}
}

// respond sends resp for the request of st and keeps it for
// retransmissions of the request.
func (p *Phone) respond(st *serverTx, req, resp *message) {
	resp.add("user-agent", userAgent)
	wire := resp.bytes()
	p.mu.Lock()
	st.last, st.lastMsg = wire, resp
	if req.method != "INVITE" || resp.status >= 200 {
		// A ringing INVITE's transaction lasts until its final answer:
		// a CANCEL finds it.
		st.expires = time.Now().Add(64 * p.cfg.T1)
	}
	p.mu.Unlock()
	p.send(wire, st.dest, resp, false)
	if req.method == "INVITE" && resp.status >= 300 {
		p.wg.Add(1)
		go p.timerG(st, wire, resp)
	}
}

// timerG sends a non-2xx final answer to an INVITE again until its ACK.
func (p *Phone) timerG(st *serverTx, wire []byte, resp *message) {
	defer p.wg.Done()
	interval := p.cfg.T1
	t := time.NewTimer(interval)
	defer t.Stop()
	h := time.NewTimer(64 * p.cfg.T1)
	defer h.Stop()
	for {
		select {
		case <-p.done:
			return
		case <-st.acked:
			return
		case <-h.C:
			return
		case <-t.C:
			p.send(wire, st.dest, resp, true)
			interval = min(interval*2, p.cfg.T2)
			t.Reset(interval)
		}
	}
}

// sweep drops server transactions past their time.
func (p *Phone) sweep(now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for k, st := range p.serverTx {
		if !st.expires.IsZero() && now.After(st.expires) {
			delete(p.serverTx, k)
		}
	}
}
