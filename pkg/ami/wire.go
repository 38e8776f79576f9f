package ami

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/staskobzar/goami2"
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

// errMalformed marks a message goami2's parser refused (a line that is not
// "Name: value" with a name of letters, digits and '-'). The message was read to its end, so the stream is still
// framed: the reader drops it and goes on (its ActionID is lost with it; the
// caller times out).
var errMalformed = errors.New("ami: malformed message")

// message is one AMI message in goami2's model: its headers in the order
// they came.
type message struct{ g *goami2.Message }

// get returns the first value of a header (case-insensitive), or "".
func (m *message) get(name string) string { return m.g.Field(name) }

// values returns every value of a header, in order; nil when there is none.
func (m *message) values(name string) []string {
	if v := m.g.FieldValues(name); len(v) > 0 {
		return v
	}
	return nil
}

func (m *message) isEvent() bool    { return m.g.IsEvent() }
func (m *message) isSuccess() bool  { return m.g.IsSuccess() }
func (m *message) actionID() string { return m.g.ActionID() }

// String is the message as AMI writes it, headers and the closing blank line.
func (m *message) String() string { return m.g.String() }

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
//
// The framing and the limits are fan's: goami2.Parse takes a whole message
// as a string, has no limits, and indexes past the end of an input that
// stops after a CR or inside a header name ("A", "\r" and "Ab:\r" panic),
// so it only ever sees a frame fan has read, which ends in CR LF CR LF.
type wireReader struct {
	br  *bufio.Reader
	buf []byte // the message being read, each line ending in CR LF
}

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
// message goami2's parser refuses is read to its end and returned as
// errMalformed; a message over the limits ends the stream (ErrProtocol).
func (r *wireReader) next() (*message, error) {
	r.buf = r.buf[:0]
	size, lines := 0, 0
	for {
		b, err := r.line()
		if err != nil {
			return nil, err
		}
		if len(b) == 0 {
			if lines == 0 {
				continue
			}
			m, err := parse(append(r.buf, "\r\n"...))
			if cap(r.buf) > readBuffer {
				r.buf = nil // a rare big message does not stay for the connection's life
			}
			return m, err
		}
		size += len(b)
		if size > maxMessage || lines >= maxFields {
			return nil, fmt.Errorf("%w: a message over %d bytes or %d lines", ErrProtocol, maxMessage, maxFields)
		}
		r.buf = append(append(r.buf, b...), "\r\n"...)
		lines++
	}
}

// parse hands one framed message to goami2's parser. Its error quotes the
// rest of the message, up to maxMessage bytes: only its start goes into the
// error, which the client logs.
func parse(frame []byte) (*message, error) {
	g, err := goami2.Parse(string(frame))
	if err != nil {
		return nil, fmt.Errorf("%w: %s", errMalformed, truncate([]byte(err.Error()), 96))
	}
	return &message{g: g}, nil
}

func truncate(b []byte, n int) []byte {
	if len(b) > n {
		return append(bytes.Clone(b[:n]), "..."...)
	}
	return bytes.Clone(b)
}

// encodeAction writes an action in goami2's model: Action, then ActionID
// (when set), then the fields, a blank line after.
func encodeAction(name, id string, fields []Field) []byte {
	a := goami2.NewAction(name)
	if id != "" {
		a.AddField("ActionID", id)
	}
	for _, f := range fields {
		a.AddField(f.Name, f.Value)
	}
	return a.Byte()
}
