package phone

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// Direction is an SDP media direction attribute (RFC 3264 §5.1): what the
// side that wrote it does.
type Direction string

const (
	SendRecv Direction = "sendrecv"
	SendOnly Direction = "sendonly" // on hold: it sends (music), does not listen
	RecvOnly Direction = "recvonly"
	Inactive Direction = "inactive"
)

// reverse is the direction an answer takes to an offer of d.
func (d Direction) reverse() Direction {
	switch d {
	case SendOnly:
		return RecvOnly
	case RecvOnly:
		return SendOnly
	}
	return d
}

func (d Direction) sends() bool    { return d == SendRecv || d == SendOnly }
func (d Direction) receives() bool { return d == SendRecv || d == RecvOnly }

// sdpMedia is what the phone reads from a session description: where the
// audio goes, in which direction, and whether PCMU was accepted.
type sdpMedia struct {
	addr      netip.AddrPort // zero port or unspecified address: no audio
	direction Direction
	pcmu      bool
}

// pcmuPayload is PCMU's static RTP payload type.
const pcmuPayload = 0

// buildSDP is the phone's description: one audio stream of PCMU at 20 ms.
func buildSDP(sessID, version uint64, addr netip.AddrPort, dir Direction) []byte {
	ip := addr.Addr().String()
	return fmt.Appendf(nil, "v=0\r\no=fan-phone %d %d IN IP4 %s\r\ns=fan-phone\r\nc=IN IP4 %s\r\nt=0 0\r\n"+
		"m=audio %d RTP/AVP %d\r\na=rtpmap:%d PCMU/8000\r\na=ptime:20\r\na=%s\r\n",
		sessID, version, ip, ip, addr.Port(), pcmuPayload, pcmuPayload, dir)
}

// parseSDP reads the first audio stream of a description: its connection
// address (media level over session level), port, direction (media level
// over session level, sendrecv by default; the old hold form c=0.0.0.0
// reads as inactive) and whether PCMU is among its formats.
func parseSDP(body []byte) (sdpMedia, error) {
	var (
		sessAddr, mediaAddr netip.Addr
		sessDir, mediaDir   Direction
		port                int
		inAudio, seenAudio  bool
		pcmu                bool
	)
	for _, l := range strings.Split(strings.ReplaceAll(string(body), "\r\n", "\n"), "\n") {
		l = strings.TrimSpace(l)
		if len(l) < 2 || l[1] != '=' {
			continue
		}
		v := l[2:]
		switch l[0] {
		case 'm':
			f := strings.Fields(v)
			if inAudio || seenAudio || len(f) < 4 || f[0] != "audio" {
				inAudio = false
				continue
			}
			inAudio, seenAudio = true, true
			p, err := strconv.Atoi(f[1])
			if err != nil || p < 0 || p > 65535 {
				return sdpMedia{}, fmt.Errorf("sdp: m= port %q", f[1])
			}
			port = p
			for _, pt := range f[3:] {
				if pt == strconv.Itoa(pcmuPayload) {
					pcmu = true
				}
			}
		case 'c':
			f := strings.Fields(v)
			if len(f) != 3 || f[0] != "IN" || f[1] != "IP4" {
				continue
			}
			a, err := netip.ParseAddr(strings.Split(f[2], "/")[0])
			if err != nil {
				return sdpMedia{}, fmt.Errorf("sdp: c= address %q", f[2])
			}
			if inAudio {
				mediaAddr = a
			} else if !seenAudio {
				sessAddr = a
			}
		case 'a':
			switch d := Direction(v); d {
			case SendRecv, SendOnly, RecvOnly, Inactive:
				if inAudio {
					mediaDir = d
				} else if !seenAudio {
					sessDir = d
				}
			}
		}
	}
	if !seenAudio {
		return sdpMedia{}, fmt.Errorf("sdp: no audio stream")
	}
	addr := mediaAddr
	if !addr.IsValid() {
		addr = sessAddr
	}
	if !addr.IsValid() {
		return sdpMedia{}, fmt.Errorf("sdp: no connection address")
	}
	dir := mediaDir
	if dir == "" {
		dir = sessDir
	}
	if dir == "" {
		dir = SendRecv
	}
	if addr.IsUnspecified() {
		dir = Inactive
	}
	return sdpMedia{addr: netip.AddrPortFrom(addr, uint16(port)), direction: dir, pcmu: pcmu}, nil
}
