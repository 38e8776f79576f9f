// Package announce tells the LAN that a floating address has moved here:
// gratuitous ARP for IPv4 and unsolicited neighbour advertisements for IPv6,
// on a schedule that gets the first packet out at once and repeats enough to
// survive loss and caches that ignore one kind of packet.
//
// The kernel does not announce an address when it is added (arp_notify and
// ndisc_notify fire only on link-up or MAC change), so without these packets
// neighbours keep sending to the old holder's MAC until their cache expires.
package announce

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mdlayher/arp"
	"github.com/mdlayher/ethernet"
	"github.com/mdlayher/ndp"
	"github.com/mdlayher/packet"
	"github.com/vishvananda/netns"
)

// allNodes is ff02::1, where unsolicited advertisements go (RFC 4861 7.2.6).
var allNodes = netip.MustParseAddr("ff02::1")

// Stats counts what a Link sent. The counters only grow, so the service can
// export them as Prometheus counters.
type Stats struct {
	ARPRequests uint64 // gratuitous ARP requests sent
	ARPReplies  uint64 // gratuitous ARP replies sent
	NAs         uint64 // unsolicited neighbour advertisements sent
	Probes      uint64 // ARP probes sent
	SendErrors  uint64 // packets that could not be sent
}

// Link sends announcements out of one interface.
type Link struct {
	ifi *net.Interface
	ns  netns.NsHandle
	log *slog.Logger

	// arpConn is an AF_PACKET socket bound to no protocol: it can send
	// frames we build but receives nothing, so an idle holder does not
	// queue every ARP frame on the LAN into a buffer nobody reads.
	arpConn *packet.Conn

	ndpMu   sync.Mutex
	ndpConn *ndp.Conn // from the link-local address; nil if there is none usable

	arpReq, arpRep, nas, probes, sendErr atomic.Uint64
}

// Option adjusts a Link.
type Option func(*Link)

// WithNamespace opens the Link's sockets inside another network namespace
// (labs and tests). Sockets stay in the namespace they were created in.
func WithNamespace(ns netns.NsHandle) Option { return func(l *Link) { l.ns = ns } }

// Open prepares to announce on ifname. It opens the sockets now, so that
// the first packet of a failover costs only a write.
func Open(ifname string, log *slog.Logger, opts ...Option) (*Link, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	l := &Link{ns: netns.None(), log: log.With("component", "announce", "interface", ifname)}
	for _, o := range opts {
		o(l)
	}
	err := l.inNS(func() error {
		ifi, err := net.InterfaceByName(ifname)
		if err != nil {
			return fmt.Errorf("interface %s: %w", ifname, err)
		}
		if len(ifi.HardwareAddr) != 6 {
			return fmt.Errorf("announce: interface %s has no Ethernet address", ifname)
		}
		l.ifi = ifi
		l.arpConn, err = packet.Listen(ifi, packet.Raw, 0, nil)
		if err != nil {
			return fmt.Errorf("packet socket on %s: %w", ifname, err)
		}
		// IPv6 may be disabled, or the link-local address still tentative;
		// SendNA then falls back to sending from the floating address.
		c, _, err := ndp.Listen(ifi, ndp.LinkLocal)
		if err != nil {
			l.log.Info("no usable link-local address; advertisements will be sent from the floating address", "err", err)
		} else {
			l.ndpConn = c
		}
		return nil
	})
	if err != nil {
		l.Close()
		return nil, err
	}
	return l, nil
}

// HardwareAddr is the MAC the announcements carry.
func (l *Link) HardwareAddr() net.HardwareAddr { return l.ifi.HardwareAddr }

// Close closes the sockets.
func (l *Link) Close() error {
	var errs []error
	if l.arpConn != nil {
		errs = append(errs, l.arpConn.Close())
	}
	l.ndpMu.Lock()
	if l.ndpConn != nil {
		errs = append(errs, l.ndpConn.Close())
		l.ndpConn = nil
	}
	l.ndpMu.Unlock()
	return errors.Join(errs...)
}

// Stats returns the counters.
func (l *Link) Stats() Stats {
	return Stats{
		ARPRequests: l.arpReq.Load(),
		ARPReplies:  l.arpRep.Load(),
		NAs:         l.nas.Load(),
		Probes:      l.probes.Load(),
		SendErrors:  l.sendErr.Load(),
	}
}

// SendGARP broadcasts one gratuitous ARP for ip: sender and target protocol
// address are both ip, sender hardware address is the interface's MAC. A
// reply carries our MAC as target hardware address too, because Linux only
// treats a reply as gratuitous (and overrides a recently confirmed entry)
// when target and sender hardware addresses match; a request carries zeros
// there, as RFC 5227 asks.
func (l *Link) SendGARP(ip netip.Addr, reply bool) error {
	if !ip.Is4() {
		return fmt.Errorf("announce: gratuitous ARP for non-IPv4 address %v", ip)
	}
	op, tha, ctr := arp.OperationRequest, net.HardwareAddr{0, 0, 0, 0, 0, 0}, &l.arpReq
	if reply {
		op, tha, ctr = arp.OperationReply, l.ifi.HardwareAddr, &l.arpRep
	}
	if err := l.sendARP(op, ip, tha, ip); err != nil {
		l.sendErr.Add(1)
		return fmt.Errorf("gratuitous ARP %v for %v on %s: %w", op, ip, l.ifi.Name, err)
	}
	ctr.Add(1)
	return nil
}

func (l *Link) sendARP(op arp.Operation, senderIP netip.Addr, tha net.HardwareAddr, targetIP netip.Addr) error {
	p, err := arp.NewPacket(op, l.ifi.HardwareAddr, senderIP, tha, targetIP)
	if err != nil {
		return err
	}
	pb, err := p.MarshalBinary()
	if err != nil {
		return err
	}
	f := ethernet.Frame{
		Destination: ethernet.Broadcast,
		Source:      l.ifi.HardwareAddr,
		EtherType:   ethernet.EtherTypeARP,
		Payload:     pb,
	}
	fb, err := f.MarshalBinary()
	if err != nil {
		return err
	}
	_, err = l.arpConn.WriteTo(fb, &packet.Addr{HardwareAddr: ethernet.Broadcast})
	return err
}

// SendNA sends one unsolicited neighbour advertisement for ip to all nodes:
// Override set so neighbours replace the old holder's MAC, Solicited clear
// (receivers must drop a solicited advertisement sent to multicast), and the
// target link-layer address option carrying our MAC.
func (l *Link) SendNA(ip netip.Addr) error {
	if !ip.Is6() || ip.Is4In6() {
		return fmt.Errorf("announce: neighbour advertisement for non-IPv6 address %v", ip)
	}
	na := &ndp.NeighborAdvertisement{
		Override:      true,
		TargetAddress: ip,
		Options: []ndp.Option{&ndp.LinkLayerAddress{
			Direction: ndp.Target,
			Addr:      l.ifi.HardwareAddr,
		}},
	}
	l.ndpMu.Lock()
	c := l.ndpConn
	l.ndpMu.Unlock()
	var err error
	if c != nil {
		if err = c.WriteTo(na, nil, allNodes); err == nil {
			l.nas.Add(1)
			return nil
		}
	}
	// Fall back to the floating address as source: it was added without
	// DAD, so it is usable the moment it is on the interface.
	if ferr := l.sendNAFrom(na, ip); ferr != nil {
		l.sendErr.Add(1)
		return fmt.Errorf("neighbour advertisement for %v on %s: %w", ip, l.ifi.Name, errors.Join(err, ferr))
	}
	l.nas.Add(1)
	return nil
}

func (l *Link) sendNAFrom(na *ndp.NeighborAdvertisement, src netip.Addr) error {
	var c *ndp.Conn
	err := l.inNS(func() error {
		var err error
		c, _, err = ndp.Listen(l.ifi, ndp.Addr(src.String()))
		return err
	})
	if err != nil {
		return err
	}
	defer c.Close()
	return c.WriteTo(na, nil, allNodes)
}

// Probe asks who has ip the way RFC 5227 probes do (sender protocol address
// 0.0.0.0, so no neighbour learns anything from the question) and reports
// the MAC of another host that answers within wait. A claim can use it to
// refuse to create a second holder when the previous one is not known to be
// fenced. The probe is sent twice, at the start and half way, so one lost
// frame does not read as "nobody has it".
func (l *Link) Probe(ctx context.Context, ip netip.Addr, wait time.Duration) (net.HardwareAddr, bool, error) {
	if !ip.Is4() {
		return nil, false, fmt.Errorf("announce: ARP probe for non-IPv4 address %v", ip)
	}
	if err := ctx.Err(); err != nil {
		return nil, false, err
	}
	var rc *packet.Conn
	err := l.inNS(func() error {
		var err error
		rc, err = packet.Listen(l.ifi, packet.Raw, int(ethernet.EtherTypeARP), nil)
		return err
	})
	if err != nil {
		return nil, false, fmt.Errorf("probe socket on %s: %w", l.ifi.Name, err)
	}
	defer rc.Close()

	deadline := time.Now().Add(wait)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	if err := rc.SetReadDeadline(deadline); err != nil {
		return nil, false, fmt.Errorf("probe deadline: %w", err)
	}
	stopCancel := context.AfterFunc(ctx, func() { rc.SetReadDeadline(time.Now()) })
	defer stopCancel()

	zeroMAC := net.HardwareAddr{0, 0, 0, 0, 0, 0}
	probe := func() error {
		if err := l.sendARP(arp.OperationRequest, netip.IPv4Unspecified(), zeroMAC, ip); err != nil {
			l.sendErr.Add(1)
			return fmt.Errorf("ARP probe for %v on %s: %w", ip, l.ifi.Name, err)
		}
		l.probes.Add(1)
		return nil
	}
	if err := probe(); err != nil {
		return nil, false, err
	}
	again := time.AfterFunc(wait/2, func() {
		if err := probe(); err != nil {
			l.log.Warn("second ARP probe", "err", err)
		}
	})
	defer again.Stop()

	buf := make([]byte, 1500)
	for {
		n, _, err := rc.ReadFrom(buf)
		if err != nil {
			if errors.Is(err, context.Canceled) || ctx.Err() != nil {
				return nil, false, ctx.Err()
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				return nil, false, nil
			}
			return nil, false, fmt.Errorf("read ARP on %s: %w", l.ifi.Name, err)
		}
		var f ethernet.Frame
		if f.UnmarshalBinary(buf[:n]) != nil || f.EtherType != ethernet.EtherTypeARP {
			continue
		}
		var p arp.Packet
		if p.UnmarshalBinary(f.Payload) != nil {
			continue
		}
		// Anyone else using ip as its own address, whether answering us
		// or announcing itself, holds it.
		if p.SenderIP == ip && p.SenderHardwareAddr.String() != l.ifi.HardwareAddr.String() {
			return p.SenderHardwareAddr, true, nil
		}
	}
}

// inNS runs fn in the Link's namespace. Entering a namespace changes the
// calling OS thread, so fn runs on a dedicated locked thread that is never
// unlocked: the runtime discards it afterwards instead of reusing a thread
// left in a foreign namespace.
func (l *Link) inNS(fn func() error) error {
	if !l.ns.IsOpen() {
		return fn()
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := netns.Set(l.ns); err != nil {
			errc <- fmt.Errorf("enter namespace: %w", err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}
