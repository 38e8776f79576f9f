package pbxstandin

import (
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// The audio of a call whose media is anchored (direct_media = no, or
// before the direct-media re-INVITEs): each leg has an RTP socket of the
// stand-in's, named in the SDP that leg's phone got, and what arrives on
// one leg's socket goes out of the other's to the other phone, as
// Asterisk's RTP bridge relays it. The sockets listen on every address, as
// Asterisk's do: a phone sends to the address its SDP named (the floating
// one with external_media_address) and receives from the node's own. When
// the stand-in is frozen or dead nothing is relayed: the audio stops, as
// it does when Asterisk hangs or dies.

// rtpLeg is one leg's RTP socket.
type rtpLeg struct {
	conn   *net.UDPConn
	frozen func() bool
	done   chan struct{}

	mu    sync.Mutex
	phone *net.UDPAddr // where this leg's phone receives, from its SDP
	peer  *rtpLeg
	relay bool
}

func newRTPLeg(frozen func() bool) (*rtpLeg, error) {
	c, err := net.ListenUDP("udp", &net.UDPAddr{})
	if err != nil {
		return nil, fmt.Errorf("pbxstandin: rtp socket: %w", err)
	}
	l := &rtpLeg{conn: c, frozen: frozen, done: make(chan struct{})}
	go l.run()
	return l, nil
}

func (l *rtpLeg) port() int { return l.conn.LocalAddr().(*net.UDPAddr).Port }

// pair makes a and b relay to each other while relay is on.
func pair(a, b *rtpLeg) {
	a.mu.Lock()
	a.peer = b
	a.mu.Unlock()
	b.mu.Lock()
	b.peer = a
	b.mu.Unlock()
}

func (l *rtpLeg) setPhone(a *net.UDPAddr) {
	l.mu.Lock()
	l.phone = a
	l.mu.Unlock()
}

func (l *rtpLeg) setRelay(on bool) {
	l.mu.Lock()
	l.relay = on
	l.mu.Unlock()
}

func (l *rtpLeg) run() {
	defer close(l.done)
	buf := make([]byte, 2048)
	for {
		n, _, err := l.conn.ReadFromUDP(buf)
		if err != nil {
			return
		}
		l.mu.Lock()
		relay, peer := l.relay, l.peer
		l.mu.Unlock()
		if !relay || peer == nil || l.frozen() {
			continue
		}
		peer.mu.Lock()
		to := peer.phone
		peer.mu.Unlock()
		if to != nil {
			_, _ = peer.conn.WriteToUDP(buf[:n], to)
		}
	}
}

func (l *rtpLeg) close() {
	l.conn.Close()
	<-l.done
}

// sdp is the audio of a session description: where it is received and
// the payload types offered or accepted.
type sdp struct {
	ip       string
	port     int
	payloads []string
}

func parseSDP(body string) (sdp, bool) {
	var s sdp
	for _, line := range strings.Split(body, "\n") {
		line = strings.TrimRight(line, "\r")
		switch {
		case strings.HasPrefix(line, "c=IN IP4 "):
			s.ip = strings.TrimSpace(strings.TrimPrefix(line, "c=IN IP4 "))
		case strings.HasPrefix(line, "m=audio "):
			f := strings.Fields(line)
			if len(f) < 4 {
				return sdp{}, false
			}
			port, err := strconv.Atoi(f[1])
			if err != nil {
				return sdp{}, false
			}
			s.port, s.payloads = port, f[3:]
		}
	}
	return s, s.ip != "" && s.port > 0
}

func (s sdp) addr() *net.UDPAddr {
	ip := net.ParseIP(s.ip)
	if ip == nil {
		return nil
	}
	return &net.UDPAddr{IP: ip, Port: s.port}
}

// offered are the payload types the stand-in offers (allow = ulaw,alaw
// and telephone events), in Asterisk's order.
var offered = []string{"0", "8", "101"}

// accept is the answer to an offer: the offered types the stand-in has,
// in the offer's order.
func accept(offer []string) []string {
	var out []string
	for _, pt := range offer {
		if slices.Contains(offered, pt) {
			out = append(out, pt)
		}
	}
	if len(out) == 0 {
		return []string{"0"}
	}
	return out
}

var rtpmap = map[string]string{"0": "PCMU/8000", "8": "PCMA/8000", "101": "telephone-event/8000"}

// writeSDP writes a session description as Asterisk does.
func writeSDP(session, version uint64, origin, conn string, port int, payloads []string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "v=0\r\no=- %d %d IN IP4 %s\r\ns=Asterisk\r\nc=IN IP4 %s\r\nt=0 0\r\nm=audio %d RTP/AVP %s\r\n",
		session, version, origin, conn, port, strings.Join(payloads, " "))
	for _, pt := range payloads {
		fmt.Fprintf(&b, "a=rtpmap:%s %s\r\n", pt, rtpmap[pt])
	}
	if slices.Contains(payloads, "101") {
		b.WriteString("a=fmtp:101 0-16\r\n")
	}
	b.WriteString("a=ptime:20\r\na=maxptime:140\r\na=sendrecv\r\n")
	return b.String()
}
