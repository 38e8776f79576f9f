package phone

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// A SIP message as the phone reads and writes it (RFC 3261 §7): a start
// line, headers in order, a body. Header names are kept in their long
// lower-case form, so a compact "v:" and a "Via:" are the same header.

type header struct{ name, value string }

type message struct {
	request bool
	method  string // request
	uri     string // request
	status  int    // response
	reason  string // response
	headers []header
	body    []byte
}

// compactNames are RFC 3261's compact header forms (§7.3.3) and the ones
// of the extensions a PBX sends.
var compactNames = map[string]string{
	"v": "via", "f": "from", "t": "to", "i": "call-id", "m": "contact", "l": "content-length",
	"c": "content-type", "k": "supported", "s": "subject", "e": "content-encoding", "o": "event",
	"r": "refer-to", "u": "allow-events", "x": "session-expires",
}

// displayNames spell the headers the phone writes as RFC 3261 does.
var displayNames = map[string]string{
	"via": "Via", "call-id": "Call-ID", "cseq": "CSeq", "www-authenticate": "WWW-Authenticate",
	"content-length": "Content-Length", "content-type": "Content-Type", "max-forwards": "Max-Forwards",
	"record-route": "Record-Route", "user-agent": "User-Agent",
}

func displayName(n string) string {
	if d, ok := displayNames[n]; ok {
		return d
	}
	parts := strings.Split(n, "-")
	for i, p := range parts {
		if p != "" {
			parts[i] = strings.ToUpper(p[:1]) + p[1:]
		}
	}
	return strings.Join(parts, "-")
}

// maxMessage bounds what the phone reads from one datagram.
const maxMessage = 65535

var errNotSIP = errors.New("not a SIP message")

// parseMessage reads one datagram. Folded header lines (a leading space or
// tab continues the previous one) are unfolded; the body is cut to
// Content-Length when it is given.
func parseMessage(b []byte) (*message, error) {
	head, body, found := bytes.Cut(b, []byte("\r\n\r\n"))
	if !found {
		head, body, found = bytes.Cut(b, []byte("\n\n"))
		if !found {
			return nil, fmt.Errorf("%w: no end of headers", errNotSIP)
		}
	}
	lines := strings.Split(strings.ReplaceAll(string(head), "\r\n", "\n"), "\n")
	m := &message{}
	start := lines[0]
	switch {
	case strings.HasPrefix(start, "SIP/2.0 "):
		rest := strings.TrimPrefix(start, "SIP/2.0 ")
		code, reason, _ := strings.Cut(rest, " ")
		n, err := strconv.Atoi(code)
		if err != nil || n < 100 || n > 699 {
			return nil, fmt.Errorf("%w: status line %q", errNotSIP, start)
		}
		m.status, m.reason = n, reason
	default:
		f := strings.Fields(start)
		if len(f) != 3 || f[2] != "SIP/2.0" {
			return nil, fmt.Errorf("%w: request line %q", errNotSIP, start)
		}
		m.request, m.method, m.uri = true, f[0], f[1]
	}
	for _, l := range lines[1:] {
		if l == "" {
			continue
		}
		if (l[0] == ' ' || l[0] == '\t') && len(m.headers) > 0 {
			m.headers[len(m.headers)-1].value += " " + strings.TrimSpace(l)
			continue
		}
		name, value, ok := strings.Cut(l, ":")
		if !ok {
			return nil, fmt.Errorf("%w: header line %q", errNotSIP, l)
		}
		n := strings.ToLower(strings.TrimSpace(name))
		if long, ok := compactNames[n]; ok {
			n = long
		}
		m.headers = append(m.headers, header{n, strings.TrimSpace(value)})
	}
	if cl := m.get("content-length"); cl != "" {
		n, err := strconv.Atoi(cl)
		if err != nil || n < 0 || n > len(body) {
			return nil, fmt.Errorf("%w: content-length %q with %d bytes of body", errNotSIP, cl, len(body))
		}
		body = body[:n]
	}
	m.body = append([]byte(nil), body...)
	if m.get("call-id") == "" || m.get("cseq") == "" || m.get("via") == "" {
		return nil, fmt.Errorf("%w: Call-ID, CSeq or Via missing", errNotSIP)
	}
	return m, nil
}

// get is the first value of a header.
func (m *message) get(name string) string {
	for _, h := range m.headers {
		if h.name == name {
			return h.value
		}
	}
	return ""
}

// all is every value of a header, a line holding several comma-separated
// values (Via, Record-Route, Route) split into them.
func (m *message) all(name string) []string {
	var out []string
	for _, h := range m.headers {
		if h.name == name {
			out = append(out, splitList(h.value)...)
		}
	}
	return out
}

func (m *message) add(name, value string) { m.headers = append(m.headers, header{name, value}) }

// set replaces every value of a header with one.
func (m *message) set(name, value string) {
	m.del(name)
	m.add(name, value)
}

func (m *message) del(name string) {
	hs := m.headers[:0]
	for _, h := range m.headers {
		if h.name != name {
			hs = append(hs, h)
		}
	}
	m.headers = hs
}

// cseq is the CSeq's number and method.
func (m *message) cseq() (uint32, string) {
	num, method, _ := strings.Cut(m.get("cseq"), " ")
	n, _ := strconv.ParseUint(strings.TrimSpace(num), 10, 32)
	return uint32(n), strings.TrimSpace(method)
}

// branch is the top Via's branch parameter.
func (m *message) branch() string {
	vias := m.all("via")
	if len(vias) == 0 {
		return ""
	}
	return param(vias[0], "branch")
}

// bytes renders the message with its Content-Length.
func (m *message) bytes() []byte {
	var b bytes.Buffer
	if m.request {
		fmt.Fprintf(&b, "%s %s SIP/2.0\r\n", m.method, m.uri)
	} else {
		fmt.Fprintf(&b, "SIP/2.0 %d %s\r\n", m.status, m.reason)
	}
	for _, h := range m.headers {
		if h.name == "content-length" {
			continue
		}
		fmt.Fprintf(&b, "%s: %s\r\n", displayName(h.name), h.value)
	}
	fmt.Fprintf(&b, "Content-Length: %d\r\n\r\n", len(m.body))
	b.Write(m.body)
	return b.Bytes()
}

// firstLine is the start line, for logs and the phone's record.
func (m *message) firstLine() string {
	if m.request {
		return m.method + " " + m.uri
	}
	return strconv.Itoa(m.status) + " " + m.reason
}

// splitList splits a header value on the commas between its values,
// not on those inside quotes or angle brackets.
func splitList(v string) []string {
	var out []string
	depth, quoted, start := 0, false, 0
	for i := 0; i < len(v); i++ {
		switch c := v[i]; {
		case c == '"' && (i == 0 || v[i-1] != '\\'):
			quoted = !quoted
		case quoted:
		case c == '<':
			depth++
		case c == '>':
			depth--
		case c == ',' && depth == 0:
			out = append(out, strings.TrimSpace(v[start:i]))
			start = i + 1
		}
	}
	if s := strings.TrimSpace(v[start:]); s != "" {
		out = append(out, s)
	}
	return out
}

// nameAddrURI is the URI of a name-addr or addr-spec (From, To, Contact,
// Route): inside the angle brackets, or up to the first parameter.
func nameAddrURI(v string) string {
	if i := strings.IndexByte(v, '<'); i >= 0 {
		if j := strings.IndexByte(v[i:], '>'); j > 0 {
			return v[i+1 : i+j]
		}
	}
	u, _, _ := strings.Cut(strings.TrimSpace(v), ";")
	return u
}

// headerParams is what follows the URI of a name-addr: ";tag=x;expires=60".
func headerParams(v string) string {
	if i := strings.IndexByte(v, '<'); i >= 0 {
		if j := strings.IndexByte(v[i:], '>'); j > 0 {
			return v[i+j+1:]
		}
	}
	_, p, _ := strings.Cut(v, ";")
	return ";" + p
}

// param is a parameter's value in ";a=b;c" form (case-insensitive name;
// "" when absent or valueless).
func param(v, name string) string {
	for _, p := range strings.Split(v, ";")[1:] {
		k, val, _ := strings.Cut(p, "=")
		if strings.EqualFold(strings.TrimSpace(k), name) {
			return strings.Trim(strings.TrimSpace(val), `"`)
		}
	}
	return ""
}

// tagOf is a From or To header's tag.
func tagOf(v string) string { return param(headerParams(v), "tag") }

// uriHostPort is where a SIP URI sends a request: its host and port (5060
// when absent). A name, not an address, is not supported: the lab has no
// DNS for phones.
func uriHostPort(uri string) (netip.AddrPort, error) {
	u := strings.TrimPrefix(strings.TrimPrefix(uri, "sip:"), "sips:")
	if at := strings.LastIndexByte(u, '@'); at >= 0 {
		u = u[at+1:]
	}
	hostport, params, _ := strings.Cut(u, ";")
	hostport, _, _ = strings.Cut(hostport, "?")
	if maddr := param(";"+params, "maddr"); maddr != "" {
		_, port, _ := strings.Cut(hostport, ":")
		hostport = maddr
		if port != "" {
			hostport += ":" + port
		}
	}
	if ap, err := netip.ParseAddrPort(hostport); err == nil {
		return ap, nil
	}
	a, err := netip.ParseAddr(strings.Trim(hostport, "[]"))
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("sip uri %q: host is not an address", uri)
	}
	return netip.AddrPortFrom(a, 5060), nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// newBranch is a Via branch with RFC 3261's magic cookie.
func newBranch() string { return "z9hG4bK" + randomHex(8) }

// response builds a response to req as RFC 3261 §8.2.6 says: Via (all,
// in order), From, To (with toTag added when it has none), Call-ID, CSeq.
func response(req *message, status int, reason, toTag string) *message {
	r := &message{status: status, reason: reason}
	for _, h := range req.headers {
		if h.name == "via" {
			r.add("via", h.value)
		}
	}
	r.add("from", req.get("from"))
	to := req.get("to")
	if toTag != "" && tagOf(to) == "" {
		to += ";tag=" + toTag
	}
	r.add("to", to)
	r.add("call-id", req.get("call-id"))
	r.add("cseq", req.get("cseq"))
	return r
}
