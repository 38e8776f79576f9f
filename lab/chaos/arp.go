package chaos

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"syscall"
	"time"

	"github.com/fanpbx/fan/lab/netlab"
)

// ARP over a raw AF_PACKET socket from the standard library: the observer
// needs exactly two frame shapes, and staying on syscall keeps the lab
// module's dependencies as they are (every module that requires lab would
// otherwise carry them).

const (
	ethPARP   = 0x0806
	ethPIPv4  = 0x0800
	arpLen    = 28
	ethHdrLen = 14
	opRequest = 1
	opReply   = 2
)

var broadcastMAC = net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// arpPacket is the IPv4-over-Ethernet ARP body with the frame's addresses.
type arpPacket struct {
	EthDst, EthSrc net.HardwareAddr
	Op             uint16
	SHA            net.HardwareAddr
	SPA            netip.Addr
	THA            net.HardwareAddr
	TPA            netip.Addr
}

// request builds a broadcast who-has frame for target from (mac, ip).
func request(mac net.HardwareAddr, ip, target netip.Addr) []byte {
	b := make([]byte, ethHdrLen+arpLen)
	copy(b[0:6], broadcastMAC)
	copy(b[6:12], mac)
	binary.BigEndian.PutUint16(b[12:14], ethPARP)
	a := b[ethHdrLen:]
	binary.BigEndian.PutUint16(a[0:2], 1) // Ethernet
	binary.BigEndian.PutUint16(a[2:4], ethPIPv4)
	a[4], a[5] = 6, 4
	binary.BigEndian.PutUint16(a[6:8], opRequest)
	copy(a[8:14], mac)
	ip4 := ip.As4()
	copy(a[14:18], ip4[:])
	// THA stays zero: unknown, which is what is being asked.
	t4 := target.As4()
	copy(a[24:28], t4[:])
	return b
}

var errNotARP = errors.New("not an IPv4-over-Ethernet ARP frame")

// parseARP decodes a frame read from the packet socket.
func parseARP(b []byte) (arpPacket, error) {
	if len(b) < ethHdrLen+arpLen || binary.BigEndian.Uint16(b[12:14]) != ethPARP {
		return arpPacket{}, errNotARP
	}
	a := b[ethHdrLen:]
	if binary.BigEndian.Uint16(a[0:2]) != 1 || binary.BigEndian.Uint16(a[2:4]) != ethPIPv4 || a[4] != 6 || a[5] != 4 {
		return arpPacket{}, errNotARP
	}
	return arpPacket{
		EthDst: bytes.Clone(b[0:6]), EthSrc: bytes.Clone(b[6:12]),
		Op:  binary.BigEndian.Uint16(a[6:8]),
		SHA: bytes.Clone(a[8:14]), SPA: netip.AddrFrom4([4]byte(a[14:18])),
		THA: bytes.Clone(a[18:24]), TPA: netip.AddrFrom4([4]byte(a[24:28])),
	}, nil
}

// Sighting is one ARP frame that named the floating IP as its sender.
type Sighting struct {
	At  time.Time
	MAC string
	// Answer is true for a reply addressed to the client (to the observer's
	// request, or to the client kernel's own); false for an announcement
	// seen passively (gratuitous request or broadcast reply).
	Answer bool
}

// ARPObserver asks who has the floating IP every Interval from the client
// namespace and keeps every frame naming it as sender. The rounds are cut
// afterwards (Rounds), so the capture path does nothing but record.
type ARPObserver struct {
	Interval time.Duration

	fd      int
	ifindex int
	mac     net.HardwareAddr
	ip, vip netip.Addr

	mu        sync.Mutex
	sends     []time.Time
	sightings []Sighting
	sendErrs  int

	stop chan struct{}
	wg   sync.WaitGroup
}

// NewARPObserver opens the packet socket on the client host's eth0. The
// socket belongs to the client namespace for its whole life.
func NewARPObserver(l *netlab.Lab, interval time.Duration) (*ARPObserver, error) {
	c, err := l.Host(netlab.ClientHost)
	if err != nil {
		return nil, err
	}
	o := &ARPObserver{Interval: interval, ip: c.Addr.Addr(), vip: l.FloatingIP().Addr(), stop: make(chan struct{}), fd: -1}
	err = l.Do(netlab.ClientHost, func() error {
		ifi, err := net.InterfaceByName("eth0")
		if err != nil {
			return err
		}
		o.ifindex, o.mac = ifi.Index, ifi.HardwareAddr
		fd, err := syscall.Socket(syscall.AF_PACKET, syscall.SOCK_RAW, int(htons(ethPARP)))
		if err != nil {
			return fmt.Errorf("packet socket: %w", err)
		}
		if err := syscall.Bind(fd, &syscall.SockaddrLinklayer{Protocol: htons(ethPARP), Ifindex: ifi.Index}); err != nil {
			syscall.Close(fd)
			return fmt.Errorf("bind packet socket to eth0: %w", err)
		}
		// A read timeout lets the reader notice Stop without closing the fd
		// under a blocked read.
		tv := syscall.NsecToTimeval(int64(50 * time.Millisecond))
		if err := syscall.SetsockoptTimeval(fd, syscall.SOL_SOCKET, syscall.SO_RCVTIMEO, &tv); err != nil {
			syscall.Close(fd)
			return fmt.Errorf("packet socket timeout: %w", err)
		}
		o.fd = fd
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("arp observer on %s: %w", netlab.ClientHost, err)
	}
	return o, nil
}

// Start begins asking and listening.
func (o *ARPObserver) Start() {
	o.wg.Add(2)
	go o.read()
	go o.ask()
}

// Stop ends the observation and closes the socket.
func (o *ARPObserver) Stop() {
	select {
	case <-o.stop:
		return
	default:
	}
	close(o.stop)
	o.wg.Wait()
	syscall.Close(o.fd)
}

func (o *ARPObserver) ask() {
	defer o.wg.Done()
	frame := request(o.mac, o.ip, o.vip)
	to := &syscall.SockaddrLinklayer{Protocol: htons(ethPARP), Ifindex: o.ifindex, Halen: 6}
	copy(to.Addr[:], broadcastMAC)
	t := time.NewTicker(o.Interval)
	defer t.Stop()
	for {
		// The send time is taken before the send, so a reply can never be
		// timestamped before the round it answers.
		now := time.Now()
		err := syscall.Sendto(o.fd, frame, 0, to)
		o.mu.Lock()
		if err != nil {
			o.sendErrs++
		} else {
			o.sends = append(o.sends, now)
		}
		o.mu.Unlock()
		select {
		case <-o.stop:
			return
		case <-t.C:
		}
	}
}

func (o *ARPObserver) read() {
	defer o.wg.Done()
	buf := make([]byte, 1600)
	for {
		select {
		case <-o.stop:
			return
		default:
		}
		n, from, err := syscall.Recvfrom(o.fd, buf, 0)
		at := time.Now()
		if err != nil {
			continue // timeout (EAGAIN) or EINTR: look at stop again
		}
		if ll, ok := from.(*syscall.SockaddrLinklayer); ok && ll.Pkttype == syscall.PACKET_OUTGOING {
			continue // our own requests, and the client kernel's
		}
		p, err := parseARP(buf[:n])
		if err != nil || p.SPA != o.vip || bytes.Equal(p.SHA, o.mac) {
			continue
		}
		s := Sighting{At: at, MAC: p.SHA.String(),
			Answer: p.Op == opReply && bytes.Equal(p.EthDst, o.mac) && bytes.Equal(p.THA, o.mac)}
		o.mu.Lock()
		o.sightings = append(o.sightings, s)
		o.mu.Unlock()
	}
}

// Capture returns what was recorded so far.
func (o *ARPObserver) Capture() (sends []time.Time, sightings []Sighting, sendErrs int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]time.Time(nil), o.sends...), append([]Sighting(nil), o.sightings...), o.sendErrs
}
