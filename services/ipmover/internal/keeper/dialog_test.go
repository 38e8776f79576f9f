package keeper

import (
	"errors"
	"net/netip"
	"slices"
	"testing"

	"github.com/fanpbx/fan/pkg/events"
)

func TestLegDestination(t *testing.T) {
	base := callRecord("c1").Legs[1]
	for _, tc := range []struct {
		name         string
		target, addr string
		dest         string
		sources      []string
	}{
		{"target and address", "sip:6002@198.51.100.22:5064", "198.51.100.22:5064", "198.51.100.22:5064", []string{"198.51.100.22"}},
		{"target in brackets, default port", "<sip:6002@198.51.100.22;ob>", "", "198.51.100.22:5060", []string{"198.51.100.22"}},
		{"target wins over the source", "sip:6002@198.51.100.22:5064;transport=UDP", "198.51.100.23:40000", "198.51.100.22:5064",
			[]string{"198.51.100.22", "198.51.100.23"}},
		{"host name: the recorded address", "sip:6002@phone-b.example:5064", "198.51.100.22:5064", "198.51.100.22:5064", []string{"198.51.100.22"}},
		{"no user part", "sip:198.51.100.22:5064", "", "198.51.100.22:5064", []string{"198.51.100.22"}},
	} {
		l := base
		l.RemoteTarget, l.RemoteAddr = tc.target, tc.addr
		got, err := newLeg(l, CSeqBase)
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		var srcs []string
		for _, s := range got.sources {
			srcs = append(srcs, s.String())
		}
		if got.dest.String() != tc.dest || !slices.Equal(srcs, tc.sources) {
			t.Errorf("%s: dest %s sources %v, want %s %v", tc.name, got.dest, srcs, tc.dest, tc.sources)
		}
	}
}

// A record never makes the keeper send to the node itself, a broadcast or
// multicast group, or over a transport it does not speak.
func TestLegRefusals(t *testing.T) {
	base := callRecord("c1").Legs[1]
	for _, tc := range []struct{ name, target, addr, transport string }{
		{"sips", "sips:6002@198.51.100.22", "", ""},
		{"tcp transport param", "sip:6002@198.51.100.22;transport=tcp", "", ""},
		{"tls leg", "sip:6002@198.51.100.22", "", "tls"},
		{"loopback", "sip:6002@127.0.0.1:5064", "", ""},
		{"broadcast", "sip:6002@255.255.255.255", "", ""},
		{"multicast", "sip:6002@224.0.0.1", "", ""},
		{"unspecified", "sip:6002@0.0.0.0", "", ""},
		{"IPv6", "sip:6002@[2001:db8::22]:5064", "", ""},
		{"bad port", "sip:6002@198.51.100.22:0", "", ""},
		{"name and no address", "sip:6002@phone-b.example", "", ""},
		{"loopback source", "sip:6002@phone-b.example", "127.0.0.1:5064", ""},
		{"space in target", "sip:6002@198.51.100.22 SIP/2.0", "", ""},
		{"tel URI", "tel:+15550100", "", ""},
	} {
		l := base
		l.RemoteTarget, l.RemoteAddr, l.Transport = tc.target, tc.addr, tc.transport
		if got, err := newLeg(l, CSeqBase); !errors.Is(err, errUnsendable) {
			t.Errorf("%s: leg %+v, err %v", tc.name, got, err)
		}
	}
}

func TestLegFrom(t *testing.T) {
	l, err := newLeg(events.CallLeg{CallID: "x", LocalTag: "a", RemoteTag: "b", LocalURI: "sip:a@h", RemoteURI: "sip:b@h",
		RemoteTarget: "sip:b@198.51.100.22:5064", RemoteAddr: "198.51.100.22:5064"}, CSeqBase)
	if err != nil {
		t.Fatal(err)
	}
	if !l.from(netip.MustParseAddr("198.51.100.22")) || !l.from(netip.MustParseAddr("::ffff:198.51.100.22")) || l.from(stranger.Addr()) {
		t.Fatal("from() does not match the phone's address only")
	}
}
