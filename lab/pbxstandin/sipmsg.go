package pbxstandin

import (
	"bytes"
	"crypto/rand"
	"fmt"
	"net"
	"strconv"
	"strings"
)

// The SIP messages of the B2BUA (b2bua.go): parsed whole, body included,
// and written with the headers in the order Asterisk 22 writes them
// (docs/asterisk22.md, "Calls: a B2BUA, its dialogs and its AMI events").

// sipMsg is one parsed SIP message: a request (method, Request-URI) or a
// response (status, reason). Header names are lower case, compact forms
// expanded; values keep their order.
type sipMsg struct {
	method, ruri string
	status       int
	reason       string
	headers      []header
	body         string
}

// parseSIP parses one datagram; false for anything that is not SIP.
func parseSIP(b []byte) (*sipMsg, bool) {
	head, body, _ := bytes.Cut(b, []byte("\r\n\r\n"))
	start, hs, ok := parse(head)
	if !ok {
		return nil, false
	}
	m := &sipMsg{headers: hs, body: string(body)}
	if rest, ok := strings.CutPrefix(start, "SIP/2.0 "); ok {
		code, reason, _ := strings.Cut(rest, " ")
		n, err := strconv.Atoi(code)
		if err != nil || n < 100 || n > 699 {
			return nil, false
		}
		m.status, m.reason = n, reason
	} else {
		f := strings.Fields(start)
		if len(f) != 3 || f[2] != "SIP/2.0" {
			return nil, false
		}
		m.method, m.ruri = f[0], f[1]
	}
	if n, err := strconv.Atoi(m.get("content-length")); err == nil && n >= 0 && n <= len(m.body) {
		m.body = m.body[:n]
	}
	if m.get("call-id") == "" || m.get("via") == "" || m.get("from") == "" || m.get("to") == "" {
		return nil, false
	}
	if _, method := m.cseq(); method == "" {
		return nil, false
	}
	return m, true
}

func (m *sipMsg) isRequest() bool { return m.method != "" }

func (m *sipMsg) get(name string) string { return get(m.headers, name) }

func (m *sipMsg) all(name string) []string {
	var out []string
	for _, h := range m.headers {
		if h.name == name {
			out = append(out, h.value)
		}
	}
	return out
}

// cseq is the CSeq header's number and method.
func (m *sipMsg) cseq() (uint32, string) {
	f := strings.Fields(m.get("cseq"))
	if len(f) != 2 {
		return 0, ""
	}
	n, err := strconv.ParseUint(f[0], 10, 32)
	if err != nil {
		return 0, ""
	}
	return uint32(n), f[1]
}

// branch is the top Via's branch parameter.
func (m *sipMsg) branch() string { return viaParam(m.get("via"), "branch") }

func viaParam(via, name string) string {
	for _, p := range strings.Split(via, ";")[1:] {
		k, v, _ := strings.Cut(strings.TrimSpace(p), "=")
		if strings.EqualFold(k, name) {
			return v
		}
	}
	return ""
}

// tagOf is the tag parameter of a From or To value.
func tagOf(v string) string {
	_, params := splitNameAddr(v)
	for _, p := range strings.Split(params, ";") {
		if k, val, ok := strings.Cut(strings.TrimSpace(p), "="); ok && strings.EqualFold(k, "tag") {
			return val
		}
	}
	return ""
}

// splitNameAddr splits a From, To or Contact value into its address
// (with its angle brackets, as Asterisk reports local_uri and remote_uri)
// and the header parameters after it.
func splitNameAddr(v string) (addr, params string) {
	v = strings.TrimSpace(v)
	if i := strings.IndexByte(v, '<'); i >= 0 {
		if j := strings.IndexByte(v[i:], '>'); j > 0 {
			return v[i : i+j+1], strings.TrimPrefix(v[i+j+1:], ";")
		}
	}
	addr, params, _ = strings.Cut(v, ";")
	return "<" + addr + ">", params
}

// uriOf is the bare URI of a From, To or Contact value.
func uriOf(v string) string {
	addr, _ := splitNameAddr(v)
	return strings.TrimSuffix(strings.TrimPrefix(addr, "<"), ">")
}

// userOf is the user part of a SIP URI ("" without one).
func userOf(uri string) string {
	rest, ok := strings.CutPrefix(uri, "sip:")
	if !ok {
		return ""
	}
	user, _, ok := strings.Cut(rest, "@")
	if !ok {
		return ""
	}
	return user
}

// hostPortOf is where a SIP URI sends to: its host and port (5060 when
// it names none).
func hostPortOf(uri string) (*net.UDPAddr, error) {
	rest, ok := strings.CutPrefix(uri, "sip:")
	if !ok {
		return nil, fmt.Errorf("not a sip URI: %q", uri)
	}
	if _, after, ok := strings.Cut(rest, "@"); ok {
		rest = after
	}
	rest, _, _ = strings.Cut(rest, ";")
	rest, _, _ = strings.Cut(rest, "?")
	if _, _, err := net.SplitHostPort(rest); err != nil {
		rest = net.JoinHostPort(strings.Trim(rest, "[]"), "5060")
	}
	return net.ResolveUDPAddr("udp", rest)
}

// newUUID is a random (version 4) UUID, the form of Asterisk's Call-IDs,
// tags and branches.
func newUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// firstCSeq starts a dialog's CSeq as pjproject does: a random number
// below 32768.
func firstCSeq() uint32 {
	var b [2]byte
	_, _ = rand.Read(b[:])
	return uint32(b[0])<<8&0x7f00 | uint32(b[1])
}

// contentLength is the header as pjproject writes it: right-aligned in
// five columns with a body, "Content-Length:  0" without.
func contentLength(body string) string {
	if body == "" {
		return "Content-Length:  0\r\n"
	}
	return fmt.Sprintf("Content-Length: %5d\r\n", len(body))
}

// standInServer names the stand-in where Asterisk writes its version, so
// nobody mistakes a capture of the lab for Asterisk's.
const standInServer = "fan-pbxstandin (lab stand-in, not Asterisk)"

const allowMethods = "OPTIONS, REGISTER, SUBSCRIBE, NOTIFY, PUBLISH, INVITE, ACK, BYE, CANCEL, UPDATE, PRACK, MESSAGE, INFO, REFER"

// answerVia is a request's top Via as Asterisk answers it: rport filled
// with the source port and received with the source address, before the
// other parameters.
func answerVia(via string, from *net.UDPAddr) string {
	parts := strings.Split(via, ";")
	out := []string{parts[0]}
	rport := false
	var rest []string
	for _, p := range parts[1:] {
		k, _, _ := strings.Cut(strings.TrimSpace(p), "=")
		switch strings.ToLower(k) {
		case "rport":
			rport = true
		case "received":
		default:
			rest = append(rest, p)
		}
	}
	if rport {
		out = append(out, "rport="+strconv.Itoa(from.Port))
	}
	out = append(out, "received="+from.IP.String())
	return strings.Join(append(out, rest...), ";")
}

// response answers req: its Vias, Call-ID, From, To (with toTag added when
// it has none and toTag is set), CSeq, Server, the extra headers, then the
// body.
func (p *PBX) response(req *sipMsg, from *net.UDPAddr, status int, reason, toTag string, extra []header, body string) []byte {
	var b strings.Builder
	fmt.Fprintf(&b, "SIP/2.0 %d %s\r\n", status, reason)
	for i, v := range req.all("via") {
		if i == 0 {
			v = answerVia(v, from)
		}
		fmt.Fprintf(&b, "Via: %s\r\n", v)
	}
	to := req.get("to")
	if toTag != "" && tagOf(to) == "" {
		to += ";tag=" + toTag
	}
	fmt.Fprintf(&b, "Call-ID: %s\r\nFrom: %s\r\nTo: %s\r\nCSeq: %s\r\nServer: %s\r\n%s: %s\r\n",
		req.get("call-id"), req.get("from"), to, req.get("cseq"), standInServer, NodeHeader, p.cfg.Node)
	for _, h := range extra {
		fmt.Fprintf(&b, "%s: %s\r\n", h.name, h.value)
	}
	if body != "" {
		b.WriteString("Content-Type: application/sdp\r\n")
	}
	b.WriteString(contentLength(body))
	b.WriteString("\r\n")
	b.WriteString(body)
	return []byte(b.String())
}
