package pbxstandin

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/fanpbx/fan/lab/amipeer"
)

// The stand-in as a back-to-back user agent, as Asterisk 22 is with the
// dialplan `exten => _60XX,1,Dial(PJSIP/${EXTEN})` (docs/asterisk22.md,
// "Calls: a B2BUA, its dialogs and its AMI events"). An INVITE from a
// phone to another AOR is a call of two dialogs: the caller's (the
// stand-in answers it) and a new one to the callee's registered contact,
// with its own Call-ID, tags and CSeq. When the callee answers, the caller
// gets the 200 OK and both channels enter a bridge; with direct_media on
// both endpoints each phone is then re-INVITEd to send its audio to the
// other, else the stand-in relays the RTP itself (media.go). A BYE is
// answered and carried to the other dialog (direct media first brings
// the other phone's audio back, as Asterisk does before its BYE); a
// CANCEL before the answer is answered and carried; a request in a dialog
// the stand-in does not know is answered 481. The AMI peer raises the
// events and answers the Getvar reads of each step (lab/amipeer/calls.go).
//
// Not imitated: authentication (the stand-in's registrar asks none
// either), transfers (REFER is answered 501), hold (a re-INVITE from a
// phone is answered with the session as it is), TCP and TLS, forking to
// several contacts (the first contact is dialled).

const (
	t1          = 500 * time.Millisecond
	t2          = 4 * time.Second
	txLifetime  = 64 * t1 // timer B, F, J: how long a transaction lives
	byeReceived = txLifetime
	byeSent     = 5 * time.Second // timer K
)

type callState int

const (
	callDialing callState = iota
	callRinging
	callAnswered
	callEnding
)

// leg is one dialog of a call, from the stand-in's side.
type leg struct {
	call      *call
	caller    bool
	endpoint  string
	callID    string
	localTag  string
	remoteTag string
	// localURI and remoteURI are the From and To of the stand-in's
	// requests, with their angle brackets; target the Request-URI.
	localURI, remoteURI, target string
	dest                        *net.UDPAddr
	tr                          transport
	localCSeq, remoteCSeq       uint32
	rtp                         *rtpLeg
	phone                       sdp // the phone's media, from its SDP
	payloads                    []string
	sdpSession, sdpVersion      uint64
	lastSDP                     string
	direct                      bool
	// requestURI, remoteAddr and localAddr are the caller's INVITE's.
	requestURI, remoteAddr, localAddr string
}

func (l *leg) key() string { return l.callID + "|" + l.localTag }

// call is two legs and what the caller's INVITE needs until answered.
type call struct {
	caller, callee *leg
	ami            *amipeer.Call
	state          callState
	direct         bool
	cancelled      bool
	inv            *sipMsg
	invFrom        *net.UDPAddr
	invConn        *net.UDPConn
	calleeInvite   *clientTx
	okTimer        *time.Timer
	ended          int // legs whose dialog is over
}

// clientTx is a request the stand-in sent, retransmitted on RFC 3261's
// UDP timers until answered.
type clientTx struct {
	key         string // branch and method
	invite      bool
	data        []byte
	tr          transport
	dest        *net.UDPAddr
	interval    time.Duration
	started     time.Time
	timer       *time.Timer
	provisional bool
	final       bool
	ack         []byte // the ACK of an INVITE's final answer, sent again for a retransmitted one
	onResponse  func(*sipMsg)
	onTimeout   func()
}

// answer is what a request was answered, sent again when the request is.
type answer struct {
	data []byte
	to   *net.UDPAddr
	conn *net.UDPConn
	at   time.Time
}

// endedDialog is a dialog just over: pjproject keeps it while its BYE
// transaction lives.
type endedDialog struct{ until time.Time }

type b2bua struct {
	p *PBX

	mu         sync.Mutex
	transports []transport
	legs       map[string]*leg
	invites    map[string]*call // the callers' INVITEs: Call-ID and branch
	clients    map[string]*clientTx
	answers    map[string]*answer // by branch and method
	ended      map[string]endedDialog
	stop       chan struct{}
	wg         sync.WaitGroup
}

func newB2BUA(p *PBX) *b2bua {
	b := &b2bua{p: p, stop: make(chan struct{})}
	b.clear()
	b.wg.Add(1)
	go b.sweep()
	return b
}

func (b *b2bua) clear() {
	b.legs, b.invites, b.clients = map[string]*leg{}, map[string]*call{}, map[string]*clientTx{}
	b.answers, b.ended = map[string]*answer{}, map[string]endedDialog{}
}

// sweep forgets old answers and dialogs.
func (b *b2bua) sweep() {
	defer b.wg.Done()
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-b.stop:
			return
		case now := <-t.C:
			b.mu.Lock()
			for k, a := range b.answers {
				if now.Sub(a.at) > txLifetime {
					delete(b.answers, k)
				}
			}
			for k, e := range b.ended {
				if now.After(e.until) {
					delete(b.ended, k)
				}
			}
			b.mu.Unlock()
		}
	}
}

func (b *b2bua) setTransports(ts []transport) {
	b.mu.Lock()
	b.transports = ts
	b.mu.Unlock()
}

// reset forgets every call at once, sending nothing: what a kill -9 of
// Asterisk leaves.
func (b *b2bua) reset() {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, tx := range b.clients {
		tx.timer.Stop()
	}
	closed := map[*call]bool{}
	for _, l := range b.legs {
		if c := l.call; !closed[c] {
			closed[c] = true
			c.closeMedia()
		}
	}
	for _, c := range b.invites {
		if !closed[c] {
			closed[c] = true
			c.closeMedia()
		}
	}
	b.clear()
	b.p.ami.DropCalls()
}

func (b *b2bua) close() {
	b.reset()
	close(b.stop)
	b.wg.Wait()
}

func (c *call) closeMedia() {
	if c.okTimer != nil {
		c.okTimer.Stop()
	}
	for _, l := range []*leg{c.caller, c.callee} {
		if l != nil && l.rtp != nil {
			l.rtp.close()
			l.rtp = nil
		}
	}
}

// isRegister: a REGISTER refresh carries the To tag of the last 200 OK,
// and is no request in a dialog.
func isRegister(msg []byte) bool { return bytes.HasPrefix(msg, []byte("REGISTER ")) }

// handle takes a message that belongs to calls; false leaves it to the
// rest of the stand-in (OPTIONS, REGISTER, Originate's answers).
func (b *b2bua) handle(c *net.UDPConn, data []byte, from *net.UDPAddr) bool {
	m, ok := parseSIP(data)
	if !ok {
		return false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if !m.isRequest() {
		return b.response(m)
	}
	toTag := tagOf(m.get("to"))
	switch {
	case m.method == "INVITE", m.method == "ACK", m.method == "CANCEL", m.method == "BYE", toTag != "":
	default:
		return false
	}
	if a, ok := b.answers[m.branch()+" "+m.method]; ok && m.method != "ACK" {
		_, _ = a.conn.WriteToUDP(a.data, a.to)
		return true
	}
	switch {
	case m.method == "ACK":
		b.ack(m)
	case m.method == "CANCEL":
		b.cancel(c, m, from)
	case m.method == "INVITE" && toTag == "":
		b.invite(c, m, from)
	default:
		b.inDialog(c, m, from)
	}
	return true
}

// reply answers a request and keeps the answer for its retransmissions.
func (b *b2bua) reply(c *net.UDPConn, req *sipMsg, from *net.UDPAddr, data []byte) {
	b.answers[req.branch()+" "+req.method] = &answer{data: data, to: from, conn: c, at: time.Now()}
	if _, err := c.WriteToUDP(data, from); err != nil {
		b.p.log.Warn("sip reply", "to", from.String(), "err", err)
	}
}

// simple answers a request with a status and no body.
func (b *b2bua) simple(c *net.UDPConn, req *sipMsg, from *net.UDPAddr, status int, reason, toTag string, extra ...header) {
	b.reply(c, req, from, b.p.response(req, from, status, reason, toTag, extra, ""))
}

func (b *b2bua) knowsEndpoint(name string) bool {
	eps := b.p.cfg.AMI.Endpoints
	if len(eps) == 0 {
		return name != ""
	}
	for _, e := range eps {
		if e.Name == name {
			return true
		}
	}
	return false
}

// directMedia is the endpoint's direct_media (Asterisk's default: yes).
func (b *b2bua) directMedia(name string) bool {
	for _, e := range b.p.cfg.AMI.Endpoints {
		if e.Name == name {
			return !e.NoDirectMedia
		}
	}
	return !b.p.cfg.NoDirectMedia
}

// invite starts a call: the caller's INVITE, dialled to the callee's
// first contact.
func (b *b2bua) invite(c *net.UDPConn, m *sipMsg, from *net.UDPAddr) {
	callerEP, exten := userOf(uriOf(m.get("from"))), userOf(m.ruri)
	if !b.knowsEndpoint(exten) {
		b.simple(c, m, from, 404, "Not Found", newUUID())
		return
	}
	offer, ok := parseSDP(m.body)
	if !ok {
		b.simple(c, m, from, 488, "Not Acceptable Here", newUUID())
		return
	}
	b.simple(c, m, from, 100, "Trying", "")
	callerDest, err := hostPortOf(uriOf(m.get("contact")))
	if err != nil {
		callerDest = from
	}
	cseq, _ := m.cseq()
	caller := &leg{caller: true, endpoint: callerEP, callID: m.get("call-id"), localTag: newUUID(), remoteTag: tagOf(m.get("from")),
		remoteCSeq: cseq, target: uriOf(m.get("contact")), dest: callerDest, phone: offer, payloads: accept(offer.payloads),
		requestURI: m.ruri, remoteAddr: from.String(), localAddr: c.LocalAddr().String()}
	caller.localURI, _ = splitNameAddr(m.get("to"))
	caller.remoteURI, _ = splitNameAddr(m.get("from"))
	if caller.tr, ok = requestTransport(b.transports, callerDest); !ok {
		// The sockets are being opened or closed.
		b.simple(c, m, from, 503, "Service Unavailable", caller.localTag)
		return
	}

	contacts := b.p.ami.Contacts(exten)
	if len(contacts) == 0 {
		b.simple(c, m, from, 503, "Service Unavailable", caller.localTag, header{"Reason", "Q.850;cause=34"})
		b.p.ami.Unreachable(callerEP, exten, caller.vars(nil))
		return
	}
	calleeDest, err := hostPortOf(contacts[0].URI)
	if err != nil {
		b.simple(c, m, from, 503, "Service Unavailable", caller.localTag, header{"Reason", "Q.850;cause=34"})
		b.p.ami.Unreachable(callerEP, exten, caller.vars(nil))
		return
	}
	tr, _ := requestTransport(b.transports, calleeDest)
	callee := &leg{endpoint: exten, callID: newUUID(), localTag: newUUID(), target: contacts[0].URI, dest: calleeDest, tr: tr,
		localCSeq: firstCSeq(), localURI: "<sip:" + callerEP + "@" + tr.ownIP(calleeDest) + ">",
		remoteURI: "<sip:" + exten + "@" + calleeDest.IP.String() + ">", payloads: offered}
	cl := &call{caller: caller, callee: callee, inv: m, invFrom: from, invConn: c,
		direct: b.directMedia(callerEP) && b.directMedia(exten)}
	caller.call, callee.call = cl, cl
	for _, l := range []*leg{caller, callee} {
		l.rtp, err = newRTPLeg(b.p.frozen)
		if err != nil {
			cl.closeMedia()
			b.simple(c, m, from, 500, "Server Internal Error", caller.localTag)
			return
		}
		l.sdpSession, l.sdpVersion = uint64(rand.Uint32()), 0
	}
	pair(caller.rtp, callee.rtp)
	caller.rtp.setPhone(offer.addr())
	b.invites[m.get("call-id")+"|"+m.branch()] = cl
	cl.ami = b.p.ami.StartCall(callerEP, exten, exten, caller.vars(callee))

	body := callee.ownSDP(offered)
	tx := b.request(callee, "INVITE", callee.localCSeq, "", body)
	tx.onResponse = func(r *sipMsg) { b.calleeAnswered(cl, tx, r) }
	tx.onTimeout = func() {
		if cl.cancelled {
			cl.closeMedia()
			return
		}
		b.calleeFailed(cl, 408, "Request Timeout")
	}
	cl.calleeInvite = tx
}

// vars is what Getvar reads of the leg; other is the call's other leg,
// whose media a direct leg is sent to.
func (l *leg) vars(other *leg) amipeer.LegVars {
	v := amipeer.LegVars{CallID: l.callID, LocalTag: l.localTag, RemoteTag: l.remoteTag, LocalURI: l.localURI,
		RemoteURI: l.remoteURI, TargetURI: l.target, RequestURI: l.requestURI, RemoteAddr: l.remoteAddr, LocalAddr: l.localAddr}
	if a := l.phone.addr(); a != nil {
		v.RTPDest = a.String()
	}
	if l.rtp != nil && l.dest != nil {
		v.RTPSrc = net.JoinHostPort(l.tr.ownIP(l.dest), fmt.Sprint(l.rtp.port()))
	}
	if l.direct && other != nil {
		if a := other.phone.addr(); a != nil {
			v.RTPDirect = a.String()
		}
	}
	return v
}

func (b *b2bua) syncVars(cl *call) {
	caller, callee := cl.caller.vars(cl.callee), cl.callee.vars(cl.caller)
	cl.ami.SetVars(&caller, &callee)
}

// ownSDP is the leg's session description with the stand-in's own media.
func (l *leg) ownSDP(payloads []string) string {
	l.sdpVersion++
	own := l.tr.ownIP(l.dest)
	return writeSDP(l.sdpSession, l.sdpSession+l.sdpVersion-1, own, l.tr.mediaHost(l.dest, own), l.rtp.port(), payloads)
}

// directSDP sends the leg's phone to the other phone's media.
func (l *leg) directSDP(other *leg) string {
	l.sdpVersion++
	own := l.tr.ownIP(l.dest)
	return writeSDP(l.sdpSession, l.sdpSession+l.sdpVersion-1, own, l.tr.mediaHost(l.dest, other.phone.ip), other.phone.port, l.payloads)
}

// request sends a request in the leg's dialog (cseq 0: the next one).
func (b *b2bua) request(l *leg, method string, cseq uint32, reason string, body string) *clientTx {
	if cseq == 0 {
		l.localCSeq++
		cseq = l.localCSeq
	}
	branch := "z9hG4bKPj" + newUUID()
	data := l.requestBytes(method, cseq, branch, reason, body)
	tx := &clientTx{key: branch + " " + method, invite: method == "INVITE", data: data, tr: l.tr, dest: l.dest,
		interval: t1, started: time.Now()}
	if method == "INVITE" && body != "" {
		l.lastSDP = body
	}
	b.start(tx)
	return tx
}

// start sends a request and arms its retransmission.
func (b *b2bua) start(tx *clientTx) {
	b.clients[tx.key] = tx
	b.send(tx.tr, tx.dest, tx.data)
	tx.timer = time.AfterFunc(tx.interval, func() { b.retransmit(tx) })
}

// requestBytes writes a request of the stand-in's in the leg's dialog,
// headers in Asterisk's order.
func (l *leg) requestBytes(method string, cseq uint32, branch, reason, body string) []byte {
	hp := l.tr.signalHostPort(l.dest)
	to := l.remoteURI
	if l.remoteTag != "" {
		to += ";tag=" + l.remoteTag
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s SIP/2.0\r\nVia: SIP/2.0/UDP %s;rport;branch=%s\r\nFrom: %s;tag=%s\r\nTo: %s\r\n",
		method, l.target, hp, branch, l.localURI, l.localTag, to)
	if method == "INVITE" {
		if l.caller {
			fmt.Fprintf(&b, "Contact: <sip:%s>\r\n", hp)
		} else {
			fmt.Fprintf(&b, "Contact: <sip:asterisk@%s>\r\n", hp)
		}
	}
	fmt.Fprintf(&b, "Call-ID: %s\r\nCSeq: %d %s\r\n", l.callID, cseq, method)
	if method == "INVITE" {
		fmt.Fprintf(&b, "Allow: %s\r\nSupported: 100rel, replaces, norefersub, histinfo\r\n", allowMethods)
	}
	if reason != "" {
		fmt.Fprintf(&b, "Reason: %s\r\n", reason)
	}
	fmt.Fprintf(&b, "Max-Forwards: 70\r\nUser-Agent: %s\r\n", standInServer)
	if body != "" {
		b.WriteString("Content-Type: application/sdp\r\n")
	}
	b.WriteString(contentLength(body))
	b.WriteString("\r\n")
	b.WriteString(body)
	return []byte(b.String())
}

// ackBytes acknowledges an INVITE's final answer: a 2xx with a new
// branch, anything else with the INVITE's.
func (l *leg) ackBytes(cseq uint32, r *sipMsg) []byte {
	branch := "z9hG4bKPj" + newUUID()
	if r.status >= 300 {
		branch = r.branch()
	}
	hp := l.tr.signalHostPort(l.dest)
	return fmt.Appendf(nil, "ACK %s SIP/2.0\r\nVia: SIP/2.0/UDP %s;rport;branch=%s\r\nFrom: %s;tag=%s\r\nTo: %s\r\nCall-ID: %s\r\nCSeq: %d ACK\r\nMax-Forwards: 70\r\nUser-Agent: %s\r\n%s\r\n",
		l.target, hp, branch, l.localURI, l.localTag, r.get("to"), l.callID, cseq, standInServer, contentLength(""))
}

func (b *b2bua) send(tr transport, dest *net.UDPAddr, data []byte) {
	if tr.conn == nil || b.p.frozen() {
		return
	}
	if _, err := tr.conn.WriteToUDP(data, dest); err != nil {
		b.p.log.Warn("sip send", "to", dest.String(), "err", err)
	}
}

// retransmit is timer A (an INVITE until any answer) and timer E (any
// other request until a final one), up to timer B and F.
func (b *b2bua) retransmit(tx *clientTx) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.clients[tx.key] != tx || tx.final {
		return
	}
	if time.Since(tx.started) >= txLifetime {
		delete(b.clients, tx.key)
		if tx.onTimeout != nil {
			tx.onTimeout()
		}
		return
	}
	if !(tx.invite && tx.provisional) {
		b.send(tx.tr, tx.dest, tx.data)
	}
	tx.interval *= 2
	if !tx.invite {
		tx.interval = min(tx.interval, t2)
	}
	tx.timer.Reset(tx.interval)
}

// response hands an answer to the request it answers.
func (b *b2bua) response(r *sipMsg) bool {
	_, method := r.cseq()
	tx := b.clients[r.branch()+" "+method]
	if tx == nil {
		return false
	}
	if tx.final {
		if r.status >= 200 && tx.ack != nil {
			b.send(tx.tr, tx.dest, tx.ack)
		}
		return true
	}
	if r.status < 200 {
		tx.provisional = true
	} else {
		tx.final = true
		tx.timer.Stop()
		// An INVITE's transaction stays a while, to acknowledge a
		// retransmitted final answer again.
		time.AfterFunc(txLifetime, func() {
			b.mu.Lock()
			if b.clients[tx.key] == tx {
				delete(b.clients, tx.key)
			}
			b.mu.Unlock()
		})
	}
	if tx.onResponse != nil {
		tx.onResponse(r)
	}
	return true
}

// calleeAnswered follows the callee's answers to the INVITE.
func (b *b2bua) calleeAnswered(cl *call, tx *clientTx, r *sipMsg) {
	callee, caller := cl.callee, cl.caller
	switch {
	case r.status < 200:
		if r.status != 100 && cl.state == callDialing && !cl.cancelled {
			cl.state = callRinging
			b.simple(cl.invConn, cl.inv, cl.invFrom, 180, "Ringing", caller.localTag,
				header{"Contact", "<sip:" + caller.tr.signalHostPort(caller.dest) + ">"}, header{"Allow", allowMethods})
			cl.ami.Ringing()
		}
	case r.status < 300:
		callee.remoteTag = tagOf(r.get("to"))
		if ct := uriOf(r.get("contact")); r.get("contact") != "" {
			callee.target = ct
			if d, err := hostPortOf(ct); err == nil {
				callee.dest = d
			}
		}
		tx.ack = callee.ackBytes(callee.localCSeq, r)
		b.send(callee.tr, callee.dest, tx.ack)
		if cl.cancelled {
			b.bye(callee)
			return
		}
		if answer, ok := parseSDP(r.body); ok {
			callee.phone, callee.payloads = answer, accept(answer.payloads)
			callee.rtp.setPhone(answer.addr())
		}
		cl.state = callAnswered
		delete(b.invites, cl.inv.get("call-id")+"|"+cl.inv.branch())
		b.legs[caller.key()], b.legs[callee.key()] = caller, callee
		b.answerCaller(cl)
		caller.rtp.setRelay(true)
		callee.rtp.setRelay(true)
		cl.ami.Answered()
		b.syncVars(cl)
	default:
		tx.ack = callee.ackBytes(callee.localCSeq, r)
		b.send(callee.tr, callee.dest, tx.ack)
		if cl.cancelled {
			cl.closeMedia()
			return
		}
		b.calleeFailed(cl, r.status, r.reason)
	}
}

// calleeFailed ends a call the callee refused (or never answered).
func (b *b2bua) calleeFailed(cl *call, status int, reason string) {
	var extra []header
	if status == 486 || status == 600 || status == 603 {
		status, reason = 486, "Busy Here"
		extra = append(extra, header{"Reason", "Q.850;cause=17"})
	}
	delete(b.invites, cl.inv.get("call-id")+"|"+cl.inv.branch())
	b.simple(cl.invConn, cl.inv, cl.invFrom, status, reason, cl.caller.localTag, extra...)
	cl.ami.Busy(status)
	cl.closeMedia()
}

// answerCaller sends the caller its 200 OK, again until it is
// acknowledged (RFC 3261 13.3.1.4).
func (b *b2bua) answerCaller(cl *call) {
	caller := cl.caller
	body := caller.ownSDP(caller.payloads)
	caller.lastSDP = body
	data := b.p.response(cl.inv, cl.invFrom, 200, "OK", caller.localTag, []header{{"Allow", allowMethods},
		{"Contact", "<sip:" + caller.tr.signalHostPort(caller.dest) + ">"}, {"Supported", "100rel, replaces, norefersub"}}, body)
	b.reply(cl.invConn, cl.inv, cl.invFrom, data)
	interval, started := t1, time.Now()
	again := func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		if cl.okTimer == nil || time.Since(started) >= txLifetime {
			return
		}
		if !b.p.frozen() {
			_, _ = cl.invConn.WriteToUDP(data, cl.invFrom)
		}
		interval = min(2*interval, t2)
		cl.okTimer.Reset(interval)
	}
	cl.okTimer = time.AfterFunc(interval, again)
}

// ack takes a phone's ACK: of the caller's 200 OK, it completes the call
// and, with direct media, sends each phone to the other.
func (b *b2bua) ack(m *sipMsg) {
	l := b.legs[m.get("call-id")+"|"+tagOf(m.get("to"))]
	if l == nil || !l.caller {
		return
	}
	cl := l.call
	if cl.okTimer == nil {
		return
	}
	cl.okTimer.Stop()
	cl.okTimer = nil
	if cl.direct && cl.state == callAnswered {
		b.goDirect(cl)
	}
}

// goDirect re-INVITEs both phones to send their audio to each other.
func (b *b2bua) goDirect(cl *call) {
	if cl.caller.phone.addr() == nil || cl.callee.phone.addr() == nil {
		return
	}
	// Getvar reads the media as direct from the moment the re-INVITEs go.
	cl.caller.direct, cl.callee.direct = true, true
	b.syncVars(cl)
	for _, pr := range [][2]*leg{{cl.caller, cl.callee}, {cl.callee, cl.caller}} {
		l, other := pr[0], pr[1]
		l.rtp.setRelay(false)
		tx := b.request(l, "INVITE", 0, "", l.directSDP(other))
		cseq := l.localCSeq
		tx.onResponse = func(r *sipMsg) { b.reinviteAnswered(l, tx, cseq, r, nil) }
	}
}

// reinviteAnswered acknowledges a re-INVITE's answer; then runs next. A
// 481 or 408 ends the dialog (RFC 3261 14.1), and so the call.
func (b *b2bua) reinviteAnswered(l *leg, tx *clientTx, cseq uint32, r *sipMsg, next func()) {
	if r.status < 200 {
		return
	}
	tx.ack = l.ackBytes(cseq, r)
	b.send(l.tr, l.dest, tx.ack)
	if (r.status == 481 || r.status == 408) && l.call.state == callAnswered {
		b.hangup(l)
		return
	}
	if next != nil {
		next()
	}
}

// cancel takes the caller's CANCEL of its INVITE.
func (b *b2bua) cancel(c *net.UDPConn, m *sipMsg, from *net.UDPAddr) {
	cl := b.invites[m.get("call-id")+"|"+m.branch()]
	if cl == nil {
		b.simple(c, m, from, 481, "Call/Transaction Does Not Exist", "")
		return
	}
	b.simple(c, m, from, 200, "OK", cl.caller.localTag)
	delete(b.invites, m.get("call-id")+"|"+m.branch())
	b.simple(cl.invConn, cl.inv, cl.invFrom, 487, "Request Terminated", cl.caller.localTag,
		header{"Allow", allowMethods}, header{"Reason", "Q.850;cause=0"})
	cl.cancelled = true
	// CANCEL shares the INVITE's branch (RFC 3261 9.1).
	inv := cl.calleeInvite
	branch, _, _ := strings.Cut(inv.key, " ")
	callee := cl.callee
	data := callee.requestBytes("CANCEL", callee.localCSeq, branch, "Q.850;cause=127", "")
	b.start(&clientTx{key: branch + " CANCEL", data: data, tr: callee.tr, dest: callee.dest, interval: t1, started: time.Now()})
	cl.ami.Cancelled()
}

// inDialog takes a request with a To tag.
func (b *b2bua) inDialog(c *net.UDPConn, m *sipMsg, from *net.UDPAddr) {
	switch m.method {
	case "INVITE", "UPDATE", "REFER", "NOTIFY", "SUBSCRIBE":
		// A target refresh names the new target; Asterisk refuses one
		// without, before it looks for the dialog.
		if m.get("contact") == "" {
			b.simple(c, m, from, 400, "Missing Contact header", "")
			return
		}
	}
	key := m.get("call-id") + "|" + tagOf(m.get("to"))
	l := b.legs[key]
	if l == nil || l.remoteTag != tagOf(m.get("from")) {
		if e, ok := b.ended[key]; ok && time.Now().Before(e.until) {
			// The dialog is over but pjproject still has it.
			switch m.method {
			case "BYE":
				b.simple(c, m, from, 200, "OK", "")
			case "INVITE":
			default:
				b.simple(c, m, from, 500, "Unhandled by dialog usages", "")
			}
			return
		}
		b.simple(c, m, from, 481, "Call/Transaction Does Not Exist", "")
		return
	}
	cseq, _ := m.cseq()
	if l.remoteCSeq != 0 && cseq < l.remoteCSeq {
		b.simple(c, m, from, 500, "Invalid CSeq", "")
		return
	}
	l.remoteCSeq = cseq
	switch m.method {
	case "BYE":
		b.simple(c, m, from, 200, "OK", "")
		b.ended[key] = endedDialog{until: time.Now().Add(byeReceived)}
		delete(b.legs, key)
		b.hangup(l)
	case "INVITE":
		if offer, ok := parseSDP(m.body); ok && !l.direct {
			l.phone = offer
			l.rtp.setPhone(offer.addr())
		}
		b.reply(c, m, from, b.p.response(m, from, 200, "OK", "", []header{{"Allow", allowMethods},
			{"Contact", "<sip:" + l.tr.signalHostPort(l.dest) + ">"}, {"Supported", "100rel, replaces, norefersub"}}, l.lastSDP))
	case "REFER", "SUBSCRIBE":
		b.simple(c, m, from, 501, "Not Implemented", "")
	default:
		b.simple(c, m, from, 200, "OK", "")
	}
}

// hangup ends an answered call whose leg l is over (its phone hung up,
// or its dialog is gone): the other phone is told, after getting its
// audio back from the other phone when it was direct.
func (b *b2bua) hangup(l *leg) {
	cl := l.call
	if cl.state != callAnswered {
		return
	}
	cl.state = callEnding
	cl.ami.HungUp(l.caller)
	cl.ended++
	delete(b.legs, l.key())
	other := cl.caller
	if l.caller {
		other = cl.callee
	}
	if !other.direct {
		b.bye(other)
		return
	}
	other.direct = false
	tx := b.request(other, "INVITE", 0, "", other.ownSDP(other.payloads))
	cseq := other.localCSeq
	tx.onResponse = func(r *sipMsg) { b.reinviteAnswered(other, tx, cseq, r, func() { b.bye(other) }) }
	tx.onTimeout = func() { b.bye(other) }
}

// amiHangup ends an answered call whose channel an AMI Hangup named, as
// Asterisk 22 does (observed with phones that had ended their dialogs, the
// old holder's after a planned move): each phone whose audio goes direct
// is re-INVITEd to send it back to the PBX, then sent a BYE; a phone that
// answers the re-INVITE 481 or not at all is sent a second BYE right
// after (the one the failed re-INVITE ends the session with). The AMI
// peer raises the hang-up's events.
func (b *b2bua) amiHangup(c *amipeer.Call, channel string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	var cl *call
	for _, l := range b.legs {
		if l.call.ami == c {
			cl = l.call
			break
		}
	}
	c.HungUpByAMI(channel)
	if cl == nil || cl.state != callAnswered {
		return
	}
	cl.state = callEnding
	for _, l := range []*leg{cl.caller, cl.callee} {
		if !l.direct {
			b.bye(l)
			continue
		}
		l.direct = false
		tx := b.request(l, "INVITE", 0, "", l.ownSDP(l.payloads))
		cseq := l.localCSeq
		tx.onResponse = func(r *sipMsg) {
			if r.status < 200 {
				return
			}
			tx.ack = l.ackBytes(cseq, r)
			b.send(l.tr, l.dest, tx.ack)
			b.bye(l)
			if r.status == 481 || r.status == 408 {
				b.request(l, "BYE", 0, "Q.850;cause=16", "")
			}
		}
		tx.onTimeout = func() {
			b.bye(l)
			b.request(l, "BYE", 0, "Q.850;cause=16", "")
		}
	}
}

// bye ends the leg's dialog from the stand-in's side.
func (b *b2bua) bye(l *leg) {
	tx := b.request(l, "BYE", 0, "Q.850;cause=16", "")
	done := func() {
		b.ended[l.key()] = endedDialog{until: time.Now().Add(byeSent)}
		delete(b.legs, l.key())
		l.call.ended++
		if l.call.ended >= 2 || l.call.state != callEnding {
			l.call.closeMedia()
		}
	}
	tx.onResponse = func(r *sipMsg) {
		if r.status >= 200 {
			done()
		}
	}
	tx.onTimeout = done
}
