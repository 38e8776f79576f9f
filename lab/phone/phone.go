// Package phone is a SIP phone for the lab: a user agent over UDP that
// registers with a PBX (answering its digest challenge), calls an
// extension, answers calls, and sends and receives audio as RTP (PCMU, a
// packet every 20 ms) to wherever the current session description says,
// so a PBX that re-INVITEs it to send its audio straight to the other
// phone (Asterisk's direct media) moves it as a desk phone would move.
//
// It records what a test needs to judge a call: the arrival time and
// sequence number of every RTP packet (the longest silence of each
// direction), every SIP message it sent and received with where it came
// from and whether it belonged to its dialog, and the state of its call
// (idle, calling, ringing, up, ended and why: "bye received", "481 to my
// request", ...).
//
// It behaves as phones do: RFC 3261's transaction timers over UDP
// (tx.go); in-dialog requests (re-INVITE with or without an offer,
// UPDATE, INFO, BYE) answered 200 when their Call-ID and tags name its
// dialog and 481 when they do not; a 481 or 408 (or no answer) to its own
// in-dialog request ends the dialog (RFC 3261 §12.2.1.2). Like most
// phones it does not check where an in-dialog request came from;
// Config.StrictSource makes one that does, for tests of phones that only
// trust their server.
//
// One phone has one line: a second call while one is up is answered 486.
// UDP only; no DNS (URIs carry addresses), no session timers, no 100rel,
// no transfer (REFER is answered 501).
package phone

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"time"
)

const userAgent = "fan-lab-phone"

// allowed is the phone's Allow header.
const allowed = "INVITE, ACK, CANCEL, BYE, OPTIONS, UPDATE, INFO, NOTIFY"

// ErrClosed is returned by a closed phone's actions.
var ErrClosed = errors.New("phone closed")

// ErrNoCall is returned by an action that needs a call when none is up.
var ErrNoCall = errors.New("no call up")

// Config describes one phone.
type Config struct {
	// User is the phone's extension: the AOR it registers and the user
	// part of its URIs ("6001").
	User string
	// Password answers the PBX's digest challenges (as AuthUser, default
	// User).
	Password, AuthUser string
	// Server is where the phone sends REGISTER and its new calls: the
	// floating address and SIP port. Domain is the host of its AOR and of
	// the URIs it calls (default Server's address).
	Server netip.AddrPort
	Domain string
	// Addr is the address the phone's SIP socket binds (port 0: any); it
	// is the phone's Contact. RTPPort is its RTP port (0: a free even
	// port, RTCP above it), on Addr's address.
	Addr    netip.AddrPort
	RTPPort uint16
	// Expires is what the phone asks for when it registers (default
	// 300 s); it registers again at half of what the server granted.
	Expires time.Duration
	// AutoAnswer answers every incoming call after AnswerAfter of
	// ringing; without it a call rings until Answer.
	AutoAnswer  bool
	AnswerAfter time.Duration
	// StrictSource makes a phone that accepts an in-dialog request only
	// from where its own requests in that dialog go (the first route, or
	// the remote target), and a new call only from Server; anything else
	// it drops unanswered, as phones set to trust only their server do.
	// Off, the phone checks Call-ID and tags, not the source address.
	StrictSource bool
	// MediaTimeout, when set, hangs a call up after this long without RTP
	// while the other side should be sending (as phones with an RTP
	// timeout do).
	MediaTimeout time.Duration
	// T1, T2, T4 are RFC 3261's timers (500 ms, 4 s, 5 s by default).
	T1, T2, T4 time.Duration
	Logger     *slog.Logger
}

func (c *Config) defaults() error {
	if c.User == "" {
		return errors.New("phone: user required")
	}
	if !c.Addr.Addr().IsValid() || !c.Addr.Addr().Is4() {
		return errors.New("phone: an IPv4 address to bind is required")
	}
	if !c.Server.IsValid() {
		return errors.New("phone: server address required")
	}
	if c.Domain == "" {
		c.Domain = c.Server.Addr().String()
	}
	if c.AuthUser == "" {
		c.AuthUser = c.User
	}
	if c.Expires <= 0 {
		c.Expires = 300 * time.Second
	}
	if c.T1 <= 0 {
		c.T1 = 500 * time.Millisecond
	}
	if c.T2 <= 0 {
		c.T2 = 4 * time.Second
	}
	if c.T4 <= 0 {
		c.T4 = 5 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

// State is where the phone's call is.
type State string

const (
	StateIdle    State = "idle"    // no call yet
	StateCalling State = "calling" // its INVITE is out
	StateRinging State = "ringing" // a call came in and is not answered
	StateUp      State = "up"
	StateEnded   State = "ended" // the last call ended (Status.Reason says how)
)

// Reasons a call ended (Status.Reason starts with one of them).
const (
	ReasonByeReceived = "bye received"
	// ReasonRequest481 and ReasonRequest408: the phone's in-dialog
	// request was answered 481 or 408 (or not at all), which ends the
	// dialog (RFC 3261 §12.2.1.2).
	ReasonRequest481 = "481 to my request"
	ReasonRequest408 = "408 to my request"
	ReasonHungUp     = "hung up"
	ReasonCancelled  = "cancelled"
	ReasonRejected   = "rejected"
	ReasonDeclined   = "declined"
	ReasonNoACK      = "no ACK for my 200"
	ReasonNoAnswer   = "no answer to my INVITE"
	ReasonNoAudio    = "no audio"
)

// Status is the phone's call as it stands.
type Status struct {
	State  State
	Reason string // how the last call ended
	CallID string
	// Peer is the other side's URI (the To of a call made, the From of a
	// call answered).
	Peer string
	// Since is when the state was entered.
	Since time.Time
	// Holding: the phone put the call on hold (its offer says sendonly).
	Holding bool
	// Media is where the phone sends its audio now (zero while it does
	// not).
	Media netip.AddrPort
	// Registered: the last REGISTER was answered 200 and has not expired.
	Registered bool
}

// Up is true while a call is up.
func (s Status) Up() bool { return s.State == StateUp }

// Event is one SIP message sent or received, or a change of the call's
// state.
type Event struct {
	At time.Time
	// Dir is "in" for a message received, "out" for one sent, "state" for
	// a change of state, "media" for a new media target (What).
	Dir string
	// What is the request's method, the response's "code reason", or the
	// new state.
	What string
	// CSeq is the message's CSeq header.
	CSeq string
	// Peer is where a message came from or went to.
	Peer   netip.AddrPort
	CallID string
	// InDialog: a request received whose Call-ID and tags matched the
	// phone's call.
	InDialog bool
	// Retransmission: the message was sent or received again.
	Retransmission bool
	Note           string
}

// maxEvents bounds the phone's record of events (the oldest go first).
const maxEvents = 4096

// Phone is a running phone.
type Phone struct {
	cfg   Config
	log   *slog.Logger
	sip   *net.UDPConn
	local netip.AddrPort
	media *media
	done  chan struct{}
	wg    sync.WaitGroup

	mu         sync.Mutex
	closed     bool
	clientTx   map[string]*clientTx
	serverTx   map[string]*serverTx
	call       *call
	status     Status
	events     []Event
	changed    chan struct{}
	sessID     uint64
	sdpVersion uint64
	reg        registration
}

type registration struct {
	callID  string
	cseq    uint32
	until   time.Time
	refresh *time.Timer
}

// New binds the phone's sockets and starts it. In a lab, call it inside
// the namespace the phone lives in (netlab's Do): its sockets stay there.
func New(cfg Config) (*Phone, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	sip, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(cfg.Addr))
	if err != nil {
		return nil, fmt.Errorf("phone %s: sip socket: %w", cfg.User, err)
	}
	m, err := listenMedia(cfg.Addr.Addr(), cfg.RTPPort)
	if err != nil {
		sip.Close()
		return nil, fmt.Errorf("phone %s: rtp socket: %w", cfg.User, err)
	}
	local := sip.LocalAddr().(*net.UDPAddr).AddrPort()
	local = netip.AddrPortFrom(local.Addr().Unmap(), local.Port())
	now := time.Now()
	p := &Phone{cfg: cfg, log: cfg.Logger.With("phone", cfg.User, "sip", local.String(), "rtp", m.local.String()),
		sip: sip, local: local, media: m, done: make(chan struct{}),
		clientTx: map[string]*clientTx{}, serverTx: map[string]*serverTx{}, changed: make(chan struct{}),
		status: Status{State: StateIdle, Since: now}, sessID: uint64(now.UnixNano() / 1000),
		reg: registration{callID: randomHex(12) + "@fan-phone"}}
	m.newCall(now)
	p.wg.Add(5)
	go func() { defer p.wg.Done(); p.readLoop() }()
	go func() { defer p.wg.Done(); m.sendLoop(p.done) }()
	go func() { defer p.wg.Done(); m.receiveLoop() }()
	go func() { defer p.wg.Done(); m.drainRTCP() }()
	go func() { defer p.wg.Done(); p.housekeeping() }()
	return p, nil
}

// User is the phone's extension.
func (p *Phone) User() string { return p.cfg.User }

// SIPAddr and RTPAddr are where the phone receives signalling and audio.
func (p *Phone) SIPAddr() netip.AddrPort { return p.local }
func (p *Phone) RTPAddr() netip.AddrPort { return p.media.local }

// Close stops the phone at once, as pulling its cable would: nothing is
// sent (no BYE, no unregistration).
func (p *Phone) Close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	if p.reg.refresh != nil {
		p.reg.refresh.Stop()
	}
	if c := p.call; c != nil {
		c.stopRetransmit()
	}
	close(p.done)
	p.mu.Unlock()
	p.sip.Close()
	p.media.close()
	p.wg.Wait()
}

// Status reports the phone's call.
func (p *Phone) Status() Status {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.status
	s.Media, _ = p.media.current()
	s.Registered = time.Now().Before(p.reg.until)
	return s
}

// Wait returns the phone's status once cond holds for it, or ctx's error
// with the last status.
func (p *Phone) Wait(ctx context.Context, cond func(Status) bool) (Status, error) {
	for {
		p.mu.Lock()
		ch := p.changed
		p.mu.Unlock()
		s := p.Status()
		if cond(s) {
			return s, nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return s, fmt.Errorf("phone %s: %w (state %s %s, sending to %s)", p.cfg.User, ctx.Err(), s.State, s.Reason, s.Media)
		case <-p.done:
			return s, ErrClosed
		}
	}
}

// Events returns the phone's record of messages and state changes.
func (p *Phone) Events() []Event {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]Event(nil), p.events...)
}

// RTP is what the phone sent and received in its current or last call.
func (p *Phone) RTP() RTPStats { return p.media.stats() }

// Gap is the longest silence of what the phone received between from and
// to, in its current or last call.
func (p *Phone) Gap(from, to time.Time) Gap { return p.media.gap(from, to) }

// GapsOver are every silence longer than over of what the phone received
// between from and to, in its current or last call.
func (p *Phone) GapsOver(from, to time.Time, over time.Duration) []Gap {
	return p.media.gapsOver(from, to, over)
}

// SendStalls are the phone's own pauses in sending (longer than three
// packet intervals) that overlap [from, to], in its current or last call:
// a loaded machine's scheduling, which the other phone hears as a gap.
func (p *Phone) SendStalls(from, to time.Time) []Stall { return p.media.stallsBetween(from, to) }

// note records an event; p.mu is held.
func (p *Phone) note(e Event) {
	if e.At.IsZero() {
		e.At = time.Now()
	}
	if len(p.events) >= maxEvents {
		p.events = append(p.events[:0], p.events[len(p.events)-maxEvents/2:]...)
	}
	p.events = append(p.events, e)
}

// notify wakes Wait; p.mu is held.
func (p *Phone) notify() {
	close(p.changed)
	p.changed = make(chan struct{})
}

// setState moves the call's state and says so; p.mu is held.
func (p *Phone) setState(c *call, st State, reason string) {
	if p.call != c {
		return
	}
	c.state = st
	now := time.Now()
	p.status = Status{State: st, Reason: reason, CallID: c.id, Peer: nameAddrURI(c.remoteURI), Since: now, Holding: c.localDir == SendOnly}
	p.note(Event{At: now, Dir: "state", What: string(st), CallID: c.id, Note: reason})
	p.log.Debug("state", "state", st, "reason", reason, "call_id", c.id)
	p.notify()
}

// send records one message and writes it (recorded first: its answer can
// be read before the write returns).
func (p *Phone) send(wire []byte, to netip.AddrPort, m *message, retrans bool) {
	what := m.method
	if !m.request {
		what = strconv.Itoa(m.status) + " " + m.reason
	}
	p.mu.Lock()
	p.note(Event{Dir: "out", What: what, CSeq: m.get("cseq"), Peer: to, CallID: m.get("call-id"), Retransmission: retrans})
	p.mu.Unlock()
	p.log.Debug("sip out", "to", to.String(), "msg", m.firstLine(), "cseq", m.get("cseq"), "retransmission", retrans)
	if _, err := p.sip.WriteToUDPAddrPort(wire, to); err != nil && !isClosed(err) {
		p.log.Warn("sip send", "to", to.String(), "err", err)
	}
}

func isClosed(err error) bool { return errors.Is(err, net.ErrClosed) }

func (p *Phone) readLoop() {
	buf := make([]byte, maxMessage)
	for {
		n, from, err := p.sip.ReadFromUDPAddrPort(buf)
		if err != nil {
			if isClosed(err) {
				return
			}
			continue
		}
		from = netip.AddrPortFrom(from.Addr().Unmap(), from.Port())
		m, err := parseMessage(buf[:n])
		if err != nil {
			p.log.Debug("sip garbage", "from", from.String(), "err", err)
			continue
		}
		p.log.Debug("sip in", "from", from.String(), "msg", m.firstLine(), "cseq", m.get("cseq"))
		if m.request {
			p.handleRequest(m, from)
		} else {
			p.handleResponse(m, from)
		}
	}
}

// housekeeping sweeps server transactions and watches for silence.
func (p *Phone) housekeeping() {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-p.done:
			return
		case now := <-t.C:
			p.sweep(now)
			p.checkAudio(now)
		}
	}
}

func (p *Phone) handleResponse(m *message, from netip.AddrPort) {
	_, method := m.cseq()
	p.mu.Lock()
	tx := p.clientTx[txKey(m.branch(), method)]
	p.note(Event{Dir: "in", What: strconv.Itoa(m.status) + " " + m.reason, CSeq: m.get("cseq"), Peer: from, CallID: m.get("call-id"),
		Retransmission: tx == nil})
	// A 481 or 408 to a request in the dialog ends it (RFC 3261 §12.2.1.2)
	// as it is read: a request that follows it is then out of the dialog,
	// as the far end meant.
	if c := p.call; tx != nil && (m.status == 481 || m.status == 408) && method != "BYE" && method != "CANCEL" &&
		c != nil && c.state == StateUp && c.id == m.get("call-id") && c.localTag == tagOf(m.get("from")) && c.remoteTag == tagOf(m.get("to")) {
		reason := ReasonRequest481
		if m.status == 408 {
			reason = ReasonRequest408
		}
		p.endLocked(c, reason)
	}
	p.mu.Unlock()
	if tx != nil {
		select {
		case tx.in <- m:
		default:
		}
		return
	}
	if method == "INVITE" && m.status >= 200 && m.status < 300 {
		p.reack(m)
	}
}

func (p *Phone) handleRequest(m *message, from netip.AddrPort) {
	if m.method == "ACK" {
		p.handleACK(m, from)
		return
	}
	key := txKey(m.branch(), m.method)
	p.mu.Lock()
	if st, ok := p.serverTx[key]; ok {
		last, lastMsg := st.last, st.lastMsg
		p.note(Event{Dir: "in", What: m.method, CSeq: m.get("cseq"), Peer: from, CallID: m.get("call-id"), Retransmission: true})
		p.mu.Unlock()
		if last != nil {
			p.send(last, from, lastMsg, true)
		}
		return
	}
	st := &serverTx{dest: from, acked: make(chan struct{})}
	p.serverTx[key] = st
	p.mu.Unlock()

	switch {
	case m.method == "CANCEL":
		p.handleCancel(m, from, st)
	case tagOf(m.get("to")) != "":
		p.handleInDialog(m, from, st)
	case m.method == "INVITE":
		p.handleInvite(m, from, st)
	case m.method == "OPTIONS":
		p.noteIn(m, from, false, "")
		r := response(m, 200, "OK", randomHex(6))
		r.add("allow", allowed)
		r.add("accept", "application/sdp")
		p.respond(st, m, r)
	case m.method == "BYE":
		// A BYE with no To tag names no dialog.
		p.noteIn(m, from, false, "")
		p.respond(st, m, response(m, 481, "Call/Transaction Does Not Exist", randomHex(6)))
	default:
		p.noteIn(m, from, false, "")
		r := response(m, 405, "Method Not Allowed", randomHex(6))
		r.add("allow", allowed)
		p.respond(st, m, r)
	}
}

func (p *Phone) noteIn(m *message, from netip.AddrPort, inDialog bool, note string) {
	p.mu.Lock()
	p.note(Event{Dir: "in", What: m.method, CSeq: m.get("cseq"), Peer: from, CallID: m.get("call-id"), InDialog: inDialog, Note: note})
	p.mu.Unlock()
}

// via is the phone's Via header with a new branch.
func (p *Phone) via() string {
	return fmt.Sprintf("SIP/2.0/UDP %s;branch=%s;rport", p.local, newBranch())
}

func (p *Phone) contact() string { return fmt.Sprintf("<sip:%s@%s>", p.cfg.User, p.local) }

func (p *Phone) aor() string { return fmt.Sprintf("sip:%s@%s", p.cfg.User, p.cfg.Domain) }

// Register registers the phone's contact with the server, answering a
// digest challenge, and keeps it registered (again at half the granted
// time) until Close or Unregister.
func (p *Phone) Register(ctx context.Context) error {
	granted, err := p.register(ctx, p.cfg.Expires)
	if err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return ErrClosed
	}
	p.reg.until = time.Now().Add(granted)
	if p.reg.refresh != nil {
		p.reg.refresh.Stop()
	}
	p.reg.refresh = time.AfterFunc(granted/2, func() {
		rctx, cancel := context.WithTimeout(context.Background(), 64*p.cfg.T1)
		defer cancel()
		if err := p.Register(rctx); err != nil && !errors.Is(err, ErrClosed) {
			p.log.Warn("registration refresh", "err", err)
		}
	})
	return nil
}

// Unregister removes the phone's contact (Expires 0) and stops refreshing.
func (p *Phone) Unregister(ctx context.Context) error {
	p.mu.Lock()
	if p.reg.refresh != nil {
		p.reg.refresh.Stop()
	}
	p.reg.until = time.Time{}
	p.mu.Unlock()
	_, err := p.register(ctx, 0)
	return err
}

func (p *Phone) register(ctx context.Context, expires time.Duration) (time.Duration, error) {
	var auth *message
	for attempt := range 2 {
		p.mu.Lock()
		p.reg.cseq++
		cseq := p.reg.cseq
		p.mu.Unlock()
		req := &message{request: true, method: "REGISTER", uri: "sip:" + p.cfg.Domain}
		req.add("via", p.via())
		req.add("max-forwards", "70")
		req.add("from", "<"+p.aor()+">;tag="+randomHex(6))
		req.add("to", "<"+p.aor()+">")
		req.add("call-id", p.reg.callID)
		req.add("cseq", fmt.Sprintf("%d REGISTER", cseq))
		req.add("contact", p.contact())
		req.add("expires", strconv.Itoa(int(expires/time.Second)))
		req.add("allow", allowed)
		req.add("user-agent", userAgent)
		if auth != nil {
			if err := authorize(req, auth, p.cfg.AuthUser, p.cfg.Password); err != nil {
				return 0, fmt.Errorf("phone %s: register: %w", p.cfg.User, err)
			}
		}
		r, err := p.transact(ctx, req, p.cfg.Server, nil)
		if err != nil {
			return 0, fmt.Errorf("phone %s: register: %w", p.cfg.User, err)
		}
		switch {
		case r.status >= 200 && r.status < 300:
			return grantedExpiry(r, p.contact(), expires), nil
		case (r.status == 401 || r.status == 407) && attempt == 0 && p.cfg.Password != "":
			auth = r
		default:
			return 0, fmt.Errorf("phone %s: register: %d %s", p.cfg.User, r.status, r.reason)
		}
	}
	return 0, fmt.Errorf("phone %s: register: credentials refused", p.cfg.User)
}

// grantedExpiry is the time the server granted our contact: its Contact's
// expires parameter, else the Expires header, else what was asked.
func grantedExpiry(r *message, contact string, asked time.Duration) time.Duration {
	want := nameAddrURI(contact)
	for _, c := range r.all("contact") {
		if nameAddrURI(c) != want {
			continue
		}
		if n, err := strconv.Atoi(param(headerParams(c), "expires")); err == nil {
			return time.Duration(n) * time.Second
		}
	}
	if n, err := strconv.Atoi(r.get("expires")); err == nil {
		return time.Duration(n) * time.Second
	}
	return asked
}

// checkAudio hangs up a call that has been silent past MediaTimeout.
func (p *Phone) checkAudio(now time.Time) {
	if p.cfg.MediaTimeout <= 0 {
		return
	}
	p.mu.Lock()
	c := p.call
	if c == nil || c.state != StateUp || !c.expectsAudio() || c.hangingUp {
		p.mu.Unlock()
		return
	}
	since := c.mediaSince
	p.mu.Unlock()
	if _, last := p.media.current(); last.After(since) {
		since = last
	}
	if now.Sub(since) < p.cfg.MediaTimeout {
		return
	}
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 64*p.cfg.T1)
		defer cancel()
		_ = p.hangup(ctx, c, fmt.Sprintf("%s for %s", ReasonNoAudio, p.cfg.MediaTimeout))
	}()
}
