package keeper

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"testing"

	"golang.org/x/net/bpf"
)

// rfc1071 is the Internet checksum written out once more, apart from the
// one under test: the sum of 16-bit words with end-around carry.
func rfc1071(data ...[]byte) uint16 {
	var all []byte
	for _, d := range data {
		all = append(all, d...)
	}
	if len(all)%2 == 1 {
		all = append(all, 0)
	}
	var sum uint64
	for i := 0; i < len(all); i += 2 {
		sum += uint64(all[i])<<8 | uint64(all[i+1])
	}
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	return uint16(sum)
}

// verifyUDP checks an IPv4 packet's header checksum and its UDP checksum as
// a receiving host does: both sums over the data with the checksum in it
// come to 0xffff.
func verifyUDP(t testing.TB, pkt []byte) {
	t.Helper()
	ihl := int(pkt[0]&0x0f) * 4
	if got := rfc1071(pkt[:ihl]); got != 0xffff {
		t.Fatalf("IP header checksum wrong (sum %#04x)", got)
	}
	u := pkt[ihl:]
	pseudo := make([]byte, 12)
	copy(pseudo[0:4], pkt[12:16])
	copy(pseudo[4:8], pkt[16:20])
	pseudo[9] = 17
	binary.BigEndian.PutUint16(pseudo[10:12], uint16(len(u)))
	if binary.BigEndian.Uint16(u[6:8]) == 0 {
		t.Fatal("UDP checksum left out")
	}
	if got := rfc1071(pseudo, u); got != 0xffff {
		t.Fatalf("UDP checksum wrong (sum %#04x)", got)
	}
}

func TestUDPPacket(t *testing.T) {
	for _, size := range []int{0, 1, 2, 3, 511, 1400} {
		payload := bytes.Repeat([]byte{0xa5, 0x3c, 0xff}, size)[:size]
		pkt, err := udpPacket(floating, phoneB, payload)
		if err != nil {
			t.Fatal(err)
		}
		verifyUDP(t, pkt)
		p, ok := decodeIPv4UDP(pkt)
		if !ok || p.Src != floating || p.Dst != phoneB || !bytes.Equal(p.Payload, payload) {
			t.Fatalf("size %d: decoded %+v %v", size, p, ok)
		}
		if pkt[8] != 64 || binary.BigEndian.Uint16(pkt[6:8]) != 0x4000 || int(binary.BigEndian.Uint16(pkt[2:4])) != len(pkt) {
			t.Fatalf("size %d: header % x", size, pkt[:20])
		}
	}
	if _, err := udpPacket(floating, netip.MustParseAddrPort("[2001:db8::1]:5060"), nil); err == nil {
		t.Fatal("an IPv6 destination was accepted")
	}
}

func TestDecodeRefuses(t *testing.T) {
	good, _ := udpPacket(phoneA, floating, []byte("BYE"))
	for name, mut := range map[string]func([]byte) []byte{
		"short":            func(b []byte) []byte { return b[:19] },
		"IPv6":             func(b []byte) []byte { b[0] = 0x65; return b },
		"TCP":              func(b []byte) []byte { b[9] = 6; return b },
		"bad IP checksum":  func(b []byte) []byte { b[10] ^= 0xff; return b },
		"header too long":  func(b []byte) []byte { b[0] = 0x4f; return b },
		"length too short": func(b []byte) []byte { binary.BigEndian.PutUint16(b[2:4], 20); return b },
	} {
		b := mut(bytes.Clone(good))
		if p, ok := decodeIPv4UDP(b); ok {
			t.Errorf("%s: decoded %+v", name, p)
		}
	}
}

// The kernel's filter passes UDP to the floating address's SIP port and
// from the SIP port of any address only, first fragments included; run
// here in x/net/bpf's VM.
func TestFilter(t *testing.T) {
	raw, err := Filter(floating)
	if err != nil {
		t.Fatal(err)
	}
	var prog []bpf.Instruction
	for _, r := range raw {
		prog = append(prog, r.Disassemble())
	}
	vm, err := bpf.NewVM(prog)
	if err != nil {
		t.Fatal(err)
	}
	pkt := func(src, dst netip.AddrPort, mut func([]byte)) []byte {
		b, err := udpPacket(src, dst, []byte("OPTIONS sip:x SIP/2.0\r\n\r\n"))
		if err != nil {
			t.Fatal(err)
		}
		if mut != nil {
			mut(b)
		}
		return b
	}
	other := netip.MustParseAddrPort("198.51.100.11:5060")
	for _, tc := range []struct {
		name string
		b    []byte
		pass bool
	}{
		{"phone to the floating port", pkt(phoneA, floating, nil), true},
		{"PBX from the floating port", pkt(floating, phoneA, nil), true},
		{"PBX from the node's own address", pkt(netip.MustParseAddrPort("198.51.100.11:5060"), phoneA, nil), true},
		{"first fragment", pkt(phoneA, floating, func(b []byte) { b[6] |= 0x20 }), true},
		{"later fragment", pkt(phoneA, floating, func(b []byte) { b[7] = 0x10 }), false},
		{"to the node's own address", pkt(phoneA, other, nil), false},
		{"to another port of the floating address", pkt(phoneA, netip.AddrPortFrom(floating.Addr(), 5061), nil), false},
		{"from another port of the floating address", pkt(netip.AddrPortFrom(floating.Addr(), 10000), phoneA, nil), false},
		{"between two other ports", pkt(phoneA, netip.MustParseAddrPort("198.51.100.11:40000"), nil), false},
		{"TCP", pkt(phoneA, floating, func(b []byte) { b[9] = 6 }), false},
		{"IPv6", pkt(phoneA, floating, func(b []byte) { b[0] = 0x60 }), false},
		{"an IP header with options", func() []byte {
			b := pkt(phoneA, floating, nil)
			withOpts := append(append(bytes.Clone(b[:20]), 1, 1, 1, 1), b[20:]...)
			withOpts[0] = 0x46
			return withOpts
		}(), true},
		{"runt", []byte{0x45, 0, 0}, false},
	} {
		n, err := vm.Run(tc.b)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if (n > 0) != tc.pass {
			t.Errorf("%s: filter returned %d, want pass=%v", tc.name, n, tc.pass)
		}
	}
	if _, err := Filter(netip.MustParseAddrPort("[2001:db8::10]:5060")); err == nil {
		t.Fatal("an IPv6 filter was made")
	}
}
