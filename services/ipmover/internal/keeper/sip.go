package keeper

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// message is what the keeper reads of a SIP message seen on the capture:
// enough to tell whether it belongs to a kept dialog or answers a BYE the
// keeper sent, and nothing it would act on beyond that. In particular no
// address in a message (Via, Contact, Route) is ever used: the keeper only
// sends to the addresses of its records.
type message struct {
	request bool
	method  string // a request's method
	status  int    // a response's status
	callID  string
	fromTag string
	toTag   string
	cseq    uint32
	// cseqMethod is the CSeq header's method.
	cseqMethod string
	// branch is the top Via's branch parameter.
	branch string
}

// Bounds of what the parser reads. A message beyond them is refused, not
// read in part: the capture carries whatever anyone sends to the PBX.
const (
	maxMessage  = 65535
	maxHeaders  = 256
	maxLine     = 8 << 10
	maxTokenLen = 1024
)

var (
	errMalformed = errors.New("malformed SIP message")
	errTooLarge  = errors.New("SIP message beyond the keeper's bounds")
)

// isKeepalive reports a NAT keepalive (RFC 5626 CRLF pings, or a few
// bytes), which is not a SIP message and no sign of anything wrong.
func isKeepalive(b []byte) bool {
	return len(bytes.TrimSpace(b)) == 0 || len(b) <= 4
}

// parseMessage reads a SIP message's start line and the headers the keeper
// matches on. It is strict where a lenient reading could be abused (a
// duplicated Call-ID, From, To or CSeq is refused: two receivers could read
// two different dialogs in it) and lenient elsewhere (line ends, case,
// compact header names, folded lines). The body is never read.
func parseMessage(b []byte) (message, error) {
	var m message
	if len(b) > maxMessage {
		return m, errTooLarge
	}
	// A message cut short (the first fragment of a large datagram) still
	// has its headers: read up to the last whole line.
	head := b
	if i := bytes.Index(b, []byte("\r\n\r\n")); i >= 0 {
		head = b[:i]
	} else if i := bytes.Index(b, []byte("\n\n")); i >= 0 {
		head = b[:i]
	} else if i := bytes.LastIndexByte(b, '\n'); i >= 0 {
		head = b[:i]
	}
	lines := strings.Split(string(head), "\n")
	if len(lines) < 2 {
		return m, fmt.Errorf("%w: no headers", errMalformed)
	}
	if len(lines) > maxHeaders+1 {
		return m, fmt.Errorf("%w: %d lines", errTooLarge, len(lines))
	}
	if err := m.startLine(strings.TrimSuffix(lines[0], "\r")); err != nil {
		return m, err
	}
	var (
		headers []header
		seen    = map[string]bool{}
	)
	for _, raw := range lines[1:] {
		line := strings.TrimSuffix(raw, "\r")
		if len(line) > maxLine {
			return m, fmt.Errorf("%w: a line of %d bytes", errTooLarge, len(line))
		}
		if line == "" {
			break
		}
		if line[0] == ' ' || line[0] == '\t' {
			// A folded line continues the previous header (RFC 3261 7.3.1).
			if len(headers) == 0 {
				return m, fmt.Errorf("%w: continuation before any header", errMalformed)
			}
			headers[len(headers)-1].value += " " + strings.TrimSpace(line)
			continue
		}
		name, value, ok := strings.Cut(line, ":")
		if !ok {
			return m, fmt.Errorf("%w: header line without a colon", errMalformed)
		}
		headers = append(headers, header{name: canonical(strings.TrimSpace(name)), value: strings.TrimSpace(value)})
	}
	for _, h := range headers {
		switch h.name {
		case "call-id", "from", "to", "cseq":
			if seen[h.name] {
				return m, fmt.Errorf("%w: %s twice", errMalformed, h.name)
			}
			seen[h.name] = true
		}
		switch h.name {
		case "call-id":
			m.callID = h.value
		case "from":
			m.fromTag = tagOf(h.value)
		case "to":
			m.toTag = tagOf(h.value)
		case "cseq":
			num, method, ok := strings.Cut(h.value, " ")
			n, err := strconv.ParseUint(strings.TrimSpace(num), 10, 32)
			if !ok || err != nil {
				return m, fmt.Errorf("%w: CSeq %q", errMalformed, h.value)
			}
			m.cseq, m.cseqMethod = uint32(n), strings.ToUpper(strings.TrimSpace(method))
		case "via":
			if m.branch == "" && !seen["via"] {
				top, _, _ := strings.Cut(h.value, ",")
				m.branch = param(top, "branch")
			}
			seen["via"] = true
		}
	}
	if m.callID == "" || !seen["from"] || !seen["to"] || !seen["cseq"] || m.cseqMethod == "" {
		return m, fmt.Errorf("%w: Call-ID, From, To or CSeq missing", errMalformed)
	}
	for _, f := range []string{m.callID, m.fromTag, m.toTag, m.branch, m.cseqMethod} {
		if len(f) > maxTokenLen {
			return m, fmt.Errorf("%w: a field of %d bytes", errTooLarge, len(f))
		}
	}
	if m.request && m.method != m.cseqMethod {
		return m, fmt.Errorf("%w: %s request with CSeq method %s", errMalformed, m.method, m.cseqMethod)
	}
	return m, nil
}

type header struct{ name, value string }

func (m *message) startLine(line string) error {
	if rest, ok := strings.CutPrefix(line, "SIP/2.0 "); ok {
		code, _, _ := strings.Cut(rest, " ")
		n, err := strconv.Atoi(code)
		if err != nil || len(code) != 3 || n < 100 || n > 699 {
			return fmt.Errorf("%w: status line %.40q", errMalformed, line)
		}
		m.status = n
		return nil
	}
	f := strings.Fields(line)
	if len(f) != 3 || f[2] != "SIP/2.0" || !isToken(f[0]) {
		return fmt.Errorf("%w: start line %.40q", errMalformed, line)
	}
	m.request, m.method = true, strings.ToUpper(f[0])
	return nil
}

// canonical lower-cases a header name and expands RFC 3261's compact forms.
func canonical(name string) string {
	n := strings.ToLower(name)
	switch n {
	case "i":
		return "call-id"
	case "f":
		return "from"
	case "t":
		return "to"
	case "v":
		return "via"
	}
	return n
}

// tagOf returns the tag parameter of a From or To value. In a name-addr
// (<...>) the header's parameters follow the '>'; in a bare addr-spec they
// follow the URI, which then cannot carry parameters of its own.
func tagOf(v string) string {
	params := v
	if i := strings.LastIndexByte(v, '>'); i >= 0 {
		params = v[i+1:]
	} else if i := strings.IndexByte(v, ';'); i >= 0 {
		params = v[i:]
	} else {
		return ""
	}
	return param(params, "tag")
}

// param returns the value of ;name= in a parameter list.
func param(v, name string) string {
	for p := range strings.SplitSeq(v, ";") {
		k, val, ok := strings.Cut(p, "=")
		if ok && strings.EqualFold(strings.TrimSpace(k), name) {
			return strings.TrimSpace(val)
		}
	}
	return ""
}

func isToken(s string) bool {
	if s == "" || len(s) > 32 {
		return false
	}
	for _, c := range s {
		if !(c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || strings.ContainsRune("-.!%*_+`'~", c)) {
			return false
		}
	}
	return true
}

// byeRequest is one BYE the keeper sends in a dialog, as RFC 3261 12.2.1.1
// and 15.1.1 build it from the dialog state: the remote target as
// Request-URI (the route set is empty: fan's records carry none, and
// phones registered with the PBX directly have none), From with the PBX's
// URI and tag, To with the phone's, the dialog's Call-ID, a CSeq above any
// the PBX used, a Via naming the floating address with a fresh branch, and
// Max-Forwards 70.
type byeRequest struct {
	target  string
	from    string // the PBX side: name-addr with its tag
	to      string // the phone: name-addr with its tag
	callID  string
	cseq    uint32
	via     netip.AddrPort
	branch  string
	reasonQ int // Q.850 cause for the Reason header (RFC 3326)
}

// encode writes the request. Values come from a validated record (no line
// breaks) and the keeper's own state.
func (r byeRequest) encode() []byte {
	var b bytes.Buffer
	b.Grow(512 + len(r.target) + len(r.from) + len(r.to) + len(r.callID))
	b.WriteString("BYE " + r.target + " SIP/2.0\r\n")
	b.WriteString("Via: SIP/2.0/UDP " + r.via.String() + ";rport;branch=" + r.branch + "\r\n")
	b.WriteString("Max-Forwards: 70\r\n")
	b.WriteString("From: " + r.from + "\r\n")
	b.WriteString("To: " + r.to + "\r\n")
	b.WriteString("Call-ID: " + r.callID + "\r\n")
	b.WriteString("CSeq: " + strconv.FormatUint(uint64(r.cseq), 10) + " BYE\r\n")
	if r.reasonQ > 0 {
		b.WriteString("Reason: Q.850;cause=" + strconv.Itoa(r.reasonQ) + "\r\n")
	}
	b.WriteString("User-Agent: fan-ipmover\r\n")
	b.WriteString("Content-Length: 0\r\n\r\n")
	return b.Bytes()
}

// nameAddr puts a URI in angle brackets for a From or To header, unless the
// record already has it as a name-addr (Asterisk prints a display name
// with it when the dialog has one).
func nameAddr(uri, tag string) string {
	if !strings.Contains(uri, "<") {
		uri = "<" + uri + ">"
	}
	return uri + ";tag=" + tag
}
