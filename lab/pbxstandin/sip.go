package pbxstandin

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"
)

// NodeHeader names the node that answered, like the namespace lab's
// Kamailio does, so a client sees which node holds the floating IP.
const NodeHeader = "Server-Node"

// compact maps RFC 3261 compact header names to their long forms.
var compact = map[string]string{"v": "via", "f": "from", "t": "to", "i": "call-id", "m": "contact"}

type header struct{ name, value string }

// parse splits a SIP message into its start line and headers (unfolded
// lines only; the stand-in never needs folding).
func parse(msg []byte) (string, []header, bool) {
	head, _, _ := bytes.Cut(msg, []byte("\r\n\r\n"))
	lines := strings.Split(string(head), "\r\n")
	if len(lines) == 0 || lines[0] == "" {
		return "", nil, false
	}
	var hs []header
	for _, l := range lines[1:] {
		name, value, ok := strings.Cut(l, ":")
		if !ok {
			continue
		}
		n := strings.ToLower(strings.TrimSpace(name))
		if long, ok := compact[n]; ok {
			n = long
		}
		hs = append(hs, header{n, strings.TrimSpace(value)})
	}
	return lines[0], hs, true
}

func get(hs []header, name string) string {
	for _, h := range hs {
		if h.name == name {
			return h.value
		}
	}
	return ""
}

// Respond answers one request: 200 OK to OPTIONS and REGISTER, 501 to other
// methods, nothing to ACK, responses or garbage. The reply copies the Via
// headers (in order), From, To (with a tag added), Call-ID and CSeq, as RFC
// 3261 §8.2.6 requires, and names the node.
func Respond(req []byte, node string) []byte {
	start, hs, ok := parse(req)
	if !ok {
		return nil
	}
	method, rest, _ := strings.Cut(start, " ")
	if !strings.HasSuffix(rest, "SIP/2.0") || strings.HasPrefix(start, "SIP/") {
		return nil
	}
	if method == "ACK" {
		return nil
	}
	callID, cseq, to := get(hs, "call-id"), get(hs, "cseq"), get(hs, "to")
	if callID == "" || cseq == "" || get(hs, "via") == "" {
		return nil
	}
	status := "200 OK"
	if method != "OPTIONS" && method != "REGISTER" {
		status = "501 Not Implemented"
	}
	if !strings.Contains(strings.ToLower(to), ";tag=") {
		to += ";tag=" + randHex(4)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "SIP/2.0 %s\r\n", status)
	for _, h := range hs {
		if h.name == "via" {
			fmt.Fprintf(&b, "Via: %s\r\n", h.value)
		}
	}
	fmt.Fprintf(&b, "From: %s\r\nTo: %s\r\nCall-ID: %s\r\nCSeq: %s\r\n", get(hs, "from"), to, callID, cseq)
	if method == "REGISTER" {
		if c := get(hs, "contact"); c != "" {
			exp := get(hs, "expires")
			if exp == "" {
				exp = "3600"
			}
			fmt.Fprintf(&b, "Contact: %s;expires=%s\r\n", c, exp)
		}
	}
	if method == "OPTIONS" {
		b.WriteString("Allow: OPTIONS, REGISTER\r\n")
	}
	fmt.Fprintf(&b, "%s: %s\r\nServer: fan-pbxstandin (lab stand-in, not Asterisk)\r\nContent-Length: 0\r\n\r\n", NodeHeader, node)
	return []byte(b.String())
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// Answer is one SIP reply as a client saw it.
type Answer struct {
	Status string // "200 OK"
	Node   string // the Server-Node header
	RTT    time.Duration
}

// ErrNoAnswer is returned when nothing matching came back in time.
var ErrNoAnswer = errors.New("no SIP answer")

// Ping sends one request (OPTIONS or REGISTER) to target (host:port) over
// UDP and waits for the reply with the same Call-ID, until ctx ends.
func Ping(ctx context.Context, method, target string) (Answer, error) {
	c, err := net.Dial("udp", target)
	if err != nil {
		return Answer{}, fmt.Errorf("sip %s %s: %w", method, target, err)
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	local := c.LocalAddr().String()
	callID := randHex(8) + "@fan-pbxstandin"
	uri := "sip:" + target
	req := fmt.Sprintf("%s %s SIP/2.0\r\nVia: SIP/2.0/UDP %s;branch=z9hG4bK%s;rport\r\nMax-Forwards: 70\r\n"+
		"From: <sip:probe@%s>;tag=%s\r\nTo: <%s>\r\nCall-ID: %s\r\nCSeq: 1 %s\r\nContact: <sip:probe@%s>\r\n"+
		"User-Agent: fan-pbxstandin\r\nContent-Length: 0\r\n\r\n",
		method, uri, local, randHex(6), local, randHex(4), uri, callID, method, local)
	sent := time.Now()
	if _, err := c.Write([]byte(req)); err != nil {
		return Answer{}, fmt.Errorf("sip %s %s: %w", method, target, err)
	}
	buf := make([]byte, 65535)
	for {
		n, err := c.Read(buf)
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				return Answer{}, fmt.Errorf("sip %s %s: %w", method, target, ErrNoAnswer)
			}
			// ECONNREFUSED from an ICMP port unreachable: nothing listens.
			return Answer{}, fmt.Errorf("sip %s %s: %w: %v", method, target, ErrNoAnswer, err)
		}
		start, hs, ok := parse(buf[:n])
		if !ok || !strings.HasPrefix(start, "SIP/2.0 ") || get(hs, "call-id") != callID {
			continue
		}
		return Answer{Status: strings.TrimPrefix(start, "SIP/2.0 "), Node: get(hs, strings.ToLower(NodeHeader)), RTT: time.Since(sent)}, nil
	}
}
