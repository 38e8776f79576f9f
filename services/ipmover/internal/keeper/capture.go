package keeper

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/mdlayher/packet"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// Capture reads the UDP datagrams of one SIP port on an interface: the
// phones' requests and answers arriving at the floating address's port,
// and what leaves the port (the PBX's answers, from whichever of the
// node's addresses it sends). It is an
// AF_PACKET socket of kind SOCK_DGRAM (the network header first) for every
// protocol, which is what makes outgoing packets visible too; the kernel
// runs Filter on each packet, so only those datagrams are queued to it.
type Capture struct {
	conn *packet.Conn
	addr netip.AddrPort
	buf  []byte
}

// captureBuffer is the socket's receive buffer: a burst of registrations
// to the PBX must not push a BYE out of it.
const captureBuffer = 1 << 20

// OpenCapture opens the capture of addr on the interface ifname. inNS runs
// the opening in the namespace the interface lives in (nil: this one).
func OpenCapture(ifname string, addr netip.AddrPort, inNS func(func() error) error) (*Capture, error) {
	prog, err := Filter(addr)
	if err != nil {
		return nil, err
	}
	if inNS == nil {
		inNS = func(f func() error) error { return f() }
	}
	c := &Capture{addr: addr, buf: make([]byte, maxMessage+60)}
	err = inNS(func() error {
		ifi, err := net.InterfaceByName(ifname)
		if err != nil {
			return fmt.Errorf("interface %s: %w", ifname, err)
		}
		// The filter is attached before the socket is bound (packet.Listen
		// opens it for no protocol first), so nothing unfiltered is queued.
		c.conn, err = packet.Listen(ifi, packet.Datagram, unix.ETH_P_ALL, &packet.Config{Filter: prog})
		if err != nil {
			return fmt.Errorf("packet socket on %s: %w", ifname, err)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("capture SIP on %s: %w", addr, err)
	}
	if rc, err := c.conn.SyscallConn(); err == nil {
		_ = rc.Control(func(fd uintptr) {
			_ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, captureBuffer)
		})
	}
	return c, nil
}

// Close closes the socket.
func (c *Capture) Close() error { return c.conn.Close() }

// Read delivers each datagram until ctx ends. deliver runs on the reading
// goroutine; the payload it gets is valid only during the call.
func (c *Capture) Read(ctx context.Context, deliver func(Packet)) error {
	stop := context.AfterFunc(ctx, func() { _ = c.conn.SetReadDeadline(time.Now()) })
	defer stop()
	for {
		n, _, err := c.conn.ReadFrom(c.buf)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return fmt.Errorf("read capture of %s: %w", c.addr, err)
		}
		if p, ok := decodeIPv4UDP(c.buf[:n]); ok {
			deliver(p)
		}
	}
}

// Filter is the classic BPF program of a capture: IPv4, UDP, the first
// fragment (or the whole datagram), and either to addr's address and port
// (the phones' requests and answers) or from addr's port at any address
// (the PBX's answers: Asterisk sends from the node's own address even on
// the transport of the floating address, docs/asterisk22.md). Any other
// packet is dropped in the kernel.
func Filter(addr netip.AddrPort) ([]bpf.RawInstruction, error) {
	if !addr.Addr().Is4() {
		return nil, fmt.Errorf("capture of %s: IPv4 only", addr)
	}
	a4 := addr.Addr().As4()
	ip, port := binary.BigEndian.Uint32(a4[:]), uint32(addr.Port())
	const (
		accept = 0x40000 // the whole packet
		drop   = 0
	)
	prog := []bpf.Instruction{
		/* 0 */ bpf.LoadAbsolute{Off: 0, Size: 1},
		/* 1 */ bpf.ALUOpConstant{Op: bpf.ALUOpAnd, Val: 0xf0},
		/* 2 */ bpf.JumpIf{Cond: bpf.JumpEqual, Val: 0x40, SkipFalse: 12}, // IPv4, else drop (15)
		/* 3 */ bpf.LoadAbsolute{Off: 9, Size: 1},
		/* 4 */ bpf.JumpIf{Cond: bpf.JumpEqual, Val: unix.IPPROTO_UDP, SkipFalse: 10}, // UDP, else drop
		/* 5 */ bpf.LoadAbsolute{Off: 6, Size: 2},
		/* 6 */ bpf.JumpIf{Cond: bpf.JumpBitsSet, Val: 0x1fff, SkipTrue: 8}, // a later fragment: drop
		/* 7 */ bpf.LoadMemShift{Off: 0}, // X = the IP header's length
		/* 8 */ bpf.LoadAbsolute{Off: 16, Size: 4},
		/* 9 */ bpf.JumpIf{Cond: bpf.JumpEqual, Val: ip, SkipFalse: 2}, // to addr? else look at the source port (12)
		/* 10 */ bpf.LoadIndirect{Off: 2, Size: 2},
		/* 11 */ bpf.JumpIf{Cond: bpf.JumpEqual, Val: port, SkipTrue: 2}, // to its port: accept (14)
		/* 12 */ bpf.LoadIndirect{Off: 0, Size: 2},
		/* 13 */ bpf.JumpIf{Cond: bpf.JumpEqual, Val: port, SkipFalse: 1}, // from the SIP port: accept, else drop
		/* 14 */ bpf.RetConstant{Val: accept},
		/* 15 */ bpf.RetConstant{Val: drop},
	}
	return bpf.Assemble(prog)
}

// decodeIPv4UDP reads an IPv4 packet carrying UDP. The IP header's checksum
// is checked (the stack computes it for every packet it sends, and a
// received packet failing it never reaches the PBX); the UDP checksum is
// not: a packet handed between namespaces or to an offloading NIC may carry
// one the hardware completes later.
func decodeIPv4UDP(b []byte) (Packet, bool) {
	if len(b) < 20 || b[0]>>4 != 4 || b[9] != unix.IPPROTO_UDP {
		return Packet{}, false
	}
	ihl := int(b[0]&0x0f) * 4
	total := int(binary.BigEndian.Uint16(b[2:4]))
	if ihl < 20 || len(b) < ihl+8 || total < ihl+8 || ^checksum(b[:ihl], 0) != 0 {
		return Packet{}, false
	}
	if total < len(b) {
		b = b[:total] // Ethernet padding
	}
	src := netip.AddrFrom4([4]byte(b[12:16]))
	dst := netip.AddrFrom4([4]byte(b[16:20]))
	u := b[ihl:]
	sport, dport := binary.BigEndian.Uint16(u[0:2]), binary.BigEndian.Uint16(u[2:4])
	ulen := int(binary.BigEndian.Uint16(u[4:6]))
	payload := u[8:]
	if ulen >= 8 && ulen-8 < len(payload) {
		payload = payload[:ulen-8]
	}
	return Packet{Src: netip.AddrPortFrom(src, sport), Dst: netip.AddrPortFrom(dst, dport), Payload: payload}, true
}
