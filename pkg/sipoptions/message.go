package sipoptions

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

func buildOptions(target, local netip.AddrPort, transport Transport, branch, tag, callID string, cseq uint32) []byte {
	var b bytes.Buffer
	uriParams := ""
	if transport == TCP {
		// RFC 3263: without the parameter a server may answer on UDP.
		uriParams = ";transport=tcp"
	}
	fmt.Fprintf(&b, "OPTIONS sip:%s%s SIP/2.0\r\n", target, uriParams)
	fmt.Fprintf(&b, "Via: SIP/2.0/%s %s;branch=%s;rport\r\n", transport.viaName(), local, branch)
	b.WriteString("Max-Forwards: 70\r\n")
	fmt.Fprintf(&b, "From: <sip:fan-probe@%s>;tag=%s\r\n", hostOnly(local), tag)
	fmt.Fprintf(&b, "To: <sip:%s>\r\n", target)
	fmt.Fprintf(&b, "Call-ID: %s\r\n", callID)
	fmt.Fprintf(&b, "CSeq: %d OPTIONS\r\n", cseq)
	fmt.Fprintf(&b, "Contact: <sip:fan-probe@%s>\r\n", local)
	b.WriteString("Accept: application/sdp\r\n")
	b.WriteString("User-Agent: fan-sipclient\r\n")
	b.WriteString("Content-Length: 0\r\n\r\n")
	return b.Bytes()
}

func hostOnly(ap netip.AddrPort) string {
	if ap.Addr().Is6() {
		return "[" + ap.Addr().String() + "]"
	}
	return ap.Addr().String()
}

// message is the part of a SIP message matching needs. Requests and responses share it so
// tests can parse what the pinger sends with the same code.
type message struct {
	// Response fields.
	status int
	reason string
	// Request fields.
	method, uri string

	headers    map[string][]string // lower-case full names
	branch     string              // from the top Via
	callID     string
	cseq       uint32
	cseqMethod string
}

func (m *message) header(name string) string {
	if v := m.headers[name]; len(v) > 0 {
		return v[0]
	}
	return ""
}

// compact maps RFC 3261 §7.3.3 compact header forms to full names.
var compact = map[string]string{
	"v": "via", "i": "call-id", "f": "from", "t": "to", "m": "contact",
	"l": "content-length", "c": "content-type", "k": "supported", "s": "subject", "e": "content-encoding",
}

var errMalformed = errors.New("malformed SIP message")

func parseMessage(b []byte) (*message, error) {
	head := b
	if i := bytes.Index(b, []byte("\r\n\r\n")); i >= 0 {
		head = b[:i]
	} else if i := bytes.Index(b, []byte("\n\n")); i >= 0 {
		head = b[:i]
	}
	lines := strings.Split(strings.ReplaceAll(string(head), "\r\n", "\n"), "\n")
	if len(lines) == 0 {
		return nil, errMalformed
	}
	m := &message{headers: map[string][]string{}}
	first := lines[0]
	if rest, ok := strings.CutPrefix(first, "SIP/2.0 "); ok {
		code, reason, _ := strings.Cut(rest, " ")
		st, err := strconv.Atoi(code)
		if err != nil || len(code) != 3 || st < 100 || st > 699 {
			return nil, fmt.Errorf("%w: status line %q", errMalformed, first)
		}
		m.status, m.reason = st, strings.TrimSpace(reason)
	} else {
		f := strings.Fields(first)
		if len(f) != 3 || f[2] != "SIP/2.0" {
			return nil, fmt.Errorf("%w: start line %q", errMalformed, first)
		}
		m.method, m.uri = f[0], f[1]
	}
	// Unfold continuation lines (RFC 3261 §7.3.1) before splitting names from values.
	var hdrs []string
	for _, l := range lines[1:] {
		if l == "" {
			continue
		}
		if (l[0] == ' ' || l[0] == '\t') && len(hdrs) > 0 {
			hdrs[len(hdrs)-1] += " " + strings.TrimSpace(l)
			continue
		}
		hdrs = append(hdrs, l)
	}
	for _, h := range hdrs {
		name, val, ok := strings.Cut(h, ":")
		if !ok {
			return nil, fmt.Errorf("%w: header %q", errMalformed, h)
		}
		name = strings.ToLower(strings.TrimSpace(name))
		if full, ok := compact[name]; ok {
			name = full
		}
		m.headers[name] = append(m.headers[name], strings.TrimSpace(val))
	}
	if vias := m.headers["via"]; len(vias) > 0 {
		top, _, _ := strings.Cut(vias[0], ",")
		m.branch = viaParam(top, "branch")
	}
	m.callID = m.header("call-id")
	if f := strings.Fields(m.header("cseq")); len(f) == 2 {
		if n, err := strconv.ParseUint(f[0], 10, 32); err == nil {
			m.cseq, m.cseqMethod = uint32(n), f[1]
		}
	}
	if m.branch == "" || m.callID == "" || m.cseqMethod == "" {
		return nil, fmt.Errorf("%w: missing Via branch, Call-ID or CSeq", errMalformed)
	}
	return m, nil
}

// viaParam returns a Via parameter; parameter names are case-insensitive, values (the
// branch) are compared exactly.
func viaParam(via, name string) string {
	parts := strings.Split(via, ";")
	for _, p := range parts[1:] {
		k, v, _ := strings.Cut(strings.TrimSpace(p), "=")
		if strings.EqualFold(strings.TrimSpace(k), name) {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// maxHeader bounds one message's header on a stream, so a peer that never
// ends its header cannot make the reader grow without limit.
const maxHeader = 64 << 10

// readStreamMessage reads one message from a stream transport (RFC 3261
// §18.3: the header ends at an empty line, Content-Length frames the body)
// and returns it parsed. CRLF keepalives between messages (RFC 5626 §4.4.1)
// are skipped. The body is read and dropped: OPTIONS answers are judged by
// their status line.
func readStreamMessage(br *bufio.Reader) (*message, error) {
	var head []byte
	for {
		line, err := br.ReadSlice('\n')
		if err != nil && !errors.Is(err, bufio.ErrBufferFull) {
			return nil, err
		}
		if len(head) == 0 && (len(bytes.TrimSpace(line)) == 0) {
			continue
		}
		head = append(head, line...)
		if len(head) > maxHeader {
			return nil, fmt.Errorf("%w: header longer than %d bytes", errMalformed, maxHeader)
		}
		if bytes.Equal(line, []byte("\r\n")) || bytes.Equal(line, []byte("\n")) {
			break
		}
	}
	m, err := parseMessage(head)
	if err != nil {
		return nil, err
	}
	if cl := m.header("content-length"); cl != "" {
		n, err := strconv.Atoi(cl)
		if err != nil || n < 0 {
			return nil, fmt.Errorf("%w: Content-Length %q", errMalformed, cl)
		}
		if _, err := br.Discard(n); err != nil {
			return nil, err
		}
	}
	return m, nil
}
