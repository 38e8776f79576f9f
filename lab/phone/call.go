package phone

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"
)

// call is the phone's one call: its dialog (RFC 3261 §12) and its media.
type call struct {
	id       string
	state    State
	outgoing bool
	// localURI and remoteURI are the From and To of the phone's requests
	// in the dialog, without their tags.
	localTag, remoteTag string
	localURI, remoteURI string
	remoteTarget        string
	routeSet            []string
	localSeq, remoteSeq uint32
	invite              *message // the INVITE that made the call
	inviteDest          netip.AddrPort
	inviteST            *serverTx
	ackSeq              uint32 // the CSeq our last ACK of a 2xx acknowledged
	ack                 []byte
	ackMsg              *message
	ackDest             netip.AddrPort
	resend              *resend // our 2xx, until its ACK
	offerInOK           bool    // our 2xx carried the offer: the ACK brings the answer
	localDir            Direction
	sentDir             Direction // the direction of the last description the phone sent
	remote              sdpMedia
	haveRemote          bool
	reinviting          bool
	hangingUp           bool
	mediaSince          time.Time
	cancelled           bool
}

// resend is a 2xx to an INVITE sent again until its ACK (RFC 3261
// §13.3.1.4).
type resend struct {
	cseq uint32
	stop chan struct{}
}

func (c *call) stopRetransmit() {
	if c.resend != nil {
		close(c.resend.stop)
		c.resend = nil
	}
}

func (c *call) active() bool {
	return c != nil && c.state != StateEnded
}

// nextHop is where the phone's in-dialog requests go: the first route,
// else the remote target.
func (c *call) nextHop() (netip.AddrPort, error) {
	if len(c.routeSet) > 0 {
		return uriHostPort(nameAddrURI(c.routeSet[0]))
	}
	return uriHostPort(c.remoteTarget)
}

// sends and expectsAudio follow the last offer/answer.
func (c *call) sends() bool {
	return c.haveRemote && c.remote.pcmu && c.sentDir.sends() && c.remote.direction.receives()
}

func (c *call) expectsAudio() bool {
	return c.haveRemote && c.remote.pcmu && c.sentDir.receives() && c.remote.direction.sends()
}

// matches says whether a request's Call-ID and tags name this dialog.
func (c *call) matches(m *message) bool {
	return c != nil && c.id == m.get("call-id") && c.localTag == tagOf(m.get("to")) &&
		c.remoteTag != "" && c.remoteTag == tagOf(m.get("from"))
}

// intersect is what two directions allow together.
func intersect(a, b Direction) Direction {
	send, recv := a.sends() && b.sends(), a.receives() && b.receives()
	switch {
	case send && recv:
		return SendRecv
	case send:
		return SendOnly
	case recv:
		return RecvOnly
	}
	return Inactive
}

// description is the phone's SDP in direction dir; p.mu is held. The
// version goes up whenever the description changes (RFC 3264 §8).
func (p *Phone) description(c *call, dir Direction) []byte {
	if dir != c.sentDir || p.sdpVersion == 0 {
		p.sdpVersion++
	}
	c.sentDir = dir
	return buildSDP(p.sessID, p.sdpVersion, p.media.local, dir)
}

// applyMedia points the sender where the dialog says; p.mu is held.
func (p *Phone) applyMedia(c *call) {
	if p.call != c || c.state == StateEnded {
		return
	}
	p.media.setTarget(c.remote.addr, c.sends())
	c.mediaSince = time.Now()
	p.note(Event{At: c.mediaSince, Dir: "media", What: c.remote.addr.String(), CallID: c.id,
		Note: fmt.Sprintf("they %s, we %s, sending %v", c.remote.direction, c.sentDir, c.sends())})
	p.status.Media = c.remote.addr
	p.notify()
}

// Call calls target (an extension, called at the server, or a SIP URI
// with an address, called there) and returns once the call is up, or how
// it failed. When ctx ends while it rings, the phone cancels it.
func (p *Phone) Call(ctx context.Context, target string) error {
	uri, dest := "sip:"+target+"@"+p.cfg.Domain, p.cfg.Server
	if strings.HasPrefix(target, "sip:") {
		d, err := uriHostPort(target)
		if err != nil {
			return err
		}
		uri, dest = target, d
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return ErrClosed
	}
	if p.call.active() {
		p.mu.Unlock()
		return fmt.Errorf("phone %s: busy with call %s", p.cfg.User, p.call.id)
	}
	c := &call{id: randomHex(12) + "@fan-phone", outgoing: true, localTag: randomHex(6), localURI: "<" + p.aor() + ">",
		remoteURI: "<" + uri + ">", remoteTarget: uri, localDir: SendRecv, inviteDest: dest}
	p.call = c
	p.media.newCall(time.Now())
	p.setState(c, StateCalling, "")
	p.mu.Unlock()

	var challenge *message
	for attempt := range 2 {
		p.mu.Lock()
		c.localSeq++
		req := &message{request: true, method: "INVITE", uri: uri}
		req.add("via", p.via())
		req.add("max-forwards", "70")
		req.add("from", c.localURI+";tag="+c.localTag)
		req.add("to", c.remoteURI)
		req.add("call-id", c.id)
		req.add("cseq", fmt.Sprintf("%d INVITE", c.localSeq))
		req.add("contact", p.contact())
		req.add("allow", allowed)
		req.add("user-agent", userAgent)
		req.add("content-type", "application/sdp")
		req.body = p.description(c, c.localDir)
		c.invite = req
		p.mu.Unlock()
		if challenge != nil {
			if err := authorize(req, challenge, p.cfg.AuthUser, p.cfg.Password); err != nil {
				p.end(c, ReasonRejected+": "+err.Error())
				return err
			}
		}
		r, err := p.transact(ctx, req, dest, func(prov *message) { p.early(c, prov) })
		if err != nil {
			if ctx.Err() != nil {
				return p.cancel(c, dest)
			}
			p.end(c, ReasonNoAnswer)
			return fmt.Errorf("phone %s: call %s: %w", p.cfg.User, target, err)
		}
		switch {
		case r.status >= 200 && r.status < 300:
			return p.answered(c, r, dest)
		case (r.status == 401 || r.status == 407) && attempt == 0 && p.cfg.Password != "":
			challenge = r
		default:
			reason := fmt.Sprintf("%s: %d %s", ReasonRejected, r.status, r.reason)
			p.mu.Lock()
			if c.cancelled && r.status == 487 {
				reason = ReasonCancelled
			}
			p.mu.Unlock()
			p.end(c, reason)
			return fmt.Errorf("phone %s: call %s: %s", p.cfg.User, target, reason)
		}
	}
	p.end(c, ReasonRejected+": credentials refused")
	return fmt.Errorf("phone %s: call %s: credentials refused", p.cfg.User, target)
}

// early notes a provisional answer's tag (an early dialog).
func (p *Phone) early(c *call, r *message) {
	if tag := tagOf(r.get("to")); tag != "" {
		p.mu.Lock()
		if c.remoteTag == "" {
			c.remoteTag = tag
		}
		p.mu.Unlock()
	}
}

// answered sets up the dialog from a 2xx to the phone's INVITE and
// acknowledges it.
func (p *Phone) answered(c *call, r *message, dest netip.AddrPort) error {
	p.mu.Lock()
	c.remoteTag = tagOf(r.get("to"))
	if ct := r.get("contact"); ct != "" {
		c.remoteTarget = nameAddrURI(ct)
	}
	rr := r.all("record-route")
	slices.Reverse(rr)
	c.routeSet = rr
	var sdpErr error
	if len(r.body) > 0 {
		c.remote, sdpErr = parseSDP(r.body)
		c.haveRemote = sdpErr == nil
	}
	cancelled := c.cancelled
	p.mu.Unlock()
	if err := p.sendACK(c, r); err != nil {
		p.end(c, ReasonRejected+": "+err.Error())
		return err
	}
	if cancelled {
		// The answer crossed the CANCEL: the call is up and must be ended.
		ctx, cancel := context.WithTimeout(context.Background(), 64*p.cfg.T1)
		defer cancel()
		_ = p.hangup(ctx, c, ReasonCancelled)
		return fmt.Errorf("phone %s: %s", p.cfg.User, ReasonCancelled)
	}
	p.mu.Lock()
	p.setState(c, StateUp, "")
	p.applyMedia(c)
	p.mu.Unlock()
	if sdpErr != nil {
		return fmt.Errorf("phone %s: answer's description: %w", p.cfg.User, sdpErr)
	}
	return nil
}

// sendACK acknowledges a 2xx to the phone's INVITE (a transaction of its
// own, RFC 3261 §13.2.2.4) and keeps it for a retransmitted 2xx.
func (p *Phone) sendACK(c *call, r *message) error {
	num, _ := r.cseq()
	p.mu.Lock()
	ack := &message{request: true, method: "ACK", uri: c.remoteTarget}
	ack.add("via", p.via())
	ack.add("max-forwards", "70")
	for _, rt := range c.routeSet {
		ack.add("route", rt)
	}
	ack.add("from", c.localURI+";tag="+c.localTag)
	ack.add("to", c.remoteURI+";tag="+c.remoteTag)
	ack.add("call-id", c.id)
	ack.add("cseq", fmt.Sprintf("%d ACK", num))
	ack.add("user-agent", userAgent)
	dest, err := c.nextHop()
	if err != nil {
		p.mu.Unlock()
		return err
	}
	c.ackSeq, c.ack, c.ackMsg, c.ackDest = num, ack.bytes(), ack, dest
	wire := c.ack
	p.mu.Unlock()
	p.send(wire, dest, ack, false)
	return nil
}

// reack answers a retransmitted 2xx with the ACK already sent.
func (p *Phone) reack(r *message) {
	num, _ := r.cseq()
	p.mu.Lock()
	c := p.call
	if c == nil || c.id != r.get("call-id") || c.ackSeq != num || c.ack == nil {
		p.mu.Unlock()
		return
	}
	wire, msg, dest := c.ack, c.ackMsg, c.ackDest
	p.mu.Unlock()
	p.send(wire, dest, msg, true)
}

// cancel cancels a ringing call of the phone's (RFC 3261 §9.1).
func (p *Phone) cancel(c *call, dest netip.AddrPort) error {
	p.mu.Lock()
	c.cancelled = true
	inv := c.invite
	p.mu.Unlock()
	req := &message{request: true, method: "CANCEL", uri: inv.uri}
	req.add("via", inv.all("via")[0])
	for _, rt := range inv.all("route") {
		req.add("route", rt)
	}
	req.add("max-forwards", "70")
	req.add("from", inv.get("from"))
	req.add("to", inv.get("to"))
	req.add("call-id", inv.get("call-id"))
	num, _ := inv.cseq()
	req.add("cseq", fmt.Sprintf("%d CANCEL", num))
	req.add("user-agent", userAgent)
	ctx, cancelCtx := context.WithTimeout(context.Background(), 64*p.cfg.T1)
	defer cancelCtx()
	_, err := p.transact(ctx, req, dest, nil)
	p.end(c, ReasonCancelled)
	if err != nil {
		return fmt.Errorf("phone %s: cancel: %w", p.cfg.User, err)
	}
	return fmt.Errorf("phone %s: %s", p.cfg.User, ReasonCancelled)
}

// end ends the call with reason.
func (p *Phone) end(c *call, reason string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.endLocked(c, reason)
}

func (p *Phone) endLocked(c *call, reason string) {
	if c.state == StateEnded {
		return
	}
	c.stopRetransmit()
	if p.call == c {
		p.media.stop()
	}
	p.setState(c, StateEnded, reason)
	c.state = StateEnded
}

// handleInvite takes a new call.
func (p *Phone) handleInvite(m *message, from netip.AddrPort, st *serverTx) {
	if p.cfg.StrictSource && from != p.cfg.Server {
		p.noteIn(m, from, false, "dropped: a new call from "+from.String()+", not the server "+p.cfg.Server.String())
		return
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	if p.call.active() {
		p.note(Event{Dir: "in", What: m.method, CSeq: m.get("cseq"), Peer: from, CallID: m.get("call-id"), Note: "busy"})
		p.mu.Unlock()
		p.respond(st, m, response(m, 486, "Busy Here", randomHex(6)))
		return
	}
	num, _ := m.cseq()
	c := &call{id: m.get("call-id"), localTag: randomHex(6), remoteTag: tagOf(m.get("from")),
		localURI: stripTag(m.get("to")), remoteURI: stripTag(m.get("from")), remoteTarget: nameAddrURI(m.get("contact")),
		routeSet: m.all("record-route"), remoteSeq: num, invite: m, inviteDest: from, inviteST: st, localDir: SendRecv}
	if c.remoteTarget == "" {
		p.mu.Unlock()
		p.respond(st, m, response(m, 400, "Missing Contact", randomHex(6)))
		return
	}
	if len(m.body) > 0 {
		sdp, err := parseSDP(m.body)
		if err != nil || !sdp.pcmu {
			p.mu.Unlock()
			p.respond(st, m, response(m, 488, "Not Acceptable Here", randomHex(6)))
			return
		}
		c.remote, c.haveRemote = sdp, true
	}
	p.note(Event{Dir: "in", What: m.method, CSeq: m.get("cseq"), Peer: from, CallID: c.id, Note: "new call from " + nameAddrURI(c.remoteURI)})
	p.call = c
	p.media.newCall(time.Now())
	p.setState(c, StateRinging, "")
	p.mu.Unlock()

	p.respond(st, m, response(m, 100, "Trying", ""))
	ringing := response(m, 180, "Ringing", c.localTag)
	ringing.add("contact", p.contact())
	for _, rr := range c.routeSet {
		ringing.add("record-route", rr)
	}
	p.respond(st, m, ringing)
	if p.cfg.AutoAnswer {
		time.AfterFunc(p.cfg.AnswerAfter, func() { _ = p.answer(c) })
	}
}

func stripTag(v string) string {
	uri := nameAddrURI(v)
	if i := strings.IndexByte(v, '<'); i >= 0 {
		return v[:i] + "<" + uri + ">"
	}
	return "<" + uri + ">"
}

// Answer answers the ringing call.
func (p *Phone) Answer() error {
	p.mu.Lock()
	c := p.call
	p.mu.Unlock()
	if c == nil {
		return ErrNoCall
	}
	return p.answer(c)
}

func (p *Phone) answer(c *call) error {
	p.mu.Lock()
	if p.call != c || c.state != StateRinging {
		p.mu.Unlock()
		return fmt.Errorf("phone %s: no call ringing", p.cfg.User)
	}
	dir := c.localDir
	if c.haveRemote {
		dir = intersect(dir, c.remote.direction.reverse())
	}
	ok := response(c.invite, 200, "OK", c.localTag)
	ok.add("contact", p.contact())
	for _, rr := range c.routeSet {
		ok.add("record-route", rr)
	}
	ok.add("allow", allowed)
	ok.add("content-type", "application/sdp")
	ok.body = p.description(c, dir)
	c.offerInOK = !c.haveRemote
	num, _ := c.invite.cseq()
	p.setState(c, StateUp, "")
	p.applyMedia(c)
	st := c.inviteST
	rs := c.awaitACK(num)
	p.mu.Unlock()
	p.respond(st, c.invite, ok)
	p.retransmit2xx(c, rs, st)
	return nil
}

// awaitACK says the dialog waits for the ACK of its 2xx to the INVITE
// of cseq, before that 2xx leaves (the ACK can come back before the
// sender's next line); p.mu is held.
func (c *call) awaitACK(cseq uint32) *resend {
	c.stopRetransmit()
	c.resend = &resend{cseq: cseq, stop: make(chan struct{})}
	return c.resend
}

// retransmit2xx sends the 2xx in st again on T1 doubling up to T2 until
// its ACK; with none after 64×T1 the phone ends the call with a BYE, as
// RFC 3261 §13.3.1.4 says.
func (p *Phone) retransmit2xx(c *call, rs *resend, st *serverTx) {
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		interval := p.cfg.T1
		t := time.NewTimer(interval)
		defer t.Stop()
		giveUp := time.NewTimer(64 * p.cfg.T1)
		defer giveUp.Stop()
		for {
			select {
			case <-p.done:
				return
			case <-rs.stop:
				return
			case <-giveUp.C:
				ctx, cancel := context.WithTimeout(context.Background(), 64*p.cfg.T1)
				defer cancel()
				_ = p.hangup(ctx, c, ReasonNoACK)
				return
			case <-t.C:
				p.mu.Lock()
				wire, msg := st.last, st.lastMsg
				p.mu.Unlock()
				p.send(wire, st.dest, msg, true)
				interval = min(interval*2, p.cfg.T2)
				t.Reset(interval)
			}
		}
	}()
}

// handleACK takes the ACK of a non-2xx final answer (its transaction's)
// or of a 2xx (the dialog's).
func (p *Phone) handleACK(m *message, from netip.AddrPort) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if st, ok := p.serverTx[txKey(m.branch(), "INVITE")]; ok && st.lastMsg != nil && st.lastMsg.status >= 300 {
		p.note(Event{Dir: "in", What: "ACK", CSeq: m.get("cseq"), Peer: from, CallID: m.get("call-id")})
		select {
		case <-st.acked:
		default:
			close(st.acked)
		}
		return
	}
	c := p.call
	in := c.matches(m)
	p.note(Event{Dir: "in", What: "ACK", CSeq: m.get("cseq"), Peer: from, CallID: m.get("call-id"), InDialog: in})
	if !in {
		return
	}
	num, _ := m.cseq()
	if c.resend == nil || c.resend.cseq != num {
		return
	}
	c.stopRetransmit()
	if c.offerInOK && len(m.body) > 0 {
		if sdp, err := parseSDP(m.body); err == nil {
			c.remote, c.haveRemote = sdp, true
			p.applyMedia(c)
		}
	}
	c.offerInOK = false
}

// handleCancel cancels a ringing call (RFC 3261 §9.2).
func (p *Phone) handleCancel(m *message, from netip.AddrPort, st *serverTx) {
	p.mu.Lock()
	inv, ok := p.serverTx[txKey(m.branch(), "INVITE")]
	c := p.call
	ringing := ok && c != nil && c.state == StateRinging && c.inviteST == inv
	p.note(Event{Dir: "in", What: "CANCEL", CSeq: m.get("cseq"), Peer: from, CallID: m.get("call-id"), InDialog: ringing})
	p.mu.Unlock()
	if !ringing {
		p.respond(st, m, response(m, 481, "Call/Transaction Does Not Exist", randomHex(6)))
		return
	}
	p.respond(st, m, response(m, 200, "OK", c.localTag))
	p.end(c, ReasonCancelled)
	p.respond(inv, c.invite, response(c.invite, 487, "Request Terminated", c.localTag))
}

// handleInDialog answers a request that names a dialog (its To has a
// tag): 481 when it is not the phone's, else as the method asks.
func (p *Phone) handleInDialog(m *message, from netip.AddrPort, st *serverTx) {
	p.mu.Lock()
	c := p.call
	if !c.matches(m) || c.state == StateEnded {
		if p.cfg.StrictSource && from != p.cfg.Server {
			p.note(Event{Dir: "in", What: m.method, CSeq: m.get("cseq"), Peer: from, CallID: m.get("call-id"),
				Note: "dropped: no such dialog, from " + from.String() + ", not the server"})
			delete(p.serverTx, txKey(m.branch(), m.method))
			p.mu.Unlock()
			return
		}
		p.note(Event{Dir: "in", What: m.method, CSeq: m.get("cseq"), Peer: from, CallID: m.get("call-id"), Note: "no such dialog"})
		p.mu.Unlock()
		p.respond(st, m, response(m, 481, "Call/Transaction Does Not Exist", ""))
		return
	}
	if p.cfg.StrictSource {
		if hop, err := c.nextHop(); err != nil || hop != from {
			p.note(Event{Dir: "in", What: m.method, CSeq: m.get("cseq"), Peer: from, CallID: c.id, InDialog: true,
				Note: "dropped: from " + from.String() + ", not from where the dialog's requests go (" + hop.String() + ")"})
			delete(p.serverTx, txKey(m.branch(), m.method))
			p.mu.Unlock()
			return
		}
	}
	num, _ := m.cseq()
	if num <= c.remoteSeq {
		// RFC 3261 §12.2.2: a CSeq below the last one is out of order.
		p.note(Event{Dir: "in", What: m.method, CSeq: m.get("cseq"), Peer: from, CallID: c.id, InDialog: true, Note: "CSeq out of order"})
		p.mu.Unlock()
		p.respond(st, m, response(m, 500, "CSeq Out of Order", ""))
		return
	}
	c.remoteSeq = num
	p.note(Event{Dir: "in", What: m.method, CSeq: m.get("cseq"), Peer: from, CallID: c.id, InDialog: true})
	switch m.method {
	case "BYE":
		p.mu.Unlock()
		p.respond(st, m, response(m, 200, "OK", ""))
		p.end(c, ReasonByeReceived)
	case "INVITE":
		p.reinvited(c, m, st)
	case "UPDATE":
		r := response(m, 200, "OK", "")
		r.add("contact", p.contact())
		if ct := m.get("contact"); ct != "" {
			c.remoteTarget = nameAddrURI(ct)
		}
		if len(m.body) > 0 {
			sdp, err := parseSDP(m.body)
			if err != nil || !sdp.pcmu {
				p.mu.Unlock()
				p.respond(st, m, response(m, 488, "Not Acceptable Here", ""))
				return
			}
			c.remote, c.haveRemote = sdp, true
			r.add("content-type", "application/sdp")
			r.body = p.description(c, intersect(c.localDir, sdp.direction.reverse()))
			p.applyMedia(c)
		}
		p.mu.Unlock()
		p.respond(st, m, r)
	case "INFO", "OPTIONS", "NOTIFY", "MESSAGE":
		p.mu.Unlock()
		p.respond(st, m, response(m, 200, "OK", ""))
	default:
		p.mu.Unlock()
		r := response(m, 501, "Not Implemented", "")
		r.add("allow", allowed)
		p.respond(st, m, r)
	}
}

// reinvited answers a re-INVITE (p.mu held, released here): with an offer
// it takes the new media at once and answers; without one it offers in
// its 200 and takes the answer from the ACK.
func (p *Phone) reinvited(c *call, m *message, st *serverTx) {
	if c.reinviting || c.resend != nil {
		// Glare with the phone's own re-INVITE, or one still unacknowledged
		// (RFC 3261 §14.2).
		p.mu.Unlock()
		r := response(m, 491, "Request Pending", "")
		if c.resend != nil {
			r = response(m, 500, "Server Internal Error", "")
			r.add("retry-after", "1")
		}
		p.respond(st, m, r)
		return
	}
	if ct := m.get("contact"); ct != "" {
		c.remoteTarget = nameAddrURI(ct)
	}
	dir := c.localDir
	if len(m.body) > 0 {
		sdp, err := parseSDP(m.body)
		if err != nil || !sdp.pcmu {
			p.mu.Unlock()
			p.respond(st, m, response(m, 488, "Not Acceptable Here", ""))
			return
		}
		c.remote, c.haveRemote = sdp, true
		dir = intersect(dir, sdp.direction.reverse())
	}
	ok := response(m, 200, "OK", "")
	ok.add("contact", p.contact())
	ok.add("allow", allowed)
	ok.add("content-type", "application/sdp")
	ok.body = p.description(c, dir)
	c.offerInOK = len(m.body) == 0
	if len(m.body) > 0 {
		p.applyMedia(c)
	}
	num, _ := m.cseq()
	rs := c.awaitACK(num)
	p.mu.Unlock()
	p.respond(st, m, ok)
	p.retransmit2xx(c, rs, st)
}

// Hangup ends the phone's call: a BYE when it is up, a CANCEL while it
// calls, 603 Decline while it rings.
func (p *Phone) Hangup(ctx context.Context) error {
	p.mu.Lock()
	c := p.call
	p.mu.Unlock()
	if !c.active() {
		return ErrNoCall
	}
	return p.hangup(ctx, c, ReasonHungUp)
}

func (p *Phone) hangup(ctx context.Context, c *call, reason string) error {
	p.mu.Lock()
	switch {
	case c.state == StateEnded || c.hangingUp:
		p.mu.Unlock()
		return nil
	case c.state == StateCalling:
		dest := c.inviteDest
		p.mu.Unlock()
		_ = p.cancel(c, dest)
		return nil
	case c.state == StateRinging:
		st, inv := c.inviteST, c.invite
		p.mu.Unlock()
		p.end(c, ReasonDeclined)
		p.respond(st, inv, response(inv, 603, "Decline", c.localTag))
		return nil
	}
	c.hangingUp = true
	p.mu.Unlock()
	req, dest, err := p.inDialogRequest(c, "BYE")
	if err != nil {
		p.end(c, reason)
		return err
	}
	// The session ends when the BYE leaves (RFC 3261 §15.1.1); its answer
	// is added to the reason.
	p.end(c, reason)
	r, err := p.transact(ctx, req, dest, nil)
	answer := "unanswered"
	if err == nil {
		answer = fmt.Sprintf("answered %d %s", r.status, r.reason)
	}
	p.mu.Lock()
	if p.call == c {
		p.status.Reason = reason + ", BYE " + answer
		p.notify()
	}
	p.mu.Unlock()
	if err != nil {
		return fmt.Errorf("phone %s: BYE: %w", p.cfg.User, err)
	}
	return nil
}

// inDialogRequest builds the phone's next request in c's dialog.
func (p *Phone) inDialogRequest(c *call, method string) (*message, netip.AddrPort, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	dest, err := c.nextHop()
	if err != nil {
		return nil, dest, err
	}
	c.localSeq++
	req := &message{request: true, method: method, uri: c.remoteTarget}
	req.add("via", p.via())
	req.add("max-forwards", "70")
	for _, rt := range c.routeSet {
		req.add("route", rt)
	}
	req.add("from", c.localURI+";tag="+c.localTag)
	req.add("to", c.remoteURI+";tag="+c.remoteTag)
	req.add("call-id", c.id)
	req.add("cseq", strconv.FormatUint(uint64(c.localSeq), 10)+" "+method)
	req.add("contact", p.contact())
	req.add("user-agent", userAgent)
	return req, dest, nil
}

// Hold puts the call on hold (a re-INVITE offering sendonly); Resume
// takes it off (sendrecv). A 481 or 408 to it, or no answer, ends the
// call (RFC 3261 §12.2.1.2); another failure leaves it as it was.
func (p *Phone) Hold(ctx context.Context) error   { return p.reinvite(ctx, SendOnly) }
func (p *Phone) Resume(ctx context.Context) error { return p.reinvite(ctx, SendRecv) }

func (p *Phone) reinvite(ctx context.Context, dir Direction) error {
	p.mu.Lock()
	c := p.call
	if c == nil || c.state != StateUp {
		p.mu.Unlock()
		return ErrNoCall
	}
	if c.reinviting {
		p.mu.Unlock()
		return fmt.Errorf("phone %s: a re-INVITE is already out", p.cfg.User)
	}
	c.reinviting = true
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		c.reinviting = false
		p.mu.Unlock()
	}()
	var challenge *message
	for attempt := range 2 {
		req, dest, err := p.inDialogRequest(c, "INVITE")
		if err != nil {
			return err
		}
		p.mu.Lock()
		req.add("allow", allowed)
		req.add("content-type", "application/sdp")
		req.body = p.description(c, dir)
		p.mu.Unlock()
		if challenge != nil {
			if err := authorize(req, challenge, p.cfg.AuthUser, p.cfg.Password); err != nil {
				return err
			}
		}
		r, err := p.transact(ctx, req, dest, nil)
		switch {
		case errors.Is(err, ErrTimeout):
			p.end(c, ReasonRequest408)
			return fmt.Errorf("phone %s: re-INVITE: %w", p.cfg.User, err)
		case err != nil:
			return fmt.Errorf("phone %s: re-INVITE: %w", p.cfg.User, err)
		case r.status >= 200 && r.status < 300:
			if err := p.sendACK(c, r); err != nil {
				return err
			}
			p.mu.Lock()
			c.localDir = dir
			if sdp, err := parseSDP(r.body); err == nil {
				c.remote, c.haveRemote = sdp, true
			}
			if ct := r.get("contact"); ct != "" {
				c.remoteTarget = nameAddrURI(ct)
			}
			p.status.Holding = dir == SendOnly
			p.applyMedia(c)
			p.mu.Unlock()
			return nil
		case r.status == 481:
			p.end(c, ReasonRequest481)
			return fmt.Errorf("phone %s: re-INVITE: %d %s", p.cfg.User, r.status, r.reason)
		case r.status == 408:
			p.end(c, ReasonRequest408)
			return fmt.Errorf("phone %s: re-INVITE: %d %s", p.cfg.User, r.status, r.reason)
		case (r.status == 401 || r.status == 407) && attempt == 0 && p.cfg.Password != "":
			challenge = r
		default:
			// The offer was refused: the session stays as it was (RFC 3261
			// §14.1), its description too.
			p.mu.Lock()
			p.description(c, c.localDir)
			p.mu.Unlock()
			return fmt.Errorf("phone %s: re-INVITE: %d %s", p.cfg.User, r.status, r.reason)
		}
	}
	return fmt.Errorf("phone %s: re-INVITE: credentials refused", p.cfg.User)
}
