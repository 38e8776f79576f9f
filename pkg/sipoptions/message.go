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
	// Appended rather than formatted: a prober sends hundreds a second.
	b := make([]byte, 0, 512)
	b = append(b, "OPTIONS sip:"...)
	b = target.AppendTo(b)
	if transport == TCP {
		// RFC 3263: without the parameter a server may answer on UDP.
		b = append(b, ";transport=tcp"...)
	}
	b = append(b, " SIP/2.0\r\nVia: SIP/2.0/"...)
	b = append(b, transport.viaName()...)
	b = append(b, ' ')
	b = local.AppendTo(b)
	b = append(b, ";branch="...)
	b = append(b, branch...)
	b = append(b, ";rport\r\nMax-Forwards: 70\r\nFrom: <sip:fan-probe@"...)
	b = appendHost(b, local)
	b = append(b, ">;tag="...)
	b = append(b, tag...)
	b = append(b, "\r\nTo: <sip:"...)
	b = target.AppendTo(b)
	b = append(b, ">\r\nCall-ID: "...)
	b = append(b, callID...)
	b = append(b, "\r\nCSeq: "...)
	b = strconv.AppendUint(b, uint64(cseq), 10)
	b = append(b, " OPTIONS\r\nContact: <sip:fan-probe@"...)
	b = local.AppendTo(b)
	b = append(b, ">\r\nAccept: application/sdp\r\nUser-Agent: fan-sipclient\r\nContent-Length: 0\r\n\r\n"...)
	return b
}

func appendHost(b []byte, ap netip.AddrPort) []byte {
	if ap.Addr().Is6() {
		b = append(b, '[')
		b = ap.Addr().AppendTo(b)
		return append(b, ']')
	}
	return ap.Addr().AppendTo(b)
}

// message is the part of a SIP message matching needs. Requests and responses share it so
// tests can parse what the pinger sends with the same code.
type message struct {
	// Response fields.
	status int
	reason string
	// Request fields.
	method, uri string

	headers    []header // in order, names lower-case and full
	branch     string   // from the top Via
	callID     string
	cseq       uint32
	cseqMethod string
}

type header struct{ name, value string }

// header returns the first value of a header (lower-case full name).
func (m *message) header(name string) string {
	for _, h := range m.headers {
		if h.name == name {
			return h.value
		}
	}
	return ""
}

// compact maps RFC 3261 §7.3.3 compact header forms to full names.
var compact = map[string]string{
	"v": "via", "i": "call-id", "f": "from", "t": "to", "m": "contact",
	"l": "content-length", "c": "content-type", "k": "supported", "s": "subject", "e": "content-encoding",
}

// common are the full names a reply usually carries, lower-case: a name
// found here costs no allocation.
var common = []string{"via", "from", "to", "call-id", "cseq", "content-length", "contact", "server", "user-agent",
	"server-node", "allow", "accept", "supported", "content-type", "max-forwards"}

// headerName is a header's lower-case full name.
func headerName(raw string) string {
	raw = strings.TrimSpace(raw)
	if len(raw) == 1 {
		if full, ok := compact[strings.ToLower(raw)]; ok {
			return full
		}
	}
	for _, c := range common {
		if strings.EqualFold(raw, c) {
			return c
		}
	}
	return strings.ToLower(raw)
}

var errMalformed = errors.New("malformed SIP message")

// parseMessage parses a message's header. It runs for every reply, so it
// walks the bytes once and allocates little: one string for the header, a
// slice of name/value pairs that point into it.
func parseMessage(b []byte) (*message, error) {
	head := b
	if i := bytes.Index(b, []byte("\r\n\r\n")); i >= 0 {
		head = b[:i]
	} else if i := bytes.Index(b, []byte("\n\n")); i >= 0 {
		head = b[:i]
	}
	rest := string(head)
	// Lines end at LF; a CR before it belongs to the line ending.
	nextLine := func() (string, bool) {
		if rest == "" {
			return "", false
		}
		l, r, _ := strings.Cut(rest, "\n")
		rest = r
		return strings.TrimSuffix(l, "\r"), true
	}
	first, _ := nextLine()
	m := &message{headers: make([]header, 0, 12)}
	if after, ok := strings.CutPrefix(first, "SIP/2.0 "); ok {
		code, reason, _ := strings.Cut(after, " ")
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
	// Unfold continuation lines (RFC 3261 §7.3.1) before splitting names
	// from values: a header is complete once the next line is not a
	// continuation.
	var cur string
	flush := func() error {
		if cur == "" {
			return nil
		}
		name, val, ok := strings.Cut(cur, ":")
		if !ok {
			return fmt.Errorf("%w: header %q", errMalformed, cur)
		}
		m.headers = append(m.headers, header{headerName(name), strings.TrimSpace(val)})
		cur = ""
		return nil
	}
	for {
		l, ok := nextLine()
		if !ok {
			break
		}
		if l == "" {
			continue
		}
		if (l[0] == ' ' || l[0] == '\t') && cur != "" {
			cur += " " + strings.TrimSpace(l)
			continue
		}
		if err := flush(); err != nil {
			return nil, err
		}
		cur = l
	}
	if err := flush(); err != nil {
		return nil, err
	}
	if via := m.header("via"); via != "" {
		top, _, _ := strings.Cut(via, ",")
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
