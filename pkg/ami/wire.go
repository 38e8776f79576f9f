package ami

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"
)

// What a peer may send, so a hostile or broken listener on the AMI port
// cannot make the client buffer without end. Asterisk's own lines are far
// shorter (an AstDB value, a CLI output line); a Command's output is one
// field per line, hence the generous field count.
const (
	readBuffer  = 8 << 10
	maxLine     = 64 << 10
	maxFields   = 16 << 10
	maxMessage  = 4 << 20
	bannerStart = "Asterisk Call Manager/"
)

// errMalformed marks a message with a line that is not "Name: value". The
// message was read to its end, so the stream is still framed: the reader
// drops it and goes on (its ActionID is lost with it; the caller times out).
var errMalformed = errors.New("ami: malformed message")

// message is one AMI message: its header lines in the order they came.
type message struct{ fields []Field }

// get returns the first value of a header (case-insensitive), or "".
func (m *message) get(name string) string {
	for _, f := range m.fields {
		if strings.EqualFold(f.Name, name) {
			return f.Value
		}
	}
	return ""
}

// values returns every value of a header, in order.
func (m *message) values(name string) []string {
	var out []string
	for _, f := range m.fields {
		if strings.EqualFold(f.Name, name) {
			out = append(out, f.Value)
		}
	}
	return out
}

func (m *message) isEvent() bool   { return m.get("Event") != "" }
func (m *message) isSuccess() bool { return strings.EqualFold(m.get("Response"), "Success") }
func (m *message) actionID() string {
	return m.get("ActionID")
}

// String is the message as AMI writes it, headers and the closing blank line.
func (m *message) String() string {
	var b strings.Builder
	for _, f := range m.fields {
		b.WriteString(f.Name)
		b.WriteString(": ")
		b.WriteString(f.Value)
		b.WriteString("\r\n")
	}
	b.WriteString("\r\n")
	return b.String()
}

func isListStart(m *message) bool {
	return m.isSuccess() && strings.EqualFold(m.get("EventList"), "start")
}

func isListComplete(m *message) bool {
	return strings.EqualFold(m.get("EventList"), "Complete")
}

// wireReader frames the AMI stream: lines ending in CR LF (a bare LF is
// taken too), messages ending at an empty line. One goroutine reads: the
// login, then the client's reader, from the same buffer, so nothing that
// arrived in the login's segment is lost.
type wireReader struct{ br *bufio.Reader }

func newWireReader(r io.Reader) *wireReader {
	return &wireReader{br: bufio.NewReaderSize(r, readBuffer)}
}

// line returns the next line without its end, valid until the next read.
func (r *wireReader) line() ([]byte, error) {
	var long []byte
	for {
		b, err := r.br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			if len(long)+len(b) > maxLine {
				return nil, fmt.Errorf("%w: a line longer than %d bytes", ErrProtocol, maxLine)
			}
			long = append(long, b...)
			continue
		}
		if err != nil {
			return nil, err
		}
		if long != nil {
			b = append(long, b...)
			if len(b) > maxLine {
				return nil, fmt.Errorf("%w: a line longer than %d bytes", ErrProtocol, maxLine)
			}
		}
		b = b[:len(b)-1]
		if n := len(b); n > 0 && b[n-1] == '\r' {
			b = b[:n-1]
		}
		return b, nil
	}
}

// banner reads the greeting Asterisk sends on connect.
func (r *wireReader) banner() (string, error) {
	b, err := r.line()
	if err != nil {
		return "", err
	}
	if !bytes.HasPrefix(b, []byte(bannerStart)) {
		return "", fmt.Errorf("%w: banner %q is not AMI's", ErrProtocol, truncate(b, 64))
	}
	return string(b), nil
}

// next reads one message. Empty lines between messages are skipped. A
// message with a line that is not a header is read to its end and returned
// as errMalformed; a message over the limits ends the stream (ErrProtocol).
func (r *wireReader) next() (*message, error) {
	m := &message{}
	size := 0
	var bad []byte
	for {
		b, err := r.line()
		if err != nil {
			return nil, err
		}
		if len(b) == 0 {
			if bad != nil {
				return nil, fmt.Errorf("%w: line %q", errMalformed, bad)
			}
			if len(m.fields) == 0 {
				continue
			}
			return m, nil
		}
		size += len(b)
		if size > maxMessage || len(m.fields) >= maxFields {
			return nil, fmt.Errorf("%w: a message over %d bytes or %d lines", ErrProtocol, maxMessage, maxFields)
		}
		f, ok := parseField(b)
		if !ok {
			if bad == nil {
				bad = truncate(b, 64)
			}
			continue
		}
		m.fields = append(m.fields, f)
	}
}

// parseField splits "Name: value". A name is non-empty and holds no space;
// the spaces after the colon are not part of the value.
func parseField(b []byte) (Field, bool) {
	i := bytes.IndexByte(b, ':')
	if i <= 0 || bytes.ContainsAny(b[:i], " \t") {
		return Field{}, false
	}
	v := bytes.TrimLeft(b[i+1:], " ")
	return Field{Name: string(b[:i]), Value: string(v)}, true
}

func truncate(b []byte, n int) []byte {
	if len(b) > n {
		return append(bytes.Clone(b[:n]), "..."...)
	}
	return bytes.Clone(b)
}

// encodeAction writes an action: Action, then ActionID (when set), then the
// fields, a blank line after; one allocation.
func encodeAction(name, id string, fields []Field) []byte {
	n := len("Action: \r\nActionID: \r\n\r\n") + len(name) + len(id)
	for _, f := range fields {
		n += len(f.Name) + len(f.Value) + 4
	}
	b := make([]byte, 0, n)
	b = append(append(append(b, "Action: "...), name...), "\r\n"...)
	if id != "" {
		b = append(append(append(b, "ActionID: "...), id...), "\r\n"...)
	}
	for _, f := range fields {
		b = append(append(append(append(b, f.Name...), ": "...), f.Value...), "\r\n"...)
	}
	return append(b, "\r\n"...)
}
