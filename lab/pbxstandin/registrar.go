package pbxstandin

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fanpbx/fan/lab/amipeer"
)

// The stand-in as a registrar (Config.Registrar): a REGISTER is handed to
// the AMI peer's registrar, which stores the contact in its AstDB as
// Asterisk 22 does and raises the same ContactStatus events, and is
// answered as Asterisk answers it; an Originate PJSIP/<aor> on the AMI
// side sends an INVITE from the SIP socket to each of the AOR's contacts,
// as Asterisk dials a contact it finds in its database (whoever put it
// there: a REGISTER, or fan's replicator on a standby).

// dialing holds the INVITEs waiting for their answer, by Call-ID.
type dialing struct {
	mu      sync.Mutex
	waiting map[string]chan sipAnswer
}

type sipAnswer struct {
	status int
	msg    string
	from   *net.UDPAddr
}

// handleRegister answers a REGISTER through the registrar; false when the
// stand-in is no registrar or the request is not one to handle.
func (p *PBX) handleRegister(c *net.UDPConn, req []byte, from *net.UDPAddr) bool {
	if p.cfg.Registrar == nil {
		return false
	}
	start, hs, ok := parse(req)
	if !ok || !strings.HasPrefix(start, "REGISTER ") {
		return false
	}
	callID, cseq, to, via := get(hs, "call-id"), get(hs, "cseq"), get(hs, "to"), get(hs, "via")
	if callID == "" || cseq == "" || via == "" || to == "" {
		return true
	}
	aor := uriUser(to)
	contact := get(hs, "contact")
	uri := strings.TrimSpace(contact)
	param := ""
	if i := strings.IndexByte(uri, '<'); i >= 0 {
		if j := strings.IndexByte(uri[i:], '>'); j > 0 {
			param = uri[i+j+1:]
			uri = uri[i+1 : i+j]
		}
	}
	expires := -1
	if v, err := strconv.Atoi(strings.TrimSpace(get(hs, "expires"))); err == nil {
		expires = v
	}
	if _, v, ok := strings.Cut(param, "expires="); ok {
		if n, err := strconv.Atoi(strings.TrimSpace(strings.SplitN(v, ";", 2)[0])); err == nil {
			expires = n
		}
	}
	viaHost, viaPort := sentBy(via)
	status := "200 OK"
	var contacts []amipeer.Contact
	granted := 0
	switch {
	case aor == "" || uri == "":
		status = "400 Bad Request"
	default:
		var err error
		contacts, granted, err = p.ami.Register(amipeer.Registration{AOR: aor, URI: uri, CallID: callID, ViaAddr: viaHost,
			ViaPort: viaPort, UserAgent: get(hs, "user-agent"), Expires: expires})
		if errors.Is(err, amipeer.ErrTooManyContacts) {
			status = "403 Forbidden"
		} else if err != nil {
			status = "500 Server Internal Error"
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "SIP/2.0 %s\r\n", status)
	first := true
	for _, h := range hs {
		if h.name != "via" {
			continue
		}
		v := h.value
		if first {
			// rport and received, as Asterisk fills them in.
			v = strings.Replace(v, ";rport", ";rport="+strconv.Itoa(from.Port)+";received="+from.IP.String(), 1)
			first = false
		}
		fmt.Fprintf(&b, "Via: %s\r\n", v)
	}
	if !strings.Contains(strings.ToLower(to), ";tag=") {
		to += ";tag=" + randHex(4)
	}
	fmt.Fprintf(&b, "Call-ID: %s\r\nFrom: %s\r\nTo: %s\r\nCSeq: %s\r\n", callID, get(hs, "from"), to, cseq)
	now := time.Now()
	fmt.Fprintf(&b, "Date: %s\r\n", now.UTC().Format("Mon, 02 Jan 2006 15:04:05 GMT"))
	if status == "200 OK" {
		for _, ct := range contacts {
			fmt.Fprintf(&b, "Contact: <%s>;expires=%d\r\n", ct.URI, max(int(ct.Expiration.Sub(now).Seconds()), 0))
		}
		fmt.Fprintf(&b, "Expires: %d\r\n", granted)
	}
	fmt.Fprintf(&b, "%s: %s\r\nServer: fan-pbxstandin (lab stand-in, not Asterisk)\r\nContent-Length: 0\r\n\r\n", NodeHeader, p.cfg.Node)
	if _, err := c.WriteToUDP([]byte(b.String()), from); err != nil {
		p.log.Warn("sip reply", "to", from.String(), "err", err)
	}
	return true
}

// uriUser is the user part of the first SIP URI in a header value.
func uriUser(v string) string {
	i := strings.Index(v, "sip:")
	if i < 0 {
		return ""
	}
	rest := v[i+4:]
	at := strings.IndexByte(rest, '@')
	if at <= 0 {
		return ""
	}
	return rest[:at]
}

// sentBy is a Via's host and port.
func sentBy(via string) (string, int) {
	f := strings.Fields(via)
	if len(f) < 2 {
		return "", 0
	}
	hp := strings.SplitN(f[1], ";", 2)[0]
	host, port, err := net.SplitHostPort(hp)
	if err != nil {
		return hp, 5060
	}
	n, _ := strconv.Atoi(port)
	return host, n
}

// handleResponse hands a response to the INVITE waiting for it.
func (p *PBX) handleResponse(msg []byte, from *net.UDPAddr) bool {
	start, hs, ok := parse(msg)
	if !ok || !strings.HasPrefix(start, "SIP/2.0 ") {
		return false
	}
	code, _ := strconv.Atoi(strings.Fields(start)[1])
	p.dial.mu.Lock()
	ch := p.dial.waiting[get(hs, "call-id")]
	p.dial.mu.Unlock()
	if ch != nil {
		select {
		case ch <- sipAnswer{status: code, msg: string(msg), from: from}:
		default:
		}
	}
	return true
}

// Dial sends an INVITE to each contact and waits for each to answer
// (any response counts: the phone was reached), then ends the call: ACK
// to a final answer, and a BYE after a 2xx. It is the AMI peer's Dialer.
func (p *PBX) Dial(ctx context.Context, contacts []amipeer.Contact) error {
	var errs []error
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, ct := range contacts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := p.invite(ctx, ct); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

func (p *PBX) invite(ctx context.Context, ct amipeer.Contact) error {
	p.mu.Lock()
	var c *net.UDPConn
	if len(p.conns) > 0 {
		c = p.conns[0]
	}
	p.mu.Unlock()
	if c == nil {
		return errors.New("pbxstandin: no SIP socket to dial from")
	}
	hostport := strings.TrimPrefix(ct.URI, "sip:")
	if at := strings.IndexByte(hostport, '@'); at >= 0 {
		hostport = hostport[at+1:]
	}
	hostport = strings.SplitN(hostport, ";", 2)[0]
	to, err := net.ResolveUDPAddr("udp", hostport)
	if err != nil {
		return fmt.Errorf("pbxstandin: contact %s: %w", ct.URI, err)
	}
	local := c.LocalAddr().String()
	callID := randHex(8) + "@fan-pbxstandin"
	tag, branch := randHex(4), "z9hG4bK"+randHex(8)
	sdp := "v=0\r\no=- 1 1 IN IP4 127.0.0.1\r\ns=Asterisk\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\nm=audio 4000 RTP/AVP 0\r\na=rtpmap:0 PCMU/8000\r\n"
	head := fmt.Sprintf("Via: SIP/2.0/UDP %s;rport;branch=%s\r\nFrom: \"Anonymous\" <sip:anonymous@anonymous.invalid>;tag=%s\r\n"+
		"To: <sip:%s@%s>\r\nContact: <sip:asterisk@%s>\r\nCall-ID: %s\r\n", local, branch, tag, ct.AOR, to.IP, local, callID)
	req := fmt.Sprintf("INVITE %s SIP/2.0\r\n%sCSeq: 1 INVITE\r\nMax-Forwards: 70\r\nContent-Type: application/sdp\r\nContent-Length: %d\r\n\r\n%s",
		ct.URI, head, len(sdp), sdp)
	ch := make(chan sipAnswer, 8)
	p.dial.mu.Lock()
	if p.dial.waiting == nil {
		p.dial.waiting = map[string]chan sipAnswer{}
	}
	p.dial.waiting[callID] = ch
	p.dial.mu.Unlock()
	defer func() {
		p.dial.mu.Lock()
		delete(p.dial.waiting, callID)
		p.dial.mu.Unlock()
	}()
	// RFC 3261 timer A: resend from 500 ms, doubling, until an answer.
	resend := 500 * time.Millisecond
	timer := time.NewTimer(0)
	defer timer.Stop()
	answered := false
	for {
		select {
		case <-ctx.Done():
			if answered {
				return nil
			}
			return fmt.Errorf("pbxstandin: INVITE %s: %w", ct.URI, ErrNoAnswer)
		case <-timer.C:
			if answered {
				continue
			}
			if _, err := c.WriteToUDP([]byte(req), to); err != nil {
				return fmt.Errorf("pbxstandin: INVITE %s: %w", ct.URI, err)
			}
			timer.Reset(resend)
			resend *= 2
		case a := <-ch:
			answered = true
			if a.status < 200 {
				continue
			}
			_, hs, _ := parse([]byte(a.msg))
			toHdr := get(hs, "to")
			if a.status >= 300 {
				ack := fmt.Sprintf("ACK %s SIP/2.0\r\nVia: SIP/2.0/UDP %s;rport;branch=%s\r\nFrom: \"Anonymous\" <sip:anonymous@anonymous.invalid>;tag=%s\r\nTo: %s\r\nCall-ID: %s\r\nCSeq: 1 ACK\r\nMax-Forwards: 70\r\nContent-Length: 0\r\n\r\n",
					ct.URI, local, branch, tag, toHdr, callID)
				_, _ = c.WriteToUDP([]byte(ack), to)
				return nil
			}
			for i, m := range []string{"ACK", "BYE"} {
				msg := fmt.Sprintf("%s %s SIP/2.0\r\nVia: SIP/2.0/UDP %s;rport;branch=z9hG4bK%s\r\nFrom: \"Anonymous\" <sip:anonymous@anonymous.invalid>;tag=%s\r\nTo: %s\r\nCall-ID: %s\r\nCSeq: %d %s\r\nMax-Forwards: 70\r\nContent-Length: 0\r\n\r\n",
					m, ct.URI, local, randHex(8), tag, toHdr, callID, 1+i, m)
				_, _ = c.WriteToUDP([]byte(msg), to)
			}
			return nil
		}
	}
}
