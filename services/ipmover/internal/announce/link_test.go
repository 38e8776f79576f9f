package announce

import (
	"context"
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/mdlayher/arp"
	"github.com/mdlayher/ethernet"
	"github.com/mdlayher/packet"
	"github.com/vishvananda/netlink"

	"github.com/fanpbx/fan/lab/netlab/netlabtest"
	"github.com/fanpbx/fan/pkg/platform/waittest"
)

// staleMAC is what the peer believes before the announcement: the old holder.
const staleMAC = "02:00:5e:00:00:99"

type lan struct {
	pair *netlabtest.Pair
	link *Link
	nlB  *netlink.Handle
}

// newLAN builds node A (vip0) and a client B (peer0) on one segment, with a
// Link on A. B has an address of its own so its ARP/NDP stack is active.
func newLAN(t testing.TB) *lan {
	t.Helper()
	p := netlabtest.NewPair(t, "fanann", "vip0", "peer0")
	p.B.IP(t, "addr", "add", "192.0.2.2/24", "dev", "peer0")
	p.B.IP(t, "addr", "add", "2001:db8::2/64", "dev", "peer0")
	l, err := Open("vip0", nil, WithNamespace(p.A.Handle))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	if l.HardwareAddr().String() != p.MACA.String() {
		t.Fatalf("link MAC %v, interface MAC %v", l.HardwareAddr(), p.MACA)
	}
	return &lan{pair: p, link: l, nlB: p.B.Netlink(t)}
}

// prime makes B believe ip is at staleMAC, as after the previous holder.
func (n *lan) prime(t *testing.T, ip netip.Addr) {
	t.Helper()
	n.pair.B.IP(t, "neigh", "replace", ip.String(), "lladdr", staleMAC, "dev", "peer0", "nud", "stale")
	if got := n.neigh(t, ip); got != staleMAC {
		t.Fatalf("priming failed: B has %q for %v", got, ip)
	}
}

// neigh is B's current MAC for ip, or "".
func (n *lan) neigh(t *testing.T, ip netip.Addr) string {
	t.Helper()
	fam := netlink.FAMILY_V4
	if ip.Is6() {
		fam = netlink.FAMILY_V6
	}
	list, err := n.nlB.NeighList(n.pair.IndexB, fam)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range list {
		if a, ok := netip.AddrFromSlice(e.IP); ok && a.Unmap() == ip {
			return e.HardwareAddr.String()
		}
	}
	return ""
}

func (n *lan) waitNeigh(t *testing.T, ip netip.Addr, within time.Duration, what string) {
	t.Helper()
	want := n.pair.MACA.String()
	waittest.Until(t, within, what, func() bool { return n.neigh(t, ip) == want })
}

// capture opens an ARP capture on B's interface.
func (n *lan) capture(t *testing.T) *packet.Conn {
	t.Helper()
	var (
		c   *packet.Conn
		err error
	)
	ifi := n.pair.B.Interface(t, "peer0")
	n.pair.B.Do(t, func() { c, err = packet.Listen(ifi, packet.Raw, int(ethernet.EtherTypeARP), nil) })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func readARP(t *testing.T, c *packet.Conn, deadline time.Time) (*ethernet.Frame, *arp.Packet) {
	t.Helper()
	if err := c.SetReadDeadline(deadline); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 1500)
	for {
		n, _, err := c.ReadFrom(buf)
		if err != nil {
			t.Fatalf("reading ARP on the peer: %v", err)
		}
		var f ethernet.Frame
		if f.UnmarshalBinary(buf[:n]) != nil {
			continue
		}
		var p arp.Packet
		if p.UnmarshalBinary(f.Payload) != nil {
			continue
		}
		return &f, &p
	}
}

// The first burst reaches the peer as alternating request/reply gratuitous
// ARPs built as the spec says, and moves the peer's cache to our MAC before
// the burst is over.
func TestGARPFirstBurstSeenByPeer(t *testing.T) {
	n := newLAN(t)
	vip := netip.MustParseAddr("192.0.2.100")
	n.prime(t, vip)
	capture := n.capture(t)

	cfg := Config{FirstCount: 5, FirstInterval: 200 * time.Millisecond}
	a, err := New(n.link, cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	stop, err := a.Start(t.Context(), vip)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	burst := time.Duration(cfg.FirstCount-1) * cfg.FirstInterval
	n.waitNeigh(t, vip, burst, "the peer's neighbour entry to move to our MAC within the first burst")

	wantOps := []arp.Operation{arp.OperationRequest, arp.OperationReply, arp.OperationRequest, arp.OperationReply, arp.OperationRequest}
	deadline := time.Now().Add(10 * time.Second)
	for i, op := range wantOps {
		f, p := readARP(t, capture, deadline)
		if p.Operation != op {
			t.Errorf("packet %d is %v, want %v", i, p.Operation, op)
		}
		if f.Destination.String() != ethernet.Broadcast.String() || f.Source.String() != n.pair.MACA.String() {
			t.Errorf("packet %d frame %v -> %v, want our MAC to broadcast", i, f.Source, f.Destination)
		}
		if p.SenderIP != vip || p.TargetIP != vip {
			t.Errorf("packet %d sender %v target %v, want both %v", i, p.SenderIP, p.TargetIP, vip)
		}
		if p.SenderHardwareAddr.String() != n.pair.MACA.String() {
			t.Errorf("packet %d sender MAC %v, want %v", i, p.SenderHardwareAddr, n.pair.MACA)
		}
	}
	stop() // waits for the schedule, so the counters are final
	st := n.link.Stats()
	if st.ARPRequests != 3 || st.ARPReplies != 2 || st.SendErrors != 0 {
		t.Errorf("stats %+v, want 3 requests, 2 replies, no errors", st)
	}
}

// Some devices honour only one kind of gratuitous ARP, so each kind must
// work on its own. Linux treats a reply as gratuitous only if its target
// MAC equals its sender MAC; this catches a reply built any other way.
func TestEachGARPKindAloneMovesPeer(t *testing.T) {
	n := newLAN(t)
	vip := netip.MustParseAddr("192.0.2.101")
	for _, reply := range []bool{false, true} {
		n.prime(t, vip)
		if err := n.link.SendGARP(vip, reply); err != nil {
			t.Fatal(err)
		}
		n.waitNeigh(t, vip, 2*time.Second, "the peer to accept a single gratuitous ARP (reply="+map[bool]string{false: "no", true: "yes"}[reply]+")")
	}
}

func TestNAUpdatesPeer(t *testing.T) {
	n := newLAN(t)
	vip := netip.MustParseAddr("2001:db8::100")
	n.prime(t, vip)
	a, err := New(n.link, Config{FirstCount: 1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	stop, err := a.Start(t.Context(), vip)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	n.waitNeigh(t, vip, 2*time.Second, "the peer's IPv6 neighbour entry to move to our MAC")
	stop()
	if st := n.link.Stats(); st.NAs != 1 {
		t.Errorf("stats %+v, want one advertisement", st)
	}
}

// Without a usable link-local address the advertisement is sent from the
// floating address itself.
func TestNAFallsBackToFloatingSource(t *testing.T) {
	p := netlabtest.NewPair(t, "fanann", "vip0", "peer0")
	p.B.IP(t, "addr", "add", "2001:db8::2/64", "dev", "peer0")
	p.A.IP(t, "addr", "flush", "dev", "vip0", "scope", "link")
	vip := netip.MustParseAddr("2001:db8::101")
	p.A.IP(t, "addr", "add", vip.String()+"/64", "dev", "vip0", "nodad")
	l, err := Open("vip0", nil, WithNamespace(p.A.Handle))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if l.ndpConn != nil {
		t.Fatal("expected no link-local connection after flushing link-local addresses")
	}
	n := &lan{pair: p, link: l, nlB: p.B.Netlink(t)}
	n.prime(t, vip)
	if err := l.SendNA(vip); err != nil {
		t.Fatal(err)
	}
	n.waitNeigh(t, vip, 2*time.Second, "the peer to accept an advertisement sourced from the floating address")
}

func TestProbe(t *testing.T) {
	n := newLAN(t)
	held := netip.MustParseAddr("192.0.2.50")
	free := netip.MustParseAddr("192.0.2.51")
	n.pair.B.IP(t, "addr", "add", held.String()+"/24", "dev", "peer0")

	mac, found, err := n.link.Probe(t.Context(), held, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if !found || mac.String() != n.pair.MACB.String() {
		t.Errorf("Probe(%v) = %v, %v; want the peer's MAC %v", held, mac, found, n.pair.MACB)
	}

	mac, found, err = n.link.Probe(t.Context(), free, 300*time.Millisecond)
	if err != nil || found {
		t.Errorf("Probe(%v) = %v, %v, %v; want nobody", free, mac, found, err)
	}
	// One probe each is certain; the half-way repeat may still be in flight.
	if st := n.link.Stats(); st.Probes < 2 {
		t.Errorf("probes sent %d, want at least 2", st.Probes)
	}
}

func TestProbeHonoursContext(t *testing.T) {
	n := newLAN(t)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	_, found, err := n.link.Probe(ctx, netip.MustParseAddr("192.0.2.52"), time.Minute)
	if found || !errors.Is(err, context.Canceled) {
		t.Errorf("Probe with a cancelled context = %v, %v; want context.Canceled", found, err)
	}
}

func TestOpenUnknownInterface(t *testing.T) {
	p := netlabtest.NewPair(t, "fanann", "vip0", "peer0")
	if _, err := Open("nosuch0", nil, WithNamespace(p.A.Handle)); err == nil {
		t.Fatal("Open accepted a missing interface")
	}
}
