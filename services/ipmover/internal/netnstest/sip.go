package netnstest

import (
	"net"
	"strings"
)

// ServeOPTIONS answers every SIP request read from c with 200 OK, copying
// the headers a client matches on, after ignoring the first drop requests,
// until c is closed. It stands in for a PBX's SIP stack in tests that need
// something answering on an address.
func ServeOPTIONS(c net.PacketConn, drop int) {
	buf := make([]byte, 65535)
	for n := 0; ; n++ {
		k, from, err := c.ReadFrom(buf)
		if err != nil {
			return
		}
		if n < drop {
			continue
		}
		_, _ = c.WriteTo([]byte(sipOK(string(buf[:k]))), from)
	}
}

func sipOK(req string) string {
	var b strings.Builder
	b.WriteString("SIP/2.0 200 OK\r\n")
	for _, line := range strings.Split(req, "\r\n") {
		name, _, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		switch strings.ToLower(strings.TrimSpace(name)) {
		case "via", "v", "from", "f", "to", "t", "call-id", "i", "cseq":
			b.WriteString(line + "\r\n")
		}
	}
	b.WriteString("Content-Length: 0\r\n\r\n")
	return b.String()
}
