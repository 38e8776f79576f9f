package announce

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/mdlayher/arp"
	"github.com/mdlayher/ethernet"
	"github.com/mdlayher/packet"
)

// Seen is one ARP packet in which another host used an IPv4 address as its
// own: the sender protocol address of a request, reply or announcement.
type Seen struct {
	IP  netip.Addr
	MAC net.HardwareAddr
	// Reply is true for an ARP reply (answering someone, possibly us).
	Reply bool
	At    time.Time
}

// WatchARP reads every ARP frame the interface receives (broadcasts, and
// replies addressed to this host) and calls fn for each one whose sender is
// another MAC claiming a real address, until ctx ends. Frames this host
// sends itself are ignored, so our own announcements never look like a
// conflict. fn runs on the reading goroutine and must not block for long.
//
// Only broadcast ARP and replies to us are visible on a switched LAN: a
// second holder that merely answers other hosts' requests is seen through
// its own announcements and requests, or through a reply to our probe.
func (l *Link) WatchARP(ctx context.Context, fn func(Seen)) error {
	var rc *packet.Conn
	err := l.inNS(func() error {
		var err error
		rc, err = packet.Listen(l.ifi, packet.Raw, int(ethernet.EtherTypeARP), nil)
		return err
	})
	if err != nil {
		return fmt.Errorf("ARP watch socket on %s: %w", l.ifi.Name, err)
	}
	defer rc.Close()
	stop := context.AfterFunc(ctx, func() { rc.SetReadDeadline(time.Now()) })
	defer stop()

	own := l.ifi.HardwareAddr.String()
	buf := make([]byte, 1500)
	for {
		n, _, err := rc.ReadFrom(buf)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return fmt.Errorf("read ARP on %s: %w", l.ifi.Name, err)
		}
		var f ethernet.Frame
		if f.UnmarshalBinary(buf[:n]) != nil || f.EtherType != ethernet.EtherTypeARP {
			continue
		}
		var p arp.Packet
		if p.UnmarshalBinary(f.Payload) != nil {
			continue
		}
		// A probe (sender 0.0.0.0) asks, it does not claim; our kernel
		// answers it for an address we hold, which is what makes the
		// other side's probe refuse.
		if !p.SenderIP.Is4() || p.SenderIP.IsUnspecified() || p.SenderHardwareAddr.String() == own {
			continue
		}
		fn(Seen{IP: p.SenderIP, MAC: p.SenderHardwareAddr, Reply: p.Operation == arp.OperationReply, At: time.Now()})
	}
}
