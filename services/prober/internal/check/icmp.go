package check

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"
)

// ICMP modes: raw needs CAP_NET_RAW; unprivileged needs the process's group
// inside net.ipv4.ping_group_range; auto tries raw, then unprivileged.
const (
	ICMPAuto         = "auto"
	ICMPRaw          = "raw"
	ICMPUnprivileged = "unprivileged"
)

// ICMP sends one echo request per run and waits for the matching reply. It
// proves a host's kernel answers, not its PBX: use it for hosts and routers
// (a DNS site pings its servers), and in a quorum with deeper checks.
type ICMP struct {
	addr  netip.Addr
	mode  string
	id    int
	seq   atomic.Uint32
	token [8]byte
}

// NewICMP makes the check for an IP address.
func NewICMP(addr, mode string) (*ICMP, error) {
	a, err := netip.ParseAddr(addr)
	if err != nil {
		return nil, fmt.Errorf("icmp check: address %q: %w", addr, err)
	}
	c := &ICMP{addr: a.Unmap(), mode: mode}
	var idb [2]byte
	_, _ = rand.Read(idb[:])
	_, _ = rand.Read(c.token[:])
	c.id = int(idb[0])<<8 | int(idb[1])
	return c, nil
}

func (c *ICMP) Kind() string   { return "icmp" }
func (c *ICMP) Target() string { return c.addr.String() }

// listen opens the socket the mode asks for; it reports whether the kernel
// owns the echo identifier (unprivileged sockets rewrite it).
func (c *ICMP) listen() (*icmp.PacketConn, bool, error) {
	rawNet, dgramNet, laddr := "ip4:icmp", "udp4", "0.0.0.0"
	if c.addr.Is6() {
		rawNet, dgramNet, laddr = "ip6:ipv6-icmp", "udp6", "::"
	}
	if c.mode != ICMPUnprivileged {
		pc, err := icmp.ListenPacket(rawNet, laddr)
		if err == nil || c.mode == ICMPRaw {
			return pc, false, err
		}
		if !errors.Is(err, os.ErrPermission) && !errors.Is(err, syscall.EPERM) {
			return nil, false, err
		}
	}
	pc, err := icmp.ListenPacket(dgramNet, laddr)
	if err != nil {
		return nil, true, fmt.Errorf("unprivileged ping socket (is the group in net.ipv4.ping_group_range?): %w", err)
	}
	return pc, true, nil
}

func (c *ICMP) Run(ctx context.Context) Result {
	start := time.Now()
	err := c.ping(ctx)
	return finish(start, err)
}

func (c *ICMP) ping(ctx context.Context) error {
	pc, kernelID, err := c.listen()
	if err != nil {
		return fmt.Errorf("icmp: %w", err)
	}
	defer pc.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = pc.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { _ = pc.SetDeadline(time.Unix(1, 0)) })
	defer stop()

	seq := int(c.seq.Add(1) & 0xffff)
	var typ, reply icmp.Type = ipv4.ICMPTypeEcho, ipv4.ICMPTypeEchoReply
	proto := 1
	if c.addr.Is6() {
		typ, reply, proto = ipv6.ICMPTypeEchoRequest, ipv6.ICMPTypeEchoReply, 58
	}
	m := icmp.Message{Type: typ, Body: &icmp.Echo{ID: c.id, Seq: seq, Data: c.token[:]}}
	b, err := m.Marshal(nil)
	if err != nil {
		return fmt.Errorf("icmp: %w", err)
	}
	var dst net.Addr = &net.IPAddr{IP: c.addr.AsSlice()}
	if kernelID {
		dst = &net.UDPAddr{IP: c.addr.AsSlice()}
	}
	if _, err := pc.WriteTo(b, dst); err != nil {
		return fmt.Errorf("icmp echo to %s: %w", c.addr, err)
	}
	buf := make([]byte, 1500)
	for {
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			if ctx.Err() != nil {
				return fmt.Errorf("icmp echo to %s: no reply: %w", c.addr, ctx.Err())
			}
			return fmt.Errorf("icmp echo to %s: %w", c.addr, err)
		}
		if !sameIP(from, c.addr) {
			continue
		}
		rm, err := icmp.ParseMessage(proto, buf[:n])
		if err != nil || rm.Type != reply {
			continue
		}
		e, ok := rm.Body.(*icmp.Echo)
		if !ok || e.Seq != seq || !bytes.Equal(e.Data, c.token[:]) || (!kernelID && e.ID != c.id) {
			continue // someone else's ping, or an earlier one of ours
		}
		return nil
	}
}

func sameIP(a net.Addr, want netip.Addr) bool {
	var ip net.IP
	switch v := a.(type) {
	case *net.IPAddr:
		ip = v.IP
	case *net.UDPAddr:
		ip = v.IP
	default:
		return false
	}
	got, ok := netip.AddrFromSlice(ip)
	return ok && got.Unmap() == want
}

func (c *ICMP) Close() error { return nil }
