package pbxstandin

import (
	"net"
	"strconv"
	"strings"

	"github.com/fanpbx/fan/lab/amipeer"
)

// Which socket a message leaves from and which address it names, as
// Asterisk 22 chooses them (docs/asterisk22.md, "Which address dialogs
// carry" and "Calls: a B2BUA"): an answer leaves from the socket its
// request arrived on; a request the PBX starts leaves from the transport
// bound to the address the kernel picks as the source towards the phone
// (the node's own, also when the phone called the floating address); the
// Contact, Via and SDP name that transport's external_signaling_address
// and external_media_address when set and the phone is outside its
// local_net, else its own address.

// transport is one bound SIP socket and the pjsip.conf transport it is.
type transport struct {
	conn      *net.UDPConn
	addr      *net.UDPAddr
	extSignal string
	extMedia  string
	localNets []*net.IPNet
}

// transportsFor pairs the bound sockets with their pjsip.conf transports
// (by bind address; a socket with none has no external addresses).
func transportsFor(conns []*net.UDPConn, configured []amipeer.Transport) []transport {
	var out []transport
	for _, c := range conns {
		a := c.LocalAddr().(*net.UDPAddr)
		t := transport{conn: c, addr: a}
		for _, ct := range configured {
			if ct.Protocol != "" && ct.Protocol != "udp" {
				continue
			}
			bind := ct.Bind
			if _, _, err := net.SplitHostPort(bind); err != nil {
				bind = net.JoinHostPort(bind, "5060")
			}
			if ba, err := net.ResolveUDPAddr("udp", bind); err == nil && ba.Port == a.Port && ba.IP.Equal(a.IP) {
				t.extSignal, t.extMedia = hostOnly(ct.ExternalSignalingAddress), hostOnly(ct.ExternalMediaAddress)
				t.localNets = parseNets(ct.LocalNet)
			}
		}
		out = append(out, t)
	}
	return out
}

func hostOnly(a string) string {
	if h, _, err := net.SplitHostPort(a); err == nil {
		return h
	}
	return a
}

func parseNets(v string) []*net.IPNet {
	var out []*net.IPNet
	for _, s := range strings.Split(v, ",") {
		if _, n, err := net.ParseCIDR(strings.TrimSpace(s)); err == nil {
			out = append(out, n)
		}
	}
	return out
}

// external says whether the transport's external addresses apply to dest.
func (t transport) external(dest net.IP) bool {
	for _, n := range t.localNets {
		if n.Contains(dest) {
			return false
		}
	}
	return true
}

// ownIP is the transport's address, or the kernel's source towards dest
// when it is bound to every address.
func (t transport) ownIP(dest *net.UDPAddr) string {
	if !t.addr.IP.IsUnspecified() {
		return t.addr.IP.String()
	}
	return sourceIP(dest).String()
}

// signalHostPort is what Contact and Via name for dest.
func (t transport) signalHostPort(dest *net.UDPAddr) string {
	host := t.ownIP(dest)
	if t.extSignal != "" && t.external(dest.IP) {
		host = t.extSignal
	}
	return net.JoinHostPort(host, strconv.Itoa(t.addr.Port))
}

// mediaHost rewrites an SDP connection address for dest as Asterisk
// does: every address, the other phone's in a direct-media re-INVITE
// included, becomes external_media_address when it applies.
func (t transport) mediaHost(dest *net.UDPAddr, addr string) string {
	if t.extMedia != "" && t.external(dest.IP) {
		return t.extMedia
	}
	return addr
}

// sourceIP is the address the kernel sends from towards dest (a connected
// UDP socket sends nothing).
func sourceIP(dest *net.UDPAddr) net.IP {
	c, err := net.DialUDP("udp", nil, dest)
	if err != nil {
		return net.IPv4zero
	}
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).IP
}

// requestTransport is the transport a request to dest leaves from.
func requestTransport(ts []transport, dest *net.UDPAddr) (transport, bool) {
	if len(ts) == 0 {
		return transport{}, false
	}
	src := sourceIP(dest)
	for _, t := range ts {
		if t.addr.IP.Equal(src) {
			return t, true
		}
	}
	for _, t := range ts {
		if t.addr.IP.IsUnspecified() {
			return t, true
		}
	}
	return ts[0], true
}
