package keeper

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/mdlayher/packet"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"golang.org/x/sys/unix"

	"github.com/fanpbx/fan/lab/netlab"
	"github.com/fanpbx/fan/lab/netlab/netlabtest"
	"github.com/fanpbx/fan/pkg/events"
)

// udpPhone is a phone's SIP socket in the phones' namespace.
type udpPhone struct {
	t    *testing.T
	name string
	c    *net.UDPConn
}

type received struct {
	msg  message
	raw  []byte
	from netip.AddrPort
	at   time.Time
}

func (p *udpPhone) send(to netip.AddrPort, b []byte) {
	p.t.Helper()
	if _, err := p.c.WriteToUDPAddrPort(b, to); err != nil {
		p.t.Fatalf("%s sends: %v", p.name, err)
	}
}

func (p *udpPhone) recv(within time.Duration) received {
	p.t.Helper()
	buf := make([]byte, 65535)
	_ = p.c.SetReadDeadline(time.Now().Add(within))
	n, from, err := p.c.ReadFromUDPAddrPort(buf)
	if err != nil {
		p.t.Fatalf("%s received nothing within %s: %v", p.name, within, err)
	}
	m, err := parseMessage(buf[:n])
	if err != nil {
		p.t.Fatalf("%s received something unreadable from %s: %v: %q", p.name, from, err, buf[:n])
	}
	return received{msg: m, raw: bytes.Clone(buf[:n]), from: netip.AddrPortFrom(from.Addr().Unmap(), from.Port()), at: time.Now()}
}

func (p *udpPhone) quiet(d time.Duration) {
	p.t.Helper()
	buf := make([]byte, 65535)
	_ = p.c.SetReadDeadline(time.Now().Add(d))
	n, from, err := p.c.ReadFromUDPAddrPort(buf)
	if err == nil {
		p.t.Fatalf("%s received from %s: %q", p.name, from, buf[:n])
	}
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		p.t.Fatalf("%s: %v", p.name, err)
	}
}

// fakeAsterisk answers every request reaching the floating address's SIP
// port but ACK with 481, as Asterisk 22 answers requests in dialogs it does
// not know, from the node's own address (docs/asterisk22.md), and ignores
// every answer, until in is closed.
func fakeAsterisk(in, out *net.UDPConn) {
	buf := make([]byte, 65535)
	for {
		n, from, err := in.ReadFromUDPAddrPort(buf)
		if err != nil {
			return
		}
		m, err := parseMessage(buf[:n])
		if err != nil || !m.request || m.method == "ACK" {
			continue
		}
		var resp strings.Builder
		resp.WriteString("SIP/2.0 481 Call/Transaction Does Not Exist\r\n")
		for _, line := range strings.Split(string(buf[:n]), "\r\n") {
			name, _, _ := strings.Cut(line, ":")
			switch canonical(strings.TrimSpace(name)) {
			case "via", "call-id", "from", "to", "cseq":
				resp.WriteString(line + "\r\n")
			}
		}
		resp.WriteString("Server: Asterisk PBX 22.10.1\r\nContent-Length:  0\r\n\r\n")
		_, _ = out.WriteToUDPAddrPort([]byte(resp.String()), from)
	}
}

// The keeper on real sockets: a node namespace holding the floating
// address, with a fake Asterisk owning its SIP port, and a phones'
// namespace with phone A, phone B and a stranger, joined by a veth.
func TestKeeperInNamespaces(t *testing.T) {
	pair := netlabtest.NewPair(t, "kpr", "lan0", "lan1")
	node, phones := pair.A, pair.B
	node.IP(t, "addr", "add", nodeAddr.Addr().String()+"/24", "dev", "lan0")
	node.IP(t, "addr", "add", floating.Addr().String()+"/24", "dev", "lan0")
	for _, a := range []netip.AddrPort{phoneA, phoneB, stranger} {
		phones.IP(t, "addr", "add", a.Addr().String()+"/24", "dev", "lan1")
	}

	var astIn, astOut *net.UDPConn
	node.Do(t, func() {
		var err1, err2 error
		astIn, err1 = net.ListenUDP("udp4", net.UDPAddrFromAddrPort(floating))
		astOut, err2 = net.ListenUDP("udp4", net.UDPAddrFromAddrPort(nodeAddr))
		if err := errors.Join(err1, err2); err != nil {
			t.Fatal(err)
		}
	})
	t.Cleanup(func() { astIn.Close(); astOut.Close() })
	go fakeAsterisk(astIn, astOut)

	ph := map[string]*udpPhone{}
	for name, a := range map[string]netip.AddrPort{"phone A": phoneA, "phone B": phoneB, "stranger": stranger} {
		var c *net.UDPConn
		var err error
		phones.Do(t, func() { c, err = net.ListenUDP("udp4", net.UDPAddrFromAddrPort(a)) })
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		ph[name] = &udpPhone{t: t, name: name, c: c}
	}
	a, b, s := ph["phone A"], ph["phone B"], ph["stranger"]

	// What reaches the phones' link from the floating address, as packets:
	// the UDP checksum is checked as the receiving kernel checks it.
	var wire *packet.Conn
	phones.Do(t, func() {
		ifi, err := net.InterfaceByName("lan1")
		if err == nil {
			wire, err = packet.Listen(ifi, packet.Datagram, unix.ETH_P_IP, nil)
		}
		if err != nil {
			t.Fatal(err)
		}
	})
	t.Cleanup(func() { wire.Close() })
	fromFloating := make(chan []byte, 64)
	go func() {
		buf := make([]byte, 65535)
		for {
			n, _, err := wire.ReadFrom(buf)
			if err != nil {
				return
			}
			if p, ok := decodeIPv4UDP(buf[:n]); ok && p.Src == floating {
				fromFloating <- bytes.Clone(buf[:n])
			}
		}
	}()

	inNode := func(f func() error) error { return netlab.InNamespace(node.Handle, f) }
	sender, err := OpenRawSender(inNode)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sender.Close() })
	st := &fakeStore{}
	k := New(Config{Cluster: "lab", Node: "n2", Sender: sender, Store: st, Now: clockAt(t0.Add(time.Minute)),
		Open: func(addr netip.AddrPort) (Source, error) { return OpenCapture("lan0", addr, inNode) }})
	t.Cleanup(func() { k.Close(context.Background()) })
	keepOne := func(id string) events.CallRecord {
		rec := keptRecord(id)
		if n, err := k.Keep("pbx", floating, []events.CallRecord{rec}); n != 1 || err != nil {
			t.Fatalf("Keep %s: %d, %v", id, n, err)
		}
		return rec
	}
	var ops []string

	t.Run("phone A hangs up", func(t *testing.T) {
		rec := keepOne("c1")
		key := events.KeptKey("lab", "pbx", "n2", "c1")
		ops = append(ops, "put "+key)
		sentAt := time.Now()
		a.send(floating, request(rec, 0, "BYE", 2))
		if r := a.recv(time.Second); r.msg.status != 481 || r.from != nodeAddr {
			t.Fatalf("phone A's BYE answered %d from %s", r.msg.status, r.from)
		}
		first := b.recv(2 * time.Second)
		t.Logf("phone B told %s after phone A's BYE", first.at.Sub(sentAt).Round(10*time.Microsecond))
		want := message{request: true, method: "BYE", callID: rec.Legs[1].CallID, fromTag: rec.Legs[1].LocalTag,
			toTag: rec.Legs[1].RemoteTag, cseq: CSeqBase, cseqMethod: "BYE", branch: first.msg.branch}
		if first.from != floating || first.msg != want {
			t.Fatalf("phone B got %+v from %s; want %+v from %s", first.msg, first.from, want, floating)
		}
		select {
		case pkt := <-fromFloating:
			verifyUDP(t, pkt)
		case <-time.After(time.Second):
			t.Fatal("the BYE was not seen on phone B's link")
		}
		// Not answered: sent again, the same request, T1 later.
		again := b.recv(2 * time.Second)
		if !bytes.Equal(again.raw, first.raw) {
			t.Fatalf("retransmission differs:\n%q\n%q", again.raw, first.raw)
		}
		if gap := again.at.Sub(first.at); gap < DefaultT1*8/10 || gap > DefaultT1*3 {
			t.Fatalf("retransmitted %s after the first", gap)
		}
		b.send(floating, response(first.msg, 200))
		b.quiet(1500 * time.Millisecond) // the next one was due 1 s after the last
		ops = append(ops, "delete "+key)
		st.waitOps(t, ops...)
	})

	t.Run("phone B puts the call on hold", func(t *testing.T) {
		rec := keepOne("c2")
		key := events.KeptKey("lab", "pbx", "n2", "c2")
		ops = append(ops, "put "+key)
		b.send(floating, request(rec, 1, "INVITE", 5))
		toA := a.recv(2 * time.Second)
		if toA.from != floating || toA.msg.method != "BYE" || toA.msg.callID != rec.Legs[0].CallID || toA.msg.toTag != rec.Legs[0].RemoteTag {
			t.Fatalf("phone A got %+v from %s", toA.msg, toA.from)
		}
		a.send(floating, response(toA.msg, 200))
		// Phone B: the PBX's 481 first, then the keeper's BYE.
		if r := b.recv(time.Second); r.msg.status != 481 || r.msg.cseqMethod != "INVITE" {
			t.Fatalf("phone B's re-INVITE answered %+v", r.msg)
		}
		b.send(floating, request(rec, 1, "ACK", 5))
		toB := b.recv(2 * time.Second)
		if toB.from != floating || toB.msg.method != "BYE" || toB.msg.callID != rec.Legs[1].CallID || toB.msg.toTag != rec.Legs[1].RemoteTag {
			t.Fatalf("phone B got %+v from %s", toB.msg, toB.from)
		}
		b.send(floating, response(toB.msg, 200))
		ops = append(ops, "delete "+key)
		st.waitOps(t, ops...)
		// The BYE followed the 481 seen on the capture (it left from the
		// node's own address), not the wait's end.
		if n := testutil.ToFloat64(k.Metrics().unseen481); n != 0 {
			t.Fatalf("%v PBX answers not seen", n)
		}
	})

	t.Run("forged and malformed messages", func(t *testing.T) {
		rec := keepOne("c3")
		key := events.KeptKey("lab", "pbx", "n2", "c3")
		ops = append(ops, "put "+key)
		// The call's own dialog and tags, from a host that is not its phone,
		// with a Via naming phone B.
		forged := bytes.Replace(request(rec, 0, "BYE", 2), []byte("Via: SIP/2.0/UDP 198.51.100.21:5062"),
			[]byte("Via: SIP/2.0/UDP 198.51.100.22:5064"), 1)
		s.send(floating, forged)
		if r := s.recv(time.Second); r.msg.status != 481 {
			t.Fatalf("the stranger's BYE answered %+v", r.msg)
		}
		s.send(floating, []byte("BYE sip:x SIP/2.0\r\nCall-ID: "+rec.Legs[0].CallID+"\r\nCall-ID: again\r\n\r\n"))
		s.send(floating, bytes.Repeat([]byte{0xff}, 1200))
		a.send(floating, bytes.Replace(request(rec, 0, "BYE", 2), []byte(rec.Legs[0].RemoteTag), []byte("other-tag"), 1))
		a.recv(time.Second) // the PBX's 481
		for _, p := range []*udpPhone{a, b, s} {
			p.quiet(700 * time.Millisecond)
		}
		// The keeper is still there for the real hang-up.
		a.send(floating, request(rec, 0, "BYE", 2))
		a.recv(time.Second)
		toB := b.recv(2 * time.Second)
		b.send(floating, response(toB.msg, 200))
		ops = append(ops, "delete "+key)
		st.waitOps(t, ops...)
	})

	t.Run("released", func(t *testing.T) {
		rec := keepOne("c4")
		ops = append(ops, "put "+events.KeptKey("lab", "pbx", "n2", "c4"))
		k.Release("pbx")
		a.send(floating, request(rec, 0, "BYE", 2))
		a.recv(time.Second)
		b.quiet(time.Second)
		st.waitOps(t, ops...) // the record stays for the next holder
	})
}
