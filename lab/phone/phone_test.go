package phone

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/platform/waittest"
)

// Phones on loopback, against each other and against a scripted peer (a
// UDP socket the test writes SIP on by hand, standing for a PBX), with
// short RFC 3261 timers so retransmissions come quickly.

var loopback = netip.MustParseAddr("127.0.0.1")

func newPhone(t *testing.T, cfg Config) *Phone {
	t.Helper()
	if !cfg.Addr.IsValid() {
		cfg.Addr = netip.AddrPortFrom(loopback, 0)
	}
	if !cfg.Server.IsValid() {
		cfg.Server = netip.AddrPortFrom(loopback, 9) // never reached unless the test says so
	}
	if cfg.T1 == 0 {
		cfg.T1, cfg.T2, cfg.T4 = 50*time.Millisecond, 400*time.Millisecond, 500*time.Millisecond
	}
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// peer is a scripted SIP endpoint: what it reads, it returns parsed.
type peer struct {
	t    *testing.T
	conn *net.UDPConn
	addr netip.AddrPort
}

func newPeer(t *testing.T) *peer {
	t.Helper()
	c, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(loopback, 0)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &peer{t: t, conn: c, addr: c.LocalAddr().(*net.UDPAddr).AddrPort()}
}

// recv returns the next message for which want holds (others are
// skipped), or fails the test after within.
func (pr *peer) recv(within time.Duration, want func(*message) bool) (*message, netip.AddrPort) {
	pr.t.Helper()
	deadline := time.Now().Add(within)
	buf := make([]byte, maxMessage)
	for {
		_ = pr.conn.SetReadDeadline(deadline)
		n, from, err := pr.conn.ReadFromUDPAddrPort(buf)
		if err != nil {
			pr.t.Fatalf("peer %s: nothing wanted within %v: %v", pr.addr, within, err)
		}
		m, err := parseMessage(buf[:n])
		if err != nil {
			continue
		}
		if want == nil || want(m) {
			return m, from
		}
	}
}

// silent fails the test if a wanted message arrives within d.
func (pr *peer) silent(d time.Duration, want func(*message) bool) {
	pr.t.Helper()
	deadline := time.Now().Add(d)
	buf := make([]byte, maxMessage)
	for {
		_ = pr.conn.SetReadDeadline(deadline)
		n, _, err := pr.conn.ReadFromUDPAddrPort(buf)
		if err != nil {
			return
		}
		if m, err := parseMessage(buf[:n]); err == nil && (want == nil || want(m)) {
			pr.t.Fatalf("peer %s: got %s (%s), wanted nothing", pr.addr, m.firstLine(), m.get("cseq"))
		}
	}
}

func (pr *peer) send(m *message, to netip.AddrPort) {
	pr.t.Helper()
	if _, err := pr.conn.WriteToUDPAddrPort(m.bytes(), to); err != nil {
		pr.t.Fatal(err)
	}
}

func isRequest(method string) func(*message) bool {
	return func(m *message) bool { return m.request && m.method == method }
}

func isResponse(status int, method string) func(*message) bool {
	return func(m *message) bool {
		_, meth := m.cseq()
		return !m.request && m.status == status && meth == method
	}
}

// rtpSink is a UDP socket that reads RTP.
type rtpSink struct {
	conn *net.UDPConn
	addr netip.AddrPort
}

func newRTPSink(t *testing.T) *rtpSink {
	t.Helper()
	c, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(loopback, 0)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &rtpSink{conn: c, addr: c.LocalAddr().(*net.UDPAddr).AddrPort()}
}

type rtpPacket struct {
	from          netip.AddrPort
	pt            byte
	marker        bool
	seq           uint16
	ts, ssrc      uint32
	size, version int
}

func (s *rtpSink) read(t *testing.T, n int, within time.Duration) []rtpPacket {
	t.Helper()
	var out []rtpPacket
	buf := make([]byte, 2048)
	deadline := time.Now().Add(within)
	for len(out) < n {
		_ = s.conn.SetReadDeadline(deadline)
		k, from, err := s.conn.ReadFromUDPAddrPort(buf)
		if err != nil {
			t.Fatalf("rtp sink: %d of %d packets within %v: %v", len(out), n, within, err)
		}
		out = append(out, rtpPacket{from: from, version: int(buf[0] >> 6), pt: buf[1] & 0x7f, marker: buf[1]&0x80 != 0,
			seq: binary.BigEndian.Uint16(buf[2:]), ts: binary.BigEndian.Uint32(buf[4:]), ssrc: binary.BigEndian.Uint32(buf[8:]), size: k})
	}
	return out
}

// checkStream asserts RTP as RFC 3550/3551 say PCMU at 20 ms goes: version
// 2, payload type 0, 160 bytes of audio, one SSRC, each sequence number
// one above the last, each timestamp 160 samples later.
func checkStream(t *testing.T, pkts []rtpPacket, from netip.AddrPort) {
	t.Helper()
	for i, p := range pkts {
		if p.version != 2 || p.pt != pcmuPayload || p.size != rtpHeaderLen+samplesPerPkt || p.from != from {
			t.Fatalf("packet %d: %+v, want RTP v2 PCMU of %d bytes from %s", i, p, rtpHeaderLen+samplesPerPkt, from)
		}
		if i == 0 {
			continue
		}
		q := pkts[i-1]
		if p.ssrc != q.ssrc || p.seq != q.seq+1 || p.ts != q.ts+samplesPerPkt {
			t.Fatalf("packet %d: ssrc %x seq %d ts %d after ssrc %x seq %d ts %d", i, p.ssrc, p.seq, p.ts, q.ssrc, q.seq, q.ts)
		}
	}
}

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func waitStatus(t *testing.T, p *Phone, what string, cond func(Status) bool) Status {
	t.Helper()
	s, err := p.Wait(ctxFor(t, 5*time.Second), cond)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return s
}

func state(st State) func(Status) bool { return func(s Status) bool { return s.State == st } }

// TestCallBetweenPhones: one phone calls the other straight at its
// address; both send PCMU to each other, the caller hangs up and the
// other phone is told.
func TestCallBetweenPhones(t *testing.T) {
	a := newPhone(t, Config{User: "6001"})
	b := newPhone(t, Config{User: "6002", AutoAnswer: true, AnswerAfter: 30 * time.Millisecond})
	if err := a.Call(ctxFor(t, 5*time.Second), "sip:6002@"+b.SIPAddr().String()); err != nil {
		t.Fatal(err)
	}
	waitStatus(t, b, "b up", state(StateUp))
	for _, pc := range []struct{ rx, tx *Phone }{{a, b}, {b, a}} {
		waittest.Succeeds(t, 5*time.Second, fmt.Sprintf("%s receiving 20 packets from %s", pc.rx.User(), pc.tx.RTPAddr()), func() error {
			if got := pc.rx.RTP(); got.Sources[pc.tx.RTPAddr()] < 20 {
				return fmt.Errorf("received %+v", got)
			}
			return nil
		})
		if st := pc.rx.RTP(); st.SequenceGaps != 0 {
			t.Fatalf("%s: %d sequence gaps on loopback", pc.rx.User(), st.SequenceGaps)
		}
	}
	if s := a.Status(); s.Media != b.RTPAddr() {
		t.Fatalf("a sends to %s, want b's %s", s.Media, b.RTPAddr())
	}
	if err := a.Hangup(ctxFor(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	sb := waitStatus(t, b, "b ended", state(StateEnded))
	if sb.Reason != ReasonByeReceived {
		t.Fatalf("b: %q, want %q", sb.Reason, ReasonByeReceived)
	}
	if sa := a.Status(); sa.State != StateEnded || sa.Reason != ReasonHungUp+", BYE answered 200 OK" {
		t.Fatalf("a: %+v", sa)
	}
	// Once ended, a phone sends no more audio.
	before := b.RTP().Received
	time.Sleep(100 * time.Millisecond)
	if after := b.RTP().Received; after > before+1 {
		t.Fatalf("b still receives audio after the hangup: %d -> %d", before, after)
	}
}

// TestRegisterAnswersDigest: a registrar challenges as Asterisk 22 does
// (two WWW-Authenticate headers, SHA-256 first); the phone answers the MD5
// one with qop auth and keeps the Call-ID, raising the CSeq.
func TestRegisterAnswersDigest(t *testing.T) {
	reg := newPeer(t)
	p := newPhone(t, Config{User: "6001", Password: "secret", Server: reg.addr})
	done := make(chan error, 1)
	go func() { done <- p.Register(ctxFor(t, 5*time.Second)) }()
	r1, from := reg.recv(2*time.Second, isRequest("REGISTER"))
	if r1.get("authorization") != "" || r1.get("contact") != "<sip:6001@"+p.SIPAddr().String()+">" || r1.get("expires") != "300" {
		t.Fatalf("first REGISTER: %s", r1.bytes())
	}
	ch := response(r1, 401, "Unauthorized", "as1")
	ch.add("www-authenticate", `Digest realm="asterisk",nonce="1780000000/abcdef",opaque="5f1e",algorithm=SHA-256,qop="auth"`)
	ch.add("www-authenticate", `Digest realm="asterisk",nonce="1780000000/abcdef",opaque="5f1e",algorithm=MD5,qop="auth"`)
	reg.send(ch, from)
	r2, from := reg.recv(2*time.Second, func(m *message) bool { return isRequest("REGISTER")(m) && m.get("authorization") != "" })
	n1, _ := r1.cseq()
	n2, _ := r2.cseq()
	if r2.get("call-id") != r1.get("call-id") || n2 != n1+1 || r2.branch() == r1.branch() {
		t.Fatalf("second REGISTER: Call-ID %q CSeq %d branch %s after %q %d %s", r2.get("call-id"), n2, r2.branch(), r1.get("call-id"), n1, r1.branch())
	}
	kv := authParams(strings.TrimPrefix(r2.get("authorization"), "Digest "))
	c := challenge{realm: "asterisk", nonce: "1780000000/abcdef", qops: []string{"auth"}}
	want := md5hex(md5hex("6001:asterisk:secret") + ":" + c.nonce + ":" + kv["nc"] + ":" + kv["cnonce"] + ":auth:" + md5hex("REGISTER:"+r2.uri))
	if kv["response"] != want || kv["algorithm"] != "MD5" || kv["qop"] != "auth" || kv["opaque"] != "5f1e" || kv["username"] != "6001" || kv["uri"] != r2.uri {
		t.Fatalf("Authorization %q, want response %s", r2.get("authorization"), want)
	}
	ok := response(r2, 200, "OK", "as1")
	ok.add("contact", "<sip:6001@"+p.SIPAddr().String()+">;expires=120")
	reg.send(ok, from)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !p.Status().Registered {
		t.Fatal("not registered after 200")
	}
}

// TestDigestVector is RFC 2617 §3.5's example.
func TestDigestVector(t *testing.T) {
	c := challenge{realm: "testrealm@host.com", nonce: "dcd98b7102dd2f0e8b11d0f600bfb0c093", opaque: "5ccc069c403ebaf9f0171e9517f40e41", qops: []string{"auth", "auth-int"}}
	got := authParams(strings.TrimPrefix(c.authorization("Mufasa", "Circle Of Life", "GET", "/dir/index.html", "0a4f113b"), "Digest "))
	if got["response"] != "6629fae49393a05397450978507c4ef1" {
		t.Fatalf("response %s", got["response"])
	}
}

// invite builds the INVITE a PBX sends a phone, with an offer to rtp.
func invite(pbx *peer, to *Phone, rtp netip.AddrPort) *message {
	m := &message{request: true, method: "INVITE", uri: "sip:" + to.User() + "@" + to.SIPAddr().String()}
	m.add("via", "SIP/2.0/UDP "+pbx.addr.String()+";branch="+newBranch()+";rport")
	m.add("max-forwards", "70")
	m.add("from", `"6001" <sip:6001@`+pbx.addr.Addr().String()+`>;tag=pbx-tag`)
	m.add("to", "<sip:"+to.User()+"@"+to.SIPAddr().String()+">")
	m.add("contact", "<sip:asterisk@"+pbx.addr.String()+">")
	m.add("call-id", "call-"+randomHex(4))
	m.add("cseq", "100 INVITE")
	m.add("content-type", "application/sdp")
	m.body = buildSDP(1, 1, rtp, SendRecv)
	return m
}

// inDialog builds a PBX's next request in the dialog ok established.
func inDialog(pbx *peer, ok *message, method string, cseq int) *message {
	m := &message{request: true, method: method, uri: nameAddrURI(ok.get("contact"))}
	m.add("via", "SIP/2.0/UDP "+pbx.addr.String()+";branch="+newBranch()+";rport")
	m.add("max-forwards", "70")
	m.add("from", ok.get("from"))
	m.add("to", ok.get("to"))
	m.add("contact", "<sip:asterisk@"+pbx.addr.String()+">")
	m.add("call-id", ok.get("call-id"))
	m.add("cseq", fmt.Sprintf("%d %s", cseq, method))
	return m
}

// answerCall has pbx call phone and acknowledge its 200; it returns the 200.
func answerCall(t *testing.T, pbx *peer, ph *Phone, rtp netip.AddrPort) *message {
	t.Helper()
	inv := invite(pbx, ph, rtp)
	pbx.send(inv, ph.SIPAddr())
	pbx.recv(2*time.Second, isResponse(180, "INVITE"))
	ok, _ := pbx.recv(2*time.Second, isResponse(200, "INVITE"))
	ack := inDialog(pbx, ok, "ACK", 100)
	pbx.send(ack, ph.SIPAddr())
	return ok
}

// TestPBXMovesTheMedia: a PBX calls the phone with its own media address,
// then re-INVITEs it to send elsewhere (direct media), then re-INVITEs it
// with no offer (the phone offers in its 200, the ACK answers), and the
// phone's RTP follows each time with one stream.
func TestPBXMovesTheMedia(t *testing.T) {
	pbx := newPeer(t)
	ph := newPhone(t, Config{User: "6002", AutoAnswer: true})
	first, second, third := newRTPSink(t), newRTPSink(t), newRTPSink(t)
	ok := answerCall(t, pbx, ph, first.addr)
	waitStatus(t, ph, "up", state(StateUp))
	p1 := first.read(t, 10, 2*time.Second)
	checkStream(t, p1, ph.RTPAddr())
	if !p1[0].marker {
		t.Fatal("the first packet of the call has no marker bit")
	}

	re := inDialog(pbx, ok, "INVITE", 101)
	re.add("content-type", "application/sdp")
	re.body = buildSDP(1, 2, second.addr, SendRecv)
	pbx.send(re, ph.SIPAddr())
	ok2, _ := pbx.recv(2*time.Second, isResponse(200, "INVITE"))
	if sdp, err := parseSDP(ok2.body); err != nil || sdp.addr != ph.RTPAddr() || sdp.direction != SendRecv {
		t.Fatalf("answer to the re-INVITE: %+v %v", sdp, err)
	}
	pbx.send(inDialog(pbx, ok, "ACK", 101), ph.SIPAddr())
	p2 := second.read(t, 10, 2*time.Second)
	checkStream(t, p2, ph.RTPAddr())
	if p2[0].ssrc != p1[0].ssrc {
		t.Fatal("a new SSRC after the media moved: one stream expected")
	}

	re = inDialog(pbx, ok, "INVITE", 102)
	pbx.send(re, ph.SIPAddr())
	offer, _ := pbx.recv(2*time.Second, isResponse(200, "INVITE"))
	if sdp, err := parseSDP(offer.body); err != nil || sdp.addr != ph.RTPAddr() {
		t.Fatalf("offer in the 200 to a re-INVITE without one: %+v %v", sdp, err)
	}
	ack := inDialog(pbx, ok, "ACK", 102)
	ack.add("content-type", "application/sdp")
	ack.body = buildSDP(1, 3, third.addr, SendRecv)
	pbx.send(ack, ph.SIPAddr())
	checkStream(t, third.read(t, 10, 2*time.Second), ph.RTPAddr())

	// UPDATE without a body: 200, nothing moves.
	pbx.send(inDialog(pbx, ok, "UPDATE", 103), ph.SIPAddr())
	pbx.recv(2*time.Second, isResponse(200, "UPDATE"))
	if s := ph.Status(); s.State != StateUp || s.Media != third.addr {
		t.Fatalf("after UPDATE: %+v", s)
	}

	// A re-INVITE with a lower CSeq is out of order.
	pbx.send(inDialog(pbx, ok, "INFO", 50), ph.SIPAddr())
	pbx.recv(2*time.Second, isResponse(500, "INFO"))

	pbx.send(inDialog(pbx, ok, "BYE", 104), ph.SIPAddr())
	pbx.recv(2*time.Second, isResponse(200, "BYE"))
	if s := waitStatus(t, ph, "ended", state(StateEnded)); s.Reason != ReasonByeReceived {
		t.Fatalf("ended: %q", s.Reason)
	}
}

// TestUnknownDialog481: requests naming a dialog the phone does not have
// are answered 481, whatever their method; the call stays up.
func TestUnknownDialog481(t *testing.T) {
	pbx := newPeer(t)
	ph := newPhone(t, Config{User: "6002", AutoAnswer: true})
	ok := answerCall(t, pbx, ph, newRTPSink(t).addr)
	waitStatus(t, ph, "up", state(StateUp))
	for i, mutate := range []func(*message){
		func(m *message) { m.set("call-id", "other@x") },
		func(m *message) { m.set("from", `<sip:6001@127.0.0.1>;tag=not-the-pbx`) },
		func(m *message) { m.set("to", "<sip:6002@127.0.0.1>;tag=not-mine") },
	} {
		for _, method := range []string{"BYE", "INVITE", "UPDATE"} {
			m := inDialog(pbx, ok, method, 200+i)
			mutate(m)
			pbx.send(m, ph.SIPAddr())
			pbx.recv(2*time.Second, isResponse(481, method))
		}
	}
	if s := ph.Status(); s.State != StateUp {
		t.Fatalf("after requests of other dialogs: %+v", s)
	}
	var seen int
	for _, e := range ph.Events() {
		if e.Dir == "in" && e.Note == "no such dialog" && !e.InDialog {
			seen++
		}
	}
	if seen != 9 {
		t.Fatalf("%d requests recorded as of no dialog, want 9", seen)
	}
}

// TestSourceAddress: a phone takes a BYE in its dialog from any address;
// a strict one drops it unanswered unless it comes from where its own
// requests go.
func TestSourceAddress(t *testing.T) {
	for _, strict := range []bool{false, true} {
		t.Run(fmt.Sprintf("strict=%v", strict), func(t *testing.T) {
			pbx, other := newPeer(t), newPeer(t)
			ph := newPhone(t, Config{User: "6002", AutoAnswer: true, StrictSource: strict, Server: pbx.addr})
			ok := answerCall(t, pbx, ph, newRTPSink(t).addr)
			waitStatus(t, ph, "up", state(StateUp))
			other.send(inDialog(pbx, ok, "BYE", 101), ph.SIPAddr())
			if !strict {
				other.recv(2*time.Second, isResponse(200, "BYE"))
				if s := waitStatus(t, ph, "ended", state(StateEnded)); s.Reason != ReasonByeReceived {
					t.Fatalf("ended: %q", s.Reason)
				}
				return
			}
			other.silent(300*time.Millisecond, nil)
			if s := ph.Status(); s.State != StateUp {
				t.Fatalf("strict phone took a BYE from elsewhere: %+v", s)
			}
			pbx.send(inDialog(pbx, ok, "BYE", 102), ph.SIPAddr())
			pbx.recv(2*time.Second, isResponse(200, "BYE"))
			waitStatus(t, ph, "ended", state(StateEnded))
		})
	}
}

// uas answers the phone's INVITE as a PBX would, with an answer to rtp.
func uas(t *testing.T, pbx *peer, rtp netip.AddrPort) (*message, netip.AddrPort) {
	t.Helper()
	inv, from := pbx.recv(2*time.Second, isRequest("INVITE"))
	ok := response(inv, 200, "OK", "uas-tag")
	ok.add("contact", "<sip:6002@"+pbx.addr.String()+">")
	ok.add("content-type", "application/sdp")
	ok.body = buildSDP(7, 1, rtp, SendRecv)
	pbx.send(ok, from)
	return ok, from
}

// TestHoldEndsOnA481: the phone's hold (a re-INVITE offering sendonly)
// answered 481, as a PBX that lost the dialog answers, ends its call; the
// 481 is acknowledged.
func TestHoldEndsOnA481(t *testing.T) {
	pbx := newPeer(t)
	ph := newPhone(t, Config{User: "6001", Server: pbx.addr})
	sink := newRTPSink(t)
	done := make(chan error, 1)
	go func() { done <- ph.Call(ctxFor(t, 5*time.Second), "6002") }()
	uas(t, pbx, sink.addr)
	pbx.recv(2*time.Second, isRequest("ACK"))
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	checkStream(t, sink.read(t, 5, 2*time.Second), ph.RTPAddr())

	go func() { done <- ph.Hold(ctxFor(t, 5*time.Second)) }()
	re, from := pbx.recv(2*time.Second, isRequest("INVITE"))
	if sdp, err := parseSDP(re.body); err != nil || sdp.direction != SendOnly {
		t.Fatalf("hold offer: %+v %v", sdp, err)
	}
	if re.get("call-id") == "" || tagOf(re.get("to")) != "uas-tag" {
		t.Fatalf("hold outside the dialog: %s", re.bytes())
	}
	pbx.send(response(re, 481, "Call/Transaction Does Not Exist", "uas-tag"), from)
	// A BYE right behind the 481 (a keeper's) finds the dialog over: the
	// phone acts in the order things arrive.
	bye := &message{request: true, method: "BYE", uri: "sip:6001@" + ph.SIPAddr().String()}
	bye.add("via", "SIP/2.0/UDP "+pbx.addr.String()+";branch="+newBranch())
	bye.add("from", re.get("to"))
	bye.add("to", re.get("from"))
	bye.add("call-id", re.get("call-id"))
	bye.add("cseq", "1073741824 BYE")
	pbx.send(bye, from)
	var ack, byeAnswer *message
	for ack == nil || byeAnswer == nil {
		m, _ := pbx.recv(2*time.Second, func(m *message) bool { return isRequest("ACK")(m) || isResponse(481, "BYE")(m) })
		if m.request {
			ack = m
		} else {
			byeAnswer = m
		}
	}
	if ack.branch() != re.branch() {
		t.Fatal("the 481 was acknowledged outside its transaction")
	}
	if err := <-done; err == nil {
		t.Fatal("hold answered 481 returned no error")
	}
	if s := ph.Status(); s.State != StateEnded || s.Reason != ReasonRequest481 {
		t.Fatalf("after 481 to hold: %+v", s)
	}
}

// TestRetransmissions: an INVITE nobody answers goes out again on Timer A
// (T1 doubling) and the call fails after 64×T1; a BYE on Timer E (capped
// at T2); a 200 to an INVITE is sent again until its ACK.
func TestRetransmissions(t *testing.T) {
	pbx := newPeer(t)
	ph := newPhone(t, Config{User: "6001", Server: pbx.addr})
	start := time.Now()
	err := ph.Call(ctxFor(t, 10*time.Second), "6002")
	took := time.Since(start)
	if err == nil || ph.Status().Reason != ReasonNoAnswer {
		t.Fatalf("unanswered INVITE: %v, %+v", err, ph.Status())
	}
	var sent []time.Time
	for _, e := range ph.Events() {
		if e.Dir == "out" && e.What == "INVITE" {
			sent = append(sent, e.At)
		}
	}
	// 64×T1 = 3.2 s holds sends at 0, T1, 3T1, 7T1, 15T1, 31T1 (and 63T1).
	if len(sent) < 6 || len(sent) > 7 || took < 64*ph.cfg.T1 {
		t.Fatalf("%d INVITEs in %v, want 6 or 7 over 64×T1", len(sent), took)
	}
	for i := 2; i < len(sent); i++ {
		if prev, cur := sent[i-1].Sub(sent[i-2]), sent[i].Sub(sent[i-1]); cur < prev*3/2 {
			t.Fatalf("INVITE interval %d: %v after %v, want doubling", i, cur, prev)
		}
	}

	// A 200 sent again until its ACK.
	ph2 := newPhone(t, Config{User: "6002", AutoAnswer: true})
	inv := invite(pbx, ph2, newRTPSink(t).addr)
	pbx.send(inv, ph2.SIPAddr())
	first, _ := pbx.recv(2*time.Second, isResponse(200, "INVITE"))
	again, _ := pbx.recv(2*time.Second, isResponse(200, "INVITE"))
	if again.get("to") != first.get("to") || string(again.body) != string(first.body) {
		t.Fatal("the 200 sent again differs")
	}
	pbx.send(inDialog(pbx, first, "ACK", 100), ph2.SIPAddr())
	time.Sleep(2 * ph2.cfg.T1) // one retransmission may be on the wire
	pbx.silent(4*ph2.cfg.T1, isResponse(200, "INVITE"))

	// The BYE of a hangup goes out again until answered.
	go func() { _ = ph2.Hangup(ctxFor(t, 5*time.Second)) }()
	b1, _ := pbx.recv(2*time.Second, isRequest("BYE"))
	b2, from := pbx.recv(2*time.Second, isRequest("BYE"))
	if b1.branch() != b2.branch() || b1.get("cseq") != b2.get("cseq") {
		t.Fatal("BYE retransmission is another request")
	}
	pbx.send(response(b2, 200, "OK", ""), from)
	waitStatus(t, ph2, "hangup answered", func(s Status) bool { return strings.HasSuffix(s.Reason, "BYE answered 200 OK") })
}

// TestBusy: a phone with a call up answers another INVITE 486.
func TestBusy(t *testing.T) {
	pbx := newPeer(t)
	ph := newPhone(t, Config{User: "6002", AutoAnswer: true})
	answerCall(t, pbx, ph, newRTPSink(t).addr)
	waitStatus(t, ph, "up", state(StateUp))
	pbx.send(invite(pbx, ph, newRTPSink(t).addr), ph.SIPAddr())
	busy, from := pbx.recv(2*time.Second, isResponse(486, "INVITE"))
	// Sent again until acknowledged (Timer G).
	pbx.recv(2*time.Second, isResponse(486, "INVITE"))
	ack := &message{request: true, method: "ACK", uri: "sip:6002@" + ph.SIPAddr().String()}
	ack.add("via", busy.all("via")[0])
	ack.add("from", busy.get("from"))
	ack.add("to", busy.get("to"))
	ack.add("call-id", busy.get("call-id"))
	ack.add("cseq", "100 ACK")
	pbx.send(ack, from)
	time.Sleep(2 * ph.cfg.T1)
	pbx.silent(8*ph.cfg.T1, isResponse(486, "INVITE"))
	if s := ph.Status(); s.State != StateUp {
		t.Fatalf("first call after a second INVITE: %+v", s)
	}
}

// TestGap measures silences: a stream that stops has a gap that runs to
// the window's end.
func TestGap(t *testing.T) {
	m := &media{sources: map[netip.AddrPort]uint64{}}
	t0 := time.Unix(1000, 0)
	m.newCall(t0)
	src := netip.MustParseAddrPort("127.0.0.1:4000")
	for i := range 10 {
		m.record(t0.Add(time.Duration(i)*20*time.Millisecond), uint16(i), src)
	}
	m.record(t0.Add(500*time.Millisecond), 10, src) // 320 ms after the last
	g := m.gap(t0, t0.Add(600*time.Millisecond))
	if g.Longest != 320*time.Millisecond || g.Packets != 11 || !g.At.Equal(t0.Add(180*time.Millisecond)) {
		t.Fatalf("gap %+v", g)
	}
	g = m.gap(t0, t0.Add(2*time.Second))
	if g.Longest != 1500*time.Millisecond {
		t.Fatalf("gap to the end %+v", g)
	}
	if s := m.stats(); s.Longest != 320*time.Millisecond || s.SequenceGaps != 0 || s.Received != 11 {
		t.Fatalf("stats %+v", s)
	}
}

// TestCancelAndDecline: a call given up while it rings is cancelled on both
// phones; one the callee refuses is rejected at the caller.
func TestCancelAndDecline(t *testing.T) {
	a := newPhone(t, Config{User: "6001"})
	b := newPhone(t, Config{User: "6002"})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Call(ctx, "sip:6002@"+b.SIPAddr().String()) }()
	waitStatus(t, b, "ringing", state(StateRinging))
	cancel()
	if err := <-done; err == nil {
		t.Fatal("a cancelled call returned no error")
	}
	if s := waitStatus(t, b, "b cancelled", state(StateEnded)); s.Reason != ReasonCancelled {
		t.Fatalf("b: %+v", s)
	}
	if s := waitStatus(t, a, "a cancelled", state(StateEnded)); s.Reason != ReasonCancelled {
		t.Fatalf("a: %+v", s)
	}

	go func() { done <- a.Call(ctxFor(t, 5*time.Second), "sip:6002@"+b.SIPAddr().String()) }()
	waitStatus(t, b, "ringing again", state(StateRinging))
	if err := b.Hangup(ctxFor(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err == nil || a.Status().Reason != ReasonRejected+": 603 Decline" {
		t.Fatalf("declined call: %v, %+v", err, a.Status())
	}
	if s := b.Status(); s.Reason != ReasonDeclined {
		t.Fatalf("b: %+v", s)
	}
}
