package pbxstandin

import (
	"bufio"
	"fmt"
	"net"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fanpbx/fan/lab/amipeer"
	"github.com/fanpbx/fan/pkg/platform/waittest"
)

// The B2BUA against phones of the test's own (ua): each step of a call
// as docs/asterisk22.md records Asterisk 22 taking it.

// ua is a phone: a SIP socket read in the background, an RTP socket.
type ua struct {
	t    *testing.T
	user string
	sip  *net.UDPConn
	rtp  *net.UDPConn
	got  chan received
	rtpc chan received
	tag  string
	cseq uint32
}

type received struct {
	m    *sipMsg
	from *net.UDPAddr
	at   time.Time
}

func newUA(t *testing.T, user string) *ua { return newUAAt(t, user, "127.0.0.1", 0) }

// newUAAt is a phone on ip, its SIP on port (0: any).
func newUAAt(t *testing.T, user, ip string, port int) *ua {
	t.Helper()
	u := &ua{t: t, user: user, got: make(chan received, 256), rtpc: make(chan received, 4096), tag: "t" + user, cseq: 100}
	var err error
	if u.sip, err = net.ListenUDP("udp", &net.UDPAddr{IP: net.ParseIP(ip), Port: port}); err != nil {
		t.Fatal(err)
	}
	if u.rtp, err = net.ListenUDP("udp", &net.UDPAddr{IP: net.ParseIP(ip)}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { u.sip.Close(); u.rtp.Close() })
	for _, c := range []struct {
		conn *net.UDPConn
		ch   chan received
		sip  bool
	}{{u.sip, u.got, true}, {u.rtp, u.rtpc, false}} {
		go func() {
			buf := make([]byte, 65535)
			for {
				n, from, err := c.conn.ReadFromUDP(buf)
				if err != nil {
					return
				}
				r := received{from: from, at: time.Now()}
				if c.sip {
					m, ok := parseSIP(buf[:n])
					if !ok {
						continue
					}
					r.m = m
				}
				select {
				case c.ch <- r:
				default:
				}
			}
		}()
	}
	return u
}

func (u *ua) addr() *net.UDPAddr { return u.sip.LocalAddr().(*net.UDPAddr) }
func (u *ua) contact() string    { return fmt.Sprintf("sip:%s@%s", u.user, u.addr()) }
func (u *ua) media() string      { return u.rtp.LocalAddr().String() }

func (u *ua) send(to string, msg string) {
	u.t.Helper()
	a, err := net.ResolveUDPAddr("udp", to)
	if err != nil {
		u.t.Fatal(err)
	}
	if _, err := u.sip.WriteToUDP([]byte(msg), a); err != nil {
		u.t.Fatal(err)
	}
}

// expect waits for a message match accepts, dropping others.
func (u *ua) expect(what string, match func(*sipMsg) bool) received {
	u.t.Helper()
	deadline := time.After(5 * time.Second)
	var other []string
	for {
		select {
		case r := <-u.got:
			if match(r.m) {
				return r
			}
			_, cm := r.m.cseq()
			other = append(other, fmt.Sprintf("%s%d %s (%s)", r.m.method, r.m.status, r.m.reason, cm))
		case <-deadline:
			u.t.Fatalf("%s never got %s (got %v)", u.user, what, other)
		}
	}
}

// quiet says nothing matching arrived for d.
func (u *ua) quiet(d time.Duration, match func(*sipMsg) bool) bool {
	deadline := time.After(d)
	for {
		select {
		case r := <-u.got:
			if match(r.m) {
				return false
			}
		case <-deadline:
			return true
		}
	}
}

func isRequest(method string) func(*sipMsg) bool {
	return func(m *sipMsg) bool { return m.method == method }
}

func isAnswer(status int, method string) func(*sipMsg) bool {
	return func(m *sipMsg) bool { _, cm := m.cseq(); return m.status == status && cm == method }
}

func (u *ua) sdp(version int) string {
	a := u.rtp.LocalAddr().(*net.UDPAddr)
	return fmt.Sprintf("v=0\r\no=%s 1000 %d IN IP4 %s\r\ns=ua\r\nc=IN IP4 %s\r\nt=0 0\r\nm=audio %d RTP/AVP 0 101\r\na=rtpmap:0 PCMU/8000\r\na=rtpmap:101 telephone-event/8000\r\na=sendrecv\r\n",
		u.user, version, a.IP, a.IP, a.Port)
}

func (u *ua) register(server string) {
	u.t.Helper()
	u.send(server, fmt.Sprintf("REGISTER sip:%s SIP/2.0\r\nVia: SIP/2.0/UDP %s;branch=z9hG4bKreg%s;rport\r\nFrom: <sip:%s@%s>;tag=r%s\r\nTo: <sip:%s@%s>\r\n"+
		"Call-ID: reg-%s\r\nCSeq: 1 REGISTER\r\nContact: <%s>\r\nExpires: 600\r\nContent-Length: 0\r\n\r\n",
		server, u.addr(), u.user, u.user, server, u.user, u.user, server, u.user, u.contact()))
	u.expect("the REGISTER's 200", isAnswer(200, "REGISTER"))
}

// dialog is a phone's side of one dialog.
type dialog struct {
	callID, local, remote string // From and To of the phone's requests
	target                string
	cseq                  uint32
}

func (u *ua) invite(server, to, callID string) (branch string) {
	branch = "z9hG4bKinv" + callID
	body := u.sdp(1)
	u.send(server, fmt.Sprintf("INVITE sip:%s@%s SIP/2.0\r\nVia: SIP/2.0/UDP %s;branch=%s;rport\r\nMax-Forwards: 70\r\nFrom: <sip:%s@%s>;tag=%s\r\n"+
		"To: <sip:%s@%s>\r\nCall-ID: %s\r\nCSeq: 1 INVITE\r\nContact: <%s>\r\nContent-Type: application/sdp\r\nContent-Length: %d\r\n\r\n%s",
		to, server, u.addr(), branch, u.user, server, u.tag, to, server, callID, u.contact(), len(body), body))
	return branch
}

// request sends an in-dialog request; cseq 0 is the next one. A target
// refresh names the phone's Contact, as it must.
func (u *ua) request(to string, d *dialog, method string, cseq uint32, body string) {
	u.t.Helper()
	extra := ""
	switch method {
	case "INVITE", "UPDATE", "REFER", "NOTIFY", "SUBSCRIBE":
		extra = "Contact: <" + u.contact() + ">\r\n"
	}
	u.requestCSeq(to, d, method, cseq, extra, body)
}

// requestWith sends the next in-dialog request with extra header lines.
func (u *ua) requestWith(to string, d *dialog, method, extra, body string) {
	u.t.Helper()
	u.requestCSeq(to, d, method, 0, extra, body)
}

func (u *ua) requestCSeq(to string, d *dialog, method string, cseq uint32, extra, body string) {
	u.t.Helper()
	if cseq == 0 {
		d.cseq++
		cseq = d.cseq
	}
	if body != "" {
		extra += "Content-Type: application/sdp\r\n"
	}
	u.send(to, fmt.Sprintf("%s %s SIP/2.0\r\nVia: SIP/2.0/UDP %s;branch=z9hG4bK%s%d;rport\r\nMax-Forwards: 70\r\nFrom: %s\r\nTo: %s\r\nCall-ID: %s\r\nCSeq: %d %s\r\n%sContent-Length: %d\r\n\r\n%s",
		method, d.target, u.addr(), method, cseq, d.local, d.remote, d.callID, cseq, method, extra, len(body), body))
}

// answer answers a request with status, tag the To tag to add.
func (u *ua) answer(r received, status int, reason, tag, body string) {
	u.t.Helper()
	to := r.m.get("to")
	if tag != "" && tagOf(to) == "" {
		to += ";tag=" + tag
	}
	var b strings.Builder
	fmt.Fprintf(&b, "SIP/2.0 %d %s\r\n", status, reason)
	for _, v := range r.m.all("via") {
		fmt.Fprintf(&b, "Via: %s\r\n", v)
	}
	fmt.Fprintf(&b, "From: %s\r\nTo: %s\r\nCall-ID: %s\r\nCSeq: %s\r\nContact: <%s>\r\n", r.m.get("from"), to, r.m.get("call-id"), r.m.get("cseq"), u.contact())
	if body != "" {
		b.WriteString("Content-Type: application/sdp\r\n")
	}
	fmt.Fprintf(&b, "Content-Length: %d\r\n\r\n%s", len(body), body)
	u.send(r.from.String(), b.String())
}

// amiEvents follows the stand-in's AMI events.
type amiEvents struct {
	mu  sync.Mutex
	evs []map[string]string
	c   net.Conn
}

func followAMI(t *testing.T, addr string) *amiEvents { return followAMIIn(t, here, addr, "fan", "s") }

// here runs fn where the test runs; a namespace's Do runs it there.
func here(fn func()) { fn() }

func followAMIIn(t *testing.T, in func(func()), addr, user, secret string) *amiEvents {
	t.Helper()
	var c net.Conn
	var err error
	in(func() { c, err = net.DialTimeout("tcp", addr, 2*time.Second) })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	fmt.Fprintf(c, "Action: Login\r\nUsername: %s\r\nSecret: %s\r\nEvents: call\r\n\r\n", user, secret)
	a := &amiEvents{c: c}
	ready := make(chan struct{})
	var once sync.Once
	go func() {
		br := bufio.NewReader(c)
		cur := map[string]string{}
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				return
			}
			line = strings.TrimRight(line, "\r\n")
			if line == "" {
				if cur["Response"] == "Success" {
					once.Do(func() { close(ready) })
				}
				if cur["Event"] != "" {
					a.mu.Lock()
					a.evs = append(a.evs, cur)
					a.mu.Unlock()
				}
				cur = map[string]string{}
				continue
			}
			if k, v, ok := strings.Cut(line, ": "); ok {
				if _, seen := cur[k]; !seen {
					cur[k] = v
				}
			}
		}
	}()
	select {
	case <-ready:
	case <-time.After(3 * time.Second):
		t.Fatal("AMI login")
	}
	return a
}

// names are the events so far, with the channel or the dial status.
func (a *amiEvents) names() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []string
	for _, e := range a.evs {
		if e["Event"] == "DeviceStateChange" || e["Event"] == "FullyBooted" {
			continue
		}
		s := e["Event"]
		if ch := e["Channel"]; ch != "" {
			s += " " + ch
		}
		if st := e["DialStatus"]; st != "" {
			s += " " + st
		}
		out = append(out, s)
	}
	return out
}

func (a *amiEvents) waitEvent(t *testing.T, event string) {
	t.Helper()
	defer func() {
		if t.Failed() {
			t.Logf("AMI events seen: %v", a.names())
		}
	}()
	waittest.Until(t, 5*time.Second, "AMI event "+event, func() bool {
		return slices.ContainsFunc(a.names(), func(n string) bool { return strings.HasPrefix(n, event) })
	})
}

// getvar asks the stand-in's AMI one value.
func getvar(t *testing.T, addr, channel, variable string) string {
	return getvarIn(t, here, addr, "fan", "s", channel, variable)
}

func getvarIn(t *testing.T, in func(func()), addr, user, secret, channel, variable string) string {
	t.Helper()
	var c net.Conn
	var err error
	in(func() { c, err = net.DialTimeout("tcp", addr, 2*time.Second) })
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprintf(c, "Action: Login\r\nUsername: %s\r\nSecret: %s\r\nEvents: off\r\n\r\nAction: Getvar\r\nActionID: g\r\nChannel: %s\r\nVariable: %s\r\n\r\n", user, secret, channel, variable)
	br := bufio.NewReader(c)
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("getvar %s: %v", variable, err)
		}
		if v, ok := strings.CutPrefix(strings.TrimRight(line, "\r\n"), "Value: "); ok {
			return v
		}
		if strings.HasPrefix(line, "Message: No such channel") {
			return "no such channel"
		}
	}
}

func startB2BUA(t *testing.T, cfg Config) (*PBX, string) {
	t.Helper()
	if cfg.Node == "" {
		cfg.Node = "n1"
	}
	if cfg.SIP == nil {
		cfg.SIP = []string{"127.0.0.1:0"}
	}
	cfg.AMI.Addr, cfg.AMI.Username, cfg.AMI.Secret, cfg.AMI.SystemName = "127.0.0.1:0", "fan", "s", "pbx"
	cfg.Registrar = &amipeer.RegistrarConfig{SendContactStatusOnUpdate: true, RemoveExisting: true}
	p, err := Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p, p.SIPAddrs()[0]
}

// answered is a call set up between a (caller) and b (callee): the
// phones' dialogs and what each got.
type answered struct {
	a, b         *dialog
	calleeInvite received
	callerOK     received
	callerServer string
	calleeServer string
}

// setUp makes a call a to b through server and answers it.
func setUp(t *testing.T, server string, a, b *ua) answered {
	t.Helper()
	callID := "call-" + a.user + "-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	a.invite(server, b.user, callID)
	a.expect("100 Trying", isAnswer(100, "INVITE"))
	inv := b.expect("the INVITE", isRequest("INVITE"))
	b.answer(inv, 180, "Ringing", b.tag, "")
	ring := a.expect("180 Ringing", isAnswer(180, "INVITE"))
	if tagOf(ring.m.get("to")) == "" {
		t.Errorf("180 without the stand-in's tag: %v", ring.m.headers)
	}
	b.answer(inv, 200, "OK", b.tag, b.sdp(1))
	b.expect("the ACK of its 200", isRequest("ACK"))
	ok := a.expect("200 OK", isAnswer(200, "INVITE"))
	da := &dialog{callID: callID, local: inv.m.get("from"), remote: ok.m.get("to"), target: uriOf(ok.m.get("contact")), cseq: 1}
	da.local = fmt.Sprintf("<sip:%s@%s>;tag=%s", a.user, server, a.tag)
	a.send(ok.from.String(), fmt.Sprintf("ACK %s SIP/2.0\r\nVia: SIP/2.0/UDP %s;branch=z9hG4bKack%s;rport\r\nFrom: %s\r\nTo: %s\r\nCall-ID: %s\r\nCSeq: 1 ACK\r\nContent-Length: 0\r\n\r\n",
		da.target, a.addr(), callID, da.local, da.remote, callID))
	db := &dialog{callID: inv.m.get("call-id"), local: inv.m.get("to") + ";tag=" + b.tag, remote: inv.m.get("from"), target: uriOf(inv.m.get("contact"))}
	return answered{a: da, b: db, calleeInvite: inv, callerOK: ok, callerServer: ok.from.String(), calleeServer: inv.from.String()}
}

func TestCallWithDirectMedia(t *testing.T) {
	p, server := startB2BUA(t, Config{})
	ami := followAMI(t, p.AMIAddr())
	a, b := newUA(t, "6001"), newUA(t, "6002")
	a.register(server)
	b.register(server)

	c := setUp(t, server, a, b)
	inv := c.calleeInvite.m
	// The callee's dialog is the stand-in's own, named as Asterisk names it.
	if inv.ruri != b.contact() || inv.get("call-id") == c.a.callID || !regexp.MustCompile(`^[0-9a-f-]{36}$`).MatchString(inv.get("call-id")) {
		t.Errorf("INVITE %s, Call-ID %s", inv.ruri, inv.get("call-id"))
	}
	if got, want := inv.get("from"), "<sip:6001@127.0.0.1>;tag="; !strings.HasPrefix(got, want) {
		t.Errorf("From %q, want %s...", got, want)
	}
	if got, want := inv.get("to"), "<sip:6002@127.0.0.1>"; got != want {
		t.Errorf("To %q, want %q", got, want)
	}
	if got, want := inv.get("contact"), "<sip:asterisk@"+server+">"; got != want {
		t.Errorf("Contact %q, want %q", got, want)
	}
	if n, _ := inv.cseq(); n >= 32768 {
		t.Errorf("first CSeq %d: pjproject starts below 32768", n)
	}
	if got, want := c.callerOK.m.get("contact"), "<sip:"+server+">"; got != want {
		t.Errorf("200 OK Contact %q, want %q", got, want)
	}

	// Both phones are re-INVITEd to the other's media.
	ra := a.expect("the direct-media re-INVITE", isRequest("INVITE"))
	rb := b.expect("the direct-media re-INVITE", isRequest("INVITE"))
	if s, _ := parseSDP(ra.m.body); s.addr().String() != b.media() {
		t.Errorf("caller sent to %v, want %s", s.addr(), b.media())
	}
	if s, _ := parseSDP(rb.m.body); s.addr().String() != a.media() {
		t.Errorf("callee sent to %v, want %s", s.addr(), a.media())
	}
	if ra.m.get("from") != c.a.remote || ra.m.get("to") != c.a.local {
		t.Errorf("caller's re-INVITE From %q To %q, want the dialog's %q %q", ra.m.get("from"), ra.m.get("to"), c.a.remote, c.a.local)
	}
	if n, _ := rb.m.cseq(); n != mustCSeq(inv)+1 {
		t.Errorf("callee's re-INVITE CSeq %d, want %d", n, mustCSeq(inv)+1)
	}
	a.answer(ra, 200, "OK", "", a.sdp(2))
	b.answer(rb, 200, "OK", "", b.sdp(2))
	a.expect("the re-INVITE's ACK", isRequest("ACK"))
	b.expect("the re-INVITE's ACK", isRequest("ACK"))

	ami.waitEvent(t, "BridgeEnter PJSIP/6001")
	want := []string{"Newchannel PJSIP/6001-00000000", "Newchannel PJSIP/6002-00000001", "NewCallerid PJSIP/6002-00000001",
		"NewConnectedLine PJSIP/6002-00000001", "DialBegin PJSIP/6001-00000000", "Newstate PJSIP/6002-00000001",
		"NewConnectedLine PJSIP/6001-00000000", "DialState PJSIP/6001-00000000 RINGING", "Newstate PJSIP/6002-00000001",
		"DialEnd PJSIP/6001-00000000 ANSWER", "Newstate PJSIP/6001-00000000", "BridgeCreate",
		"BridgeEnter PJSIP/6002-00000001", "BridgeEnter PJSIP/6001-00000000"}
	if got := ami.names(); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("events:\n%s", strings.Join(got, "\n"))
	}
	// What the recorder reads.
	for _, tc := range []struct{ channel, variable, want string }{
		{"PJSIP/6001-00000000", "CHANNEL(pjsip,call-id)", c.a.callID},
		{"PJSIP/6001-00000000", "CHANNEL(pjsip,local_tag)", tagOf(c.a.remote)},
		{"PJSIP/6001-00000000", "CHANNEL(pjsip,remote_tag)", a.tag},
		{"PJSIP/6001-00000000", "CHANNEL(pjsip,local_uri)", "<sip:6002@" + server + ">"},
		{"PJSIP/6001-00000000", "CHANNEL(pjsip,remote_uri)", "<sip:6001@" + server + ">"},
		{"PJSIP/6001-00000000", "CHANNEL(pjsip,target_uri)", a.contact()},
		{"PJSIP/6001-00000000", "CHANNEL(pjsip,remote_addr)", a.addr().String()},
		{"PJSIP/6001-00000000", "CHANNEL(rtp,direct)", b.media()},
		{"PJSIP/6002-00000001", "CHANNEL(pjsip,call-id)", inv.get("call-id")},
		{"PJSIP/6002-00000001", "CHANNEL(pjsip,local_tag)", tagOf(inv.get("from"))},
		{"PJSIP/6002-00000001", "CHANNEL(pjsip,remote_tag)", b.tag},
		{"PJSIP/6002-00000001", "CHANNEL(pjsip,local_uri)", "<sip:6001@127.0.0.1>"},
		{"PJSIP/6002-00000001", "CHANNEL(pjsip,remote_uri)", "<sip:6002@127.0.0.1>"},
		{"PJSIP/6002-00000001", "CHANNEL(pjsip,target_uri)", b.contact()},
		{"PJSIP/6002-00000001", "CHANNEL(pjsip,remote_addr)", ""},
		{"PJSIP/6002-00000001", "CHANNEL(rtp,direct)", a.media()},
	} {
		if got := getvar(t, p.AMIAddr(), tc.channel, tc.variable); got != tc.want {
			t.Errorf("%s %s = %q, want %q", tc.channel, tc.variable, got, tc.want)
		}
	}

	// The caller's in-dialog requests: a much higher CSeq is fine, a lower one is not.
	a.request(c.callerServer, c.a, "INFO", 100000, "")
	a.expect("INFO's 200", isAnswer(200, "INFO"))
	a.request(c.callerServer, c.a, "INFO", 50000, "")
	if r := a.expect("INFO's answer", func(m *sipMsg) bool { _, cm := m.cseq(); return cm == "INFO" && m.status >= 200 }); r.m.status != 500 || r.m.reason != "Invalid CSeq" {
		t.Errorf("lower CSeq answered %d %s", r.m.status, r.m.reason)
	}
	c.a.cseq = 100000

	// The caller hangs up: 200, then the callee's audio comes back to the
	// stand-in before its BYE.
	a.request(c.callerServer, c.a, "BYE", 0, "")
	a.expect("BYE's 200", isAnswer(200, "BYE"))
	back := b.expect("the re-INVITE back", isRequest("INVITE"))
	if s, _ := parseSDP(back.m.body); s.ip != "127.0.0.1" || s.addr().String() == a.media() {
		t.Errorf("re-INVITE back to %v", s.addr())
	}
	b.answer(back, 200, "OK", "", b.sdp(3))
	b.expect("its ACK", isRequest("ACK"))
	bye := b.expect("the BYE", isRequest("BYE"))
	if n, _ := bye.m.cseq(); n != mustCSeq(inv)+3 || bye.m.get("call-id") != inv.get("call-id") || tagOf(bye.m.get("to")) != b.tag {
		t.Errorf("BYE %v", bye.m.headers)
	}
	b.answer(bye, 200, "OK", "", "")
	ami.waitEvent(t, "Hangup PJSIP/6001")
	got := ami.names()[len(want):]
	wantEnd := []string{"HangupRequest PJSIP/6001-00000000", "BridgeLeave PJSIP/6001-00000000", "BridgeLeave PJSIP/6002-00000001",
		"BridgeDestroy", "SoftHangupRequest PJSIP/6001-00000000", "Hangup PJSIP/6002-00000001", "Hangup PJSIP/6001-00000000"}
	if strings.Join(got, "\n") != strings.Join(wantEnd, "\n") {
		t.Errorf("hangup events:\n%s", strings.Join(got, "\n"))
	}

	// The caller's dialog lingers as pjproject's does: a BYE is answered
	// 200, an INFO 500, a re-INVITE not at all.
	a.request(c.callerServer, c.a, "BYE", 0, "")
	a.expect("the second BYE's 200", isAnswer(200, "BYE"))
	a.request(c.callerServer, c.a, "INFO", 0, "")
	if r := a.expect("INFO's answer", isAnswer(500, "INFO")); r.m.reason != "Unhandled by dialog usages" {
		t.Errorf("INFO after the call: %s", r.m.reason)
	}
	a.request(c.callerServer, c.a, "INVITE", 0, a.sdp(3))
	if !a.quiet(700*time.Millisecond, func(m *sipMsg) bool { _, cm := m.cseq(); return cm == "INVITE" }) {
		t.Error("a re-INVITE in a finished dialog was answered")
	}
}

func mustCSeq(m *sipMsg) uint32 { n, _ := m.cseq(); return n }

func TestCallAnchoredRelaysAudioUntilThePBXDies(t *testing.T) {
	p, server := startB2BUA(t, Config{NoDirectMedia: true})
	a, b := newUA(t, "6001"), newUA(t, "6002")
	a.register(server)
	b.register(server)
	c := setUp(t, server, a, b)
	if !a.quiet(300*time.Millisecond, isRequest("INVITE")) {
		t.Fatal("a re-INVITE without direct media")
	}
	if got := getvar(t, p.AMIAddr(), "PJSIP/6001-00000000", "CHANNEL(rtp,direct)"); got != "(null)" {
		t.Errorf("anchored rtp,direct = %q", got)
	}
	toA, _ := parseSDP(c.callerOK.m.body)
	toB, _ := parseSDP(c.calleeInvite.m.body)
	send := func(u *ua, to *net.UDPAddr, n int) {
		for i := range n {
			_, _ = u.rtp.WriteToUDP([]byte{0x80, 0, 0, byte(i)}, to)
		}
	}
	// A's audio reaches B from B's leg of the stand-in, and back.
	send(a, toA.addr(), 5)
	r := waitRTP(t, b, time.Second)
	if r.from.Port != toB.port {
		t.Errorf("B got audio from %s, want the port its SDP named (%d)", r.from, toB.port)
	}
	// The whole burst in before the crash: a packet of it still on its
	// way would otherwise pass for one a dead stand-in relayed.
	for range 4 {
		waitRTP(t, b, time.Second)
	}
	send(b, toB.addr(), 5)
	if r := waitRTP(t, a, time.Second); r.from.Port != toA.port {
		t.Errorf("A got audio from %s", r.from)
	}
	// kill -9: no more audio, no more SIP; back up, the dialog is unknown.
	if err := p.SetMode(Dead); err != nil {
		t.Fatal(err)
	}
	drain(b)
	send(a, toA.addr(), 5)
	if r, ok := tryRTP(b, 300*time.Millisecond); ok {
		t.Fatalf("audio relayed by a dead stand-in: %v", r.from)
	}
	if err := p.SetMode(Normal); err != nil {
		t.Fatal(err)
	}
	a.request(c.callerServer, c.a, "BYE", 0, "")
	a.expect("481", isAnswer(481, "BYE"))
	if got := getvar(t, p.AMIAddr(), "PJSIP/6001-00000000", "CHANNEL(pjsip,call-id)"); got != "no such channel" {
		t.Errorf("a channel outlived the crash: %q", got)
	}
}

func waitRTP(t *testing.T, u *ua, d time.Duration) received {
	t.Helper()
	r, ok := tryRTP(u, d)
	if !ok {
		t.Fatalf("%s got no audio", u.user)
	}
	return r
}

func tryRTP(u *ua, d time.Duration) (received, bool) {
	select {
	case r := <-u.rtpc:
		return r, true
	case <-time.After(d):
		return received{}, false
	}
}

func drain(u *ua) {
	for {
		select {
		case <-u.rtpc:
		default:
			return
		}
	}
}

func TestUnknownDialogsAre481(t *testing.T) {
	_, server := startB2BUA(t, Config{})
	a := newUA(t, "6001")
	d := &dialog{callID: "nosuch@x", local: "<sip:6001@" + server + ">;tag=a1", remote: "<sip:6002@" + server + ">;tag=b1", target: "sip:" + server, cseq: 10}
	for _, m := range []string{"BYE", "INVITE", "UPDATE", "INFO", "REFER", "OPTIONS", "NOTIFY"} {
		body := ""
		if m == "INVITE" {
			body = a.sdp(1)
		}
		a.request(server, d, m, 0, body)
		r := a.expect(m+"'s 481", isAnswer(481, m))
		if r.m.reason != "Call/Transaction Does Not Exist" || r.m.get("to") != d.remote || !strings.Contains(r.m.get("via"), "received=127.0.0.1") {
			t.Errorf("%s: %d %s To %q Via %q", m, r.m.status, r.m.reason, r.m.get("to"), r.m.get("via"))
		}
	}
	a.request(server, d, "ACK", 0, "")
	if !a.quiet(300*time.Millisecond, func(*sipMsg) bool { return true }) {
		t.Error("an ACK was answered")
	}
	// A target refresh without a Contact is refused before the dialog is
	// looked for.
	a.requestWith(server, d, "UPDATE", "", "")
	a.expect("400", isAnswer(400, "UPDATE"))
}

func TestCancelBeforeTheAnswer(t *testing.T) {
	p, server := startB2BUA(t, Config{})
	ami := followAMI(t, p.AMIAddr())
	a, b := newUA(t, "6001"), newUA(t, "6002")
	a.register(server)
	b.register(server)
	branch := a.invite(server, "6002", "cancelled")
	inv := b.expect("the INVITE", isRequest("INVITE"))
	b.answer(inv, 180, "Ringing", b.tag, "")
	ring := a.expect("180", isAnswer(180, "INVITE"))
	a.send(server, fmt.Sprintf("CANCEL sip:6002@%s SIP/2.0\r\nVia: SIP/2.0/UDP %s;branch=%s;rport\r\nFrom: <sip:6001@%s>;tag=%s\r\nTo: <sip:6002@%s>\r\nCall-ID: cancelled\r\nCSeq: 1 CANCEL\r\nContent-Length: 0\r\n\r\n",
		server, a.addr(), branch, server, a.tag, server))
	a.expect("CANCEL's 200", isAnswer(200, "CANCEL"))
	r := a.expect("487", isAnswer(487, "INVITE"))
	if r.m.get("reason") != "Q.850;cause=0" || tagOf(r.m.get("to")) != tagOf(ring.m.get("to")) {
		t.Errorf("487 %v", r.m.headers)
	}
	cancel := b.expect("the CANCEL", isRequest("CANCEL"))
	if cancel.m.branch() != inv.m.branch() || cancel.m.get("reason") != "Q.850;cause=127" || mustCSeq(cancel.m) != mustCSeq(inv.m) {
		t.Errorf("CANCEL %v", cancel.m.headers)
	}
	b.answer(cancel, 200, "OK", b.tag, "")
	b.answer(inv, 487, "Request Terminated", b.tag, "")
	ack := b.expect("the 487's ACK", isRequest("ACK"))
	if ack.m.branch() != inv.m.branch() {
		t.Errorf("ACK of a 487 on branch %s, want the INVITE's", ack.m.branch())
	}
	ami.waitEvent(t, "Hangup PJSIP/6002")
	if got := strings.Join(ami.names(), "\n"); !strings.Contains(got, "DialEnd PJSIP/6001-00000000 CANCEL") {
		t.Errorf("events:\n%s", got)
	}
}

func TestCallsThatFail(t *testing.T) {
	_, server := startB2BUA(t, Config{AMI: amipeer.Config{Endpoints: []amipeer.Endpoint{{Name: "6001"}, {Name: "6002"}, {Name: "6003"}}}})
	a, b := newUA(t, "6001"), newUA(t, "6002")
	a.register(server)
	b.register(server)

	a.invite(server, "6002", "busy")
	inv := b.expect("the INVITE", isRequest("INVITE"))
	b.answer(inv, 486, "Busy Here", b.tag, "")
	b.expect("the 486's ACK", isRequest("ACK"))
	if r := a.expect("486", isAnswer(486, "INVITE")); r.m.get("reason") != "Q.850;cause=17" || tagOf(r.m.get("to")) == "" {
		t.Errorf("busy: %v", r.m.headers)
	}

	a.invite(server, "6003", "unregistered")
	a.expect("100", isAnswer(100, "INVITE"))
	if r := a.expect("503", isAnswer(503, "INVITE")); r.m.get("reason") != "Q.850;cause=34" {
		t.Errorf("no contact: %v", r.m.headers)
	}

	a.invite(server, "7000", "nosuchexten")
	if r := a.expect("the answer", func(m *sipMsg) bool { return m.get("call-id") == "nosuchexten" }); r.m.status != 404 {
		t.Errorf("no extension: %d %s", r.m.status, r.m.reason)
	}
}

// freePair is a UDP port free on both 127.0.0.1 and 127.0.0.2: the node's
// own address and the floating one.
func freePair(t *testing.T) int {
	t.Helper()
	for range 20 {
		c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
		if err != nil {
			t.Fatal(err)
		}
		port := c.LocalAddr().(*net.UDPAddr).Port
		d, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 2), Port: port})
		c.Close()
		if err == nil {
			d.Close()
			return port
		}
	}
	t.Skip("no port free on 127.0.0.1 and 127.0.0.2")
	return 0
}

// TestTransportsAsDeployed is deploy/asterisk's pjsip.conf on loopback:
// the node's transport on 127.0.0.1, the floating one on 127.0.0.2, both
// with external addresses naming the floating one.
func TestTransportsAsDeployed(t *testing.T) {
	port := freePair(t)
	node, float := fmt.Sprintf("127.0.0.1:%d", port), fmt.Sprintf("127.0.0.2:%d", port)
	ts := []amipeer.Transport{
		{ID: "transport-node", Protocol: "udp", Bind: node, ExternalSignalingAddress: "127.0.0.2", ExternalMediaAddress: "127.0.0.2"},
		{ID: "transport-float", Protocol: "udp", Bind: float, ExternalSignalingAddress: "127.0.0.2", ExternalMediaAddress: "127.0.0.2"},
	}
	p, _ := startB2BUA(t, Config{SIP: []string{node, float}, AMI: amipeer.Config{Transports: ts}})
	a, b := newUA(t, "6001"), newUA(t, "6002")
	a.register(float)
	b.register(float)
	c := setUp(t, float, a, b)
	inv := c.calleeInvite
	if inv.from.String() != node {
		t.Errorf("INVITE sent from %s, want the node's own %s", inv.from, node)
	}
	if got := inv.m.get("contact"); got != "<sip:asterisk@"+float+">" || !strings.Contains(inv.m.get("via"), float) {
		t.Errorf("Contact %q Via %q, want the floating address", got, inv.m.get("via"))
	}
	if got := inv.m.get("from"); !strings.HasPrefix(got, "<sip:6001@127.0.0.1>") {
		t.Errorf("From %q: the node's own address", got)
	}
	if s, _ := parseSDP(inv.m.body); s.ip != "127.0.0.2" {
		t.Errorf("SDP to the callee names %s, want external_media_address", s.ip)
	}
	if c.callerOK.from.String() != float || c.callerOK.m.get("contact") != "<sip:"+float+">" {
		t.Errorf("200 OK from %s with Contact %q", c.callerOK.from, c.callerOK.m.get("contact"))
	}
	// external_media_address rewrites the direct-media SDP too: each phone
	// is told the floating address with the other's port (docs/asterisk22.md).
	ra := a.expect("the direct-media re-INVITE", isRequest("INVITE"))
	s, _ := parseSDP(ra.m.body)
	if want := b.rtp.LocalAddr().(*net.UDPAddr).Port; s.ip != "127.0.0.2" || s.port != want {
		t.Errorf("direct media SDP %s:%d, want 127.0.0.2:%d", s.ip, s.port, want)
	}
	if got := getvar(t, p.AMIAddr(), "PJSIP/6001-00000000", "CHANNEL(rtp,direct)"); got != b.media() {
		t.Errorf("rtp,direct %q: Asterisk names the phone's real address", got)
	}
	// The phone's BYE goes to the Contact: the floating address.
	a.answer(ra, 200, "OK", "", a.sdp(2))
	a.request(uriOf(c.callerOK.m.get("contact"))[len("sip:"):], c.a, "BYE", 0, "")
	if r := a.expect("BYE's 200", isAnswer(200, "BYE")); r.from.String() != float {
		t.Errorf("BYE answered from %s", r.from)
	}
}

func TestCalleeHangsUpAnchored(t *testing.T) {
	_, server := startB2BUA(t, Config{NoDirectMedia: true})
	a, b := newUA(t, "6001"), newUA(t, "6002")
	a.register(server)
	b.register(server)
	c := setUp(t, server, a, b)
	b.request(c.calleeServer, c.b, "BYE", 0, "")
	b.expect("BYE's 200", isAnswer(200, "BYE"))
	// No media to bring back: the BYE comes at once, in the caller's dialog.
	bye := a.expect("the BYE", func(m *sipMsg) bool { return m.method == "BYE" || m.method == "INVITE" })
	if bye.m.method != "BYE" || bye.m.get("call-id") != c.a.callID || bye.m.get("from") != c.a.remote || bye.m.get("to") != c.a.local {
		t.Fatalf("caller got %s %v", bye.m.method, bye.m.headers)
	}
	a.answer(bye, 200, "OK", "", "")
}

func TestFrozenStandInRelaysNothing(t *testing.T) {
	p, server := startB2BUA(t, Config{NoDirectMedia: true})
	a, b := newUA(t, "6001"), newUA(t, "6002")
	a.register(server)
	b.register(server)
	c := setUp(t, server, a, b)
	toA, _ := parseSDP(c.callerOK.m.body)
	if err := p.SetMode(Frozen); err != nil {
		t.Fatal(err)
	}
	_, _ = a.rtp.WriteToUDP([]byte{0x80, 0, 0, 1}, toA.addr())
	if r, ok := tryRTP(b, 300*time.Millisecond); ok {
		t.Fatalf("a frozen stand-in relayed audio from %s", r.from)
	}
	a.request(c.callerServer, c.a, "INFO", 0, "")
	if !a.quiet(300*time.Millisecond, func(*sipMsg) bool { return true }) {
		t.Fatal("a frozen stand-in answered")
	}
	// A deadlock that resolves: the call goes on.
	if err := p.SetMode(Normal); err != nil {
		t.Fatal(err)
	}
	_, _ = a.rtp.WriteToUDP([]byte{0x80, 0, 0, 2}, toA.addr())
	waitRTP(t, b, time.Second)
}

func TestRetransmissions(t *testing.T) {
	_, server := startB2BUA(t, Config{NoDirectMedia: true})
	a, b := newUA(t, "6001"), newUA(t, "6002")
	a.register(server)
	b.register(server)
	a.invite(server, "6002", "retrans")
	first := b.expect("the INVITE", isRequest("INVITE"))
	// Unanswered, the INVITE comes again after timer A (500 ms).
	again := b.expect("the INVITE again", isRequest("INVITE"))
	if again.m.branch() != first.m.branch() || again.at.Sub(first.at) < 400*time.Millisecond {
		t.Errorf("retransmission %s after %s", again.m.branch(), again.at.Sub(first.at))
	}
	b.answer(first, 200, "OK", b.tag, b.sdp(1))
	b.expect("ACK", isRequest("ACK"))
	// The caller's 200 OK comes again until acknowledged.
	ok := a.expect("200", isAnswer(200, "INVITE"))
	ok2 := a.expect("200 again", isAnswer(200, "INVITE"))
	if d := ok2.at.Sub(ok.at); d < 400*time.Millisecond {
		t.Errorf("200 OK again after %s", d)
	}
	// A retransmitted INVITE is answered as the first was.
	a.invite(server, "6002", "retrans")
	a.expect("the 200 once more", isAnswer(200, "INVITE"))
	// A retransmitted 200 from the callee is acknowledged again.
	b.answer(first, 200, "OK", b.tag, b.sdp(1))
	b.expect("ACK again", isRequest("ACK"))
}

// TestAMIHangupOfCarriedCall: an AMI Hangup of a direct-media call whose
// phones ended their dialogs (a keeper elsewhere told them, after a
// planned move) goes as it did on Asterisk 22: each phone re-INVITEd to
// send its audio back, answering 481; a BYE, and a second after the failed
// re-INVITE, each answered 481; both channels gone, with the hang-up's
// events.
func TestAMIHangupOfCarriedCall(t *testing.T) {
	p, server := startB2BUA(t, Config{})
	ami := followAMI(t, p.AMIAddr())
	a, b := newUA(t, "6001"), newUA(t, "6002")
	a.register(server)
	b.register(server)
	setUp(t, server, a, b)
	for _, u := range []*ua{a, b} {
		r := u.expect("the direct-media re-INVITE", isRequest("INVITE"))
		u.answer(r, 200, "OK", "", u.sdp(2))
		u.expect("its ACK", isRequest("ACK"))
	}
	ami.waitEvent(t, "BridgeEnter PJSIP/6001")
	before := len(ami.names())

	hangupAMI(t, p.AMIAddr(), "PJSIP/6001-00000000")
	for _, u := range []*ua{a, b} {
		back := u.expect("the re-INVITE back", isRequest("INVITE"))
		u.answer(back, 481, "Call/Transaction Does Not Exist", "", "")
		u.expect("the 481's ACK", isRequest("ACK"))
		for i := range 2 {
			bye := u.expect(fmt.Sprintf("BYE %d", i+1), isRequest("BYE"))
			if n, _ := bye.m.cseq(); n != mustCSeq(back.m)+uint32(i)+1 {
				t.Errorf("%s's BYE %d CSeq %d after the re-INVITE's %d", u.user, i+1, n, mustCSeq(back.m))
			}
			u.answer(bye, 481, "Call/Transaction Does Not Exist", "", "")
		}
		if !u.quiet(time.Second, isRequest("BYE")) {
			t.Errorf("%s: a BYE answered 481 was sent again", u.user)
		}
	}
	ami.waitEvent(t, "Hangup PJSIP/6002")
	want := []string{"BridgeLeave PJSIP/6001-00000000", "SoftHangupRequest PJSIP/6001-00000000", "BridgeLeave PJSIP/6002-00000001",
		"BridgeDestroy", "Hangup PJSIP/6001-00000000", "Hangup PJSIP/6002-00000001"}
	if got := ami.names()[before:]; strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("events:\n%s", strings.Join(got, "\n"))
	}
	if got := getvar(t, p.AMIAddr(), "PJSIP/6002-00000001", "CHANNEL(pjsip,call-id)"); got != "no such channel" {
		t.Errorf("the callee's channel after the hang-up: %q", got)
	}
}

// hangupAMI hangs channel up over the stand-in's AMI and checks the answer.
func hangupAMI(t *testing.T, addr, channel string) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprintf(c, "Action: Login\r\nUsername: fan\r\nSecret: s\r\nEvents: off\r\n\r\nAction: Hangup\r\nActionID: h\r\nChannel: %s\r\n\r\n", channel)
	br := bufio.NewReader(c)
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("hangup %s: %v", channel, err)
		}
		if m, ok := strings.CutPrefix(strings.TrimRight(line, "\r\n"), "Message: "); ok && m != "Authentication accepted" {
			if m != "Channel Hungup" {
				t.Fatalf("hangup %s: %s", channel, m)
			}
			return
		}
	}
}
