package phone

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"sort"
	"sync"
	"syscall"
	"time"
)

// The phone's audio: PCMU (G.711 µ-law, 8 kHz), one RTP packet of 160
// samples every 20 ms (RFC 3550, RFC 3551), sent from the port it
// receives on (symmetric RTP, which Asterisk's strictrtp learns), to
// wherever the current session description says. Every packet received
// is recorded with its arrival time (the kernel's, SO_TIMESTAMPNS) and
// sequence number, so a test can find the longest silence of one
// direction of a call.

const (
	packetInterval  = 20 * time.Millisecond
	samplesPerPkt   = 160
	rtpHeaderLen    = 12
	pcmuSilenceByte = 0xFF
	// maxArrivals bounds the record of one call's packets: 2^20 packets
	// are 5.8 hours at 50 a second. Past it arrivals are still counted and
	// the longest gap still followed, but no longer recorded one by one.
	maxArrivals = 1 << 20
	// stallOver is the pause between two sent packets (three times the
	// packet interval) that counts as the sender's own stall; maxStalls
	// bounds their record.
	stallOver = 60 * time.Millisecond
	maxStalls = 1 << 14
)

// arrival is one received packet.
type arrival struct {
	at  time.Time
	seq uint16
}

// media is one phone's RTP socket (and its RTCP neighbour, drained), the
// sender's state and the record of what arrived.
type media struct {
	rtp, rtcp *net.UDPConn
	local     netip.AddrPort

	mu       sync.Mutex
	target   netip.AddrPort
	sending  bool
	ssrc     uint32
	seq      uint16
	ts       uint32
	marker   bool
	sent     uint64
	started  time.Time // of this call's record
	arrivals []arrival
	received uint64
	lastAt   time.Time
	lastSeq  uint16
	lastFrom netip.AddrPort
	sources  map[netip.AddrPort]uint64
	longest  time.Duration
	longAt   time.Time
	seqGaps  int
	// lastSent and sendStall: the longest time between two packets the
	// phone sent, its own stall (a loaded machine's scheduling), which
	// its peer hears as a gap of the same length.
	lastSent  time.Time
	sendStall time.Duration
	// stalls are the sender's pauses longer than stallOver, at most
	// maxStalls of them: what a peer's gap at the same moment is owed to.
	stalls []Stall
}

// listenMedia binds an even RTP port and the RTCP port above it on ip
// (RFC 3550 §11). Port 0 picks a free pair.
func listenMedia(ip netip.Addr, port uint16) (*media, error) {
	try := func(p uint16) (*media, error) {
		rtp, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(ip, p)))
		if err != nil {
			return nil, err
		}
		rtcp, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(ip, p+1)))
		if err != nil {
			rtp.Close()
			return nil, err
		}
		if err := kernelTimestamps(rtp); err != nil {
			rtp.Close()
			rtcp.Close()
			return nil, err
		}
		return &media{rtp: rtp, rtcp: rtcp, local: netip.AddrPortFrom(ip, p), sources: map[netip.AddrPort]uint64{}}, nil
	}
	if port != 0 {
		return try(port)
	}
	var err error
	for range 64 {
		p := uint16(20000 + 2*rand.IntN(10000))
		var m *media
		if m, err = try(p); err == nil {
			return m, nil
		}
	}
	return nil, err
}

func (m *media) close() {
	m.rtp.Close()
	m.rtcp.Close()
}

// newCall starts a new stream (new SSRC, random first sequence number and
// timestamp, RFC 3550 §5.1) and a new record, and stops sending until a
// target is set.
func (m *media) newCall(now time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.target, m.sending = netip.AddrPort{}, false
	m.ssrc, m.seq, m.ts, m.marker = rand.Uint32(), uint16(rand.Uint32()), rand.Uint32(), true
	m.sent = 0
	m.started = now
	m.arrivals = nil
	m.received, m.lastAt, m.lastSeq, m.lastFrom = 0, time.Time{}, 0, netip.AddrPort{}
	m.sources = map[netip.AddrPort]uint64{}
	m.longest, m.longAt = 0, time.Time{}
	m.seqGaps = 0
	m.lastSent, m.sendStall, m.stalls = time.Time{}, 0, nil
}

// setTarget says where to send and whether to send at all.
func (m *media) setTarget(to netip.AddrPort, send bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.target = to
	m.sending = send && to.IsValid() && to.Port() != 0 && !to.Addr().IsUnspecified()
	if !m.sending {
		m.lastSent = time.Time{} // a pause in sending is no stall
	}
}

func (m *media) stop() { m.setTarget(netip.AddrPort{}, false) }

// sendLoop sends a packet every 20 ms while sending, until done closes.
// The timestamp advances with the clock whether or not a packet goes out,
// as a phone's sampling clock does; the sequence number with each packet.
func (m *media) sendLoop(done <-chan struct{}) {
	t := time.NewTicker(packetInterval)
	defer t.Stop()
	pkt := make([]byte, rtpHeaderLen+samplesPerPkt)
	for i := rtpHeaderLen; i < len(pkt); i++ {
		pkt[i] = pcmuSilenceByte
	}
	for {
		select {
		case <-done:
			return
		case <-t.C:
		}
		m.mu.Lock()
		m.ts += samplesPerPkt
		if !m.sending {
			m.mu.Unlock()
			continue
		}
		pkt[0] = 0x80 // version 2
		pkt[1] = pcmuPayload
		if m.marker {
			pkt[1] |= 0x80 // the first packet of a talkspurt
			m.marker = false
		}
		binary.BigEndian.PutUint16(pkt[2:], m.seq)
		binary.BigEndian.PutUint32(pkt[4:], m.ts)
		binary.BigEndian.PutUint32(pkt[8:], m.ssrc)
		m.seq++
		m.sent++
		now := time.Now()
		if !m.lastSent.IsZero() {
			d := now.Sub(m.lastSent)
			m.sendStall = max(m.sendStall, d)
			if d > stallOver && len(m.stalls) < maxStalls {
				m.stalls = append(m.stalls, Stall{From: m.lastSent, To: now})
			}
		}
		m.lastSent = now
		to := m.target
		m.mu.Unlock()
		_, _ = m.rtp.WriteToUDPAddrPort(pkt, to)
	}
}

// kernelTimestamps asks the kernel to stamp each datagram as it arrives
// (SO_TIMESTAMPNS): a packet's time is then when it reached the phone,
// not when the phone's reader next ran.
func kernelTimestamps(c *net.UDPConn) error {
	raw, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := raw.Control(func(fd uintptr) {
		serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_TIMESTAMPNS, 1)
	}); err != nil {
		return err
	}
	if serr != nil {
		return fmt.Errorf("SO_TIMESTAMPNS: %w", serr)
	}
	return nil
}

// arrivedAt is the kernel's receive time in oob, or now without one.
func arrivedAt(oob []byte) time.Time {
	msgs, err := syscall.ParseSocketControlMessage(oob)
	if err == nil {
		for _, c := range msgs {
			if c.Header.Level == syscall.SOL_SOCKET && c.Header.Type == syscall.SCM_TIMESTAMPNS && len(c.Data) >= 16 {
				sec := int64(binary.NativeEndian.Uint64(c.Data[0:8]))
				nsec := int64(binary.NativeEndian.Uint64(c.Data[8:16]))
				return time.Unix(sec, nsec)
			}
		}
	}
	return time.Now()
}

// receiveLoop records every RTP packet until the socket closes.
func (m *media) receiveLoop() {
	buf := make([]byte, 2048)
	oob := make([]byte, 128)
	for {
		n, oobn, _, from, err := m.rtp.ReadMsgUDPAddrPort(buf, oob)
		if err != nil {
			if isClosed(err) {
				return
			}
			continue
		}
		if n < rtpHeaderLen || buf[0]>>6 != 2 {
			continue
		}
		m.record(arrivedAt(oob[:oobn]), binary.BigEndian.Uint16(buf[2:]), from)
	}
}

func (m *media) record(now time.Time, seq uint16, from netip.AddrPort) {
	m.mu.Lock()
	defer m.mu.Unlock()
	from = netip.AddrPortFrom(from.Addr().Unmap(), from.Port())
	ref := m.lastAt
	if ref.IsZero() {
		ref = m.started
	}
	if gap := now.Sub(ref); gap > m.longest {
		m.longest, m.longAt = gap, ref
	}
	if m.received > 0 && seq != m.lastSeq+1 {
		m.seqGaps++
	}
	m.received++
	m.lastAt, m.lastSeq, m.lastFrom = now, seq, from
	m.sources[from]++
	if len(m.arrivals) < maxArrivals {
		m.arrivals = append(m.arrivals, arrival{at: now, seq: seq})
	}
}

// drainRTCP reads and drops RTCP, so a PBX's reports find a port open.
func (m *media) drainRTCP() {
	buf := make([]byte, 2048)
	for {
		if _, _, err := m.rtcp.ReadFromUDPAddrPort(buf); err != nil && isClosed(err) {
			return
		}
	}
}

// RTPStats is what one phone received and sent in its current (or last)
// call.
type RTPStats struct {
	Sent, Received uint64
	// Last is when the last packet arrived, LastSeq its sequence number,
	// LastFrom where it came from.
	Last     time.Time
	LastSeq  uint16
	LastFrom netip.AddrPort
	// Sources counts packets by sender: the PBX while it anchors the
	// audio, the other phone once the media goes direct.
	Sources map[netip.AddrPort]uint64
	// Longest is the longest time without a packet since the call
	// started (its first packet counts from the start), and LongestAt
	// when it began.
	Longest   time.Duration
	LongestAt time.Time
	// SequenceGaps counts packets whose sequence number did not follow
	// the previous one's (loss or reordering).
	SequenceGaps int
	// Target is where the phone sends now (zero while it does not).
	Target netip.AddrPort
	// SendStall is the longest time between two packets the phone sent
	// while sending: its own stall (the machine's scheduling), which the
	// other phone hears as a gap as long.
	SendStall time.Duration
}

func (m *media) stats() RTPStats {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := RTPStats{Sent: m.sent, Received: m.received, Last: m.lastAt, LastSeq: m.lastSeq, LastFrom: m.lastFrom,
		Sources: make(map[netip.AddrPort]uint64, len(m.sources)), Longest: m.longest, LongestAt: m.longAt}
	for k, v := range m.sources {
		s.Sources[k] = v
	}
	s.SequenceGaps = m.seqGaps
	s.SendStall = m.sendStall
	if m.sending {
		s.Target = m.target
	}
	return s
}

// current is where the phone sends now (zero while it does not) and when
// the last packet arrived.
func (m *media) current() (target netip.AddrPort, last time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.sending {
		target = m.target
	}
	return target, m.lastAt
}

// Gap is the longest silence of one direction within a window.
type Gap struct {
	// Longest is the longest time without a packet between From and To,
	// the window's edges included: a stream that stopped in the window
	// has a gap that runs to To.
	Longest time.Duration
	// At is when the longest gap began; Packets how many arrived in the
	// window.
	At      time.Time
	Packets int
	// From and To are the window.
	From, To time.Time
}

// gap measures the window [from, to] of the recorded arrivals.
func (m *media) gap(from, to time.Time) Gap {
	m.mu.Lock()
	defer m.mu.Unlock()
	g := Gap{From: from, To: to}
	i := sort.Search(len(m.arrivals), func(i int) bool { return !m.arrivals[i].at.Before(from) })
	prev := from
	for ; i < len(m.arrivals) && !m.arrivals[i].at.After(to); i++ {
		if d := m.arrivals[i].at.Sub(prev); d > g.Longest {
			g.Longest, g.At = d, prev
		}
		prev = m.arrivals[i].at
		g.Packets++
	}
	if d := to.Sub(prev); d > g.Longest {
		g.Longest, g.At = d, prev
	}
	return g
}

// Stall is a pause of the sender between two packets it sent.
type Stall struct{ From, To time.Time }

// stallsBetween are the recorded stalls that overlap [from, to].
func (m *media) stallsBetween(from, to time.Time) []Stall {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []Stall
	for _, st := range m.stalls {
		if st.To.After(from) && st.From.Before(to) {
			out = append(out, st)
		}
	}
	return out
}

// gapsOver are every silence longer than over of what arrived between
// from and to, the window's edges included, in order.
func (m *media) gapsOver(from, to time.Time, over time.Duration) []Gap {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []Gap
	add := func(a, b time.Time, packets int) {
		if d := b.Sub(a); d > over {
			out = append(out, Gap{Longest: d, At: a, Packets: packets, From: from, To: to})
		}
	}
	i := sort.Search(len(m.arrivals), func(i int) bool { return !m.arrivals[i].at.Before(from) })
	prev, n := from, 0
	for ; i < len(m.arrivals) && !m.arrivals[i].at.After(to); i++ {
		add(prev, m.arrivals[i].at, n)
		prev = m.arrivals[i].at
		n++
	}
	add(prev, to, n)
	return out
}

// Unexplained is how much of g the stalls do not cover: the part of a
// silence the path, not the sender, is owed.
func (g Gap) Unexplained(stalls []Stall) time.Duration {
	end := g.At.Add(g.Longest)
	var covered time.Duration
	last := g.At // stalls do not overlap each other: each begins where a packet was sent
	for _, st := range stalls {
		a, b := st.From, st.To
		if a.Before(last) {
			a = last
		}
		if b.After(end) {
			b = end
		}
		if b.After(a) {
			covered += b.Sub(a)
			last = b
		}
	}
	return g.Longest - covered
}
