package keeper

import (
	"encoding/binary"
	"fmt"
	"net/netip"

	"golang.org/x/sys/unix"
)

// RawSender sends UDP datagrams whose source is the floating address and
// the PBX's SIP port. The PBX owns that port, so no UDP socket can bind
// it; a raw IPv4 socket (IPPROTO_RAW: the keeper writes the IP header
// itself, and the socket receives nothing) sends a datagram built by hand
// instead. It needs CAP_NET_RAW, which the ipmover has for its ARP.
type RawSender struct {
	fd int
}

// OpenRawSender opens the socket; inNS runs the opening in the namespace
// whose routes it must use (nil: this one).
func OpenRawSender(inNS func(func() error) error) (*RawSender, error) {
	if inNS == nil {
		inNS = func(f func() error) error { return f() }
	}
	s := &RawSender{fd: -1}
	err := inNS(func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_RAW)
		if err != nil {
			return err
		}
		s.fd = fd
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("raw IPv4 socket (needs CAP_NET_RAW): %w", err)
	}
	return s, nil
}

// Close closes the socket.
func (s *RawSender) Close() error { return unix.Close(s.fd) }

// SendUDP sends payload from src to dst. It never blocks: a full socket
// buffer is an error, and the retransmission timer sends again.
func (s *RawSender) SendUDP(src, dst netip.AddrPort, payload []byte) error {
	pkt, err := udpPacket(src, dst, payload)
	if err != nil {
		return err
	}
	if err := unix.Sendto(s.fd, pkt, unix.MSG_DONTWAIT, &unix.SockaddrInet4{Addr: dst.Addr().As4()}); err != nil {
		return fmt.Errorf("send %d bytes to %s: %w", len(pkt), dst, err)
	}
	return nil
}

// udpPacket builds an IPv4 packet carrying one UDP datagram: no options,
// don't-fragment set (a BYE is far below any MTU), TTL 64, the identifier
// left to the kernel (it fills a zero one in), both checksums computed.
func udpPacket(src, dst netip.AddrPort, payload []byte) ([]byte, error) {
	if !src.Addr().Is4() || !dst.Addr().Is4() {
		return nil, fmt.Errorf("udp %s -> %s: IPv4 only", src, dst)
	}
	const ipLen, udpLen = 20, 8
	total := ipLen + udpLen + len(payload)
	if total > 0xffff {
		return nil, fmt.Errorf("udp %s -> %s: %d bytes", src, dst, total)
	}
	b := make([]byte, total)
	s4, d4 := src.Addr().As4(), dst.Addr().As4()
	b[0] = 0x45 // version 4, header of 5 words
	binary.BigEndian.PutUint16(b[2:4], uint16(total))
	binary.BigEndian.PutUint16(b[6:8], 0x4000) // don't fragment
	b[8] = 64
	b[9] = unix.IPPROTO_UDP
	copy(b[12:16], s4[:])
	copy(b[16:20], d4[:])
	binary.BigEndian.PutUint16(b[10:12], ^checksum(b[:ipLen], 0))

	u := b[ipLen:]
	binary.BigEndian.PutUint16(u[0:2], src.Port())
	binary.BigEndian.PutUint16(u[2:4], dst.Port())
	binary.BigEndian.PutUint16(u[4:6], uint16(udpLen+len(payload)))
	copy(u[udpLen:], payload)
	// RFC 768: the one's complement sum over a pseudo-header (addresses,
	// protocol, UDP length) and the datagram; a computed zero is sent as
	// all ones, zero meaning "no checksum".
	sum := checksum(u, pseudoHeaderSum(s4, d4, len(u)))
	cs := ^sum
	if cs == 0 {
		cs = 0xffff
	}
	binary.BigEndian.PutUint16(u[6:8], cs)
	return b, nil
}

func pseudoHeaderSum(src, dst [4]byte, udpLength int) uint32 {
	var s uint32
	s += uint32(binary.BigEndian.Uint16(src[0:2])) + uint32(binary.BigEndian.Uint16(src[2:4]))
	s += uint32(binary.BigEndian.Uint16(dst[0:2])) + uint32(binary.BigEndian.Uint16(dst[2:4]))
	s += unix.IPPROTO_UDP + uint32(udpLength)
	return s
}

// checksum is the Internet checksum's folded one's complement sum of b
// (odd length padded with a zero byte) added to initial, not complemented:
// over a header that carries its checksum it is 0xffff, which the caller
// tests as ^checksum == 0.
func checksum(b []byte, initial uint32) uint16 {
	s := initial
	for len(b) >= 2 {
		s += uint32(binary.BigEndian.Uint16(b))
		b = b[2:]
	}
	if len(b) == 1 {
		s += uint32(b[0]) << 8
	}
	for s > 0xffff {
		s = (s >> 16) + (s & 0xffff)
	}
	return uint16(s)
}
