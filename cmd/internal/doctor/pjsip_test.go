package doctor

import (
	"context"
	"log/slog"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/fanpbx/fan/lab/amipeer"
	"github.com/fanpbx/fan/pkg/ami"
)

// The transports as Asterisk 22 lists them, through the AMI peer that
// answers byte for byte as it does (lab/amipeer's testdata).
func TestReadTransportsFromAsterisk22Listing(t *testing.T) {
	peer, err := amipeer.Start(amipeer.Config{Username: "fan", Secret: "s", Transports: []amipeer.Transport{
		{ID: "transport-node", Bind: "198.51.100.11:5060", ExternalSignalingAddress: "198.51.100.10"},
		{ID: "transport-any6", Protocol: "udp", Bind: "[::]:5060", LocalNet: "2001:db8::/64"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := ami.Dial(ctx, ami.Config{Addr: peer.Addr(), Username: "fan", Secret: "s"}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ts, err := readTransports(func(name string, f ...ami.Field) (ami.Response, error) { return c.Action(ctx, name, f...) })
	if err != nil {
		t.Fatal(err)
	}
	want := []pjsipTransport{
		{ID: "transport-node", Protocol: "udp", Bind: "198.51.100.11:5060", ExtSignaling: "198.51.100.10"},
		{ID: "transport-any6", Protocol: "udp", Bind: "[::]:5060", LocalNet: "2001:db8::/64"},
	}
	if !slices.Equal(ts, want) {
		t.Fatalf("transports %+v, want %+v", ts, want)
	}
	if ap, ok := ts[1].bindAddr(); !ok || !ap.Addr().IsUnspecified() || ap.Port() != 5060 {
		t.Fatalf("[::]:5060 read as %v %v", ap, ok)
	}
}

// The variants tried on Asterisk 22.10.1 with a phone on the LAN
// (docs/asterisk22.md, "What fanctl doctor asks"): what the Contact of a
// dialog on the floating address carried.
func TestContactVerdictFollowsAsterisk22(t *testing.T) {
	fl := netip.MustParseAddrPort("198.51.100.10:5060")
	node := func(bind, ext string) pjsipTransport {
		return pjsipTransport{ID: "transport-node", Protocol: "udp", Bind: bind, ExtSignaling: ext}
	}
	float := func(ext string) pjsipTransport {
		return pjsipTransport{ID: "transport-float", Protocol: "udp", Bind: "198.51.100.10:5060", ExtSignaling: ext}
	}
	for _, tc := range []struct {
		name     string
		ts       []pjsipTransport
		ok       bool
		culprits []string
	}{
		// Observed: the node's address in the 200 OK's Contact.
		{"node and floating on 5060", []pjsipTransport{node("198.51.100.11:5060", ""), float("")}, false, []string{"transport-float", "transport-node"}},
		// Observed: an endpoint tied to transport-float still got the node's.
		{"external address on the node's transport only", []pjsipTransport{node("198.51.100.11:5060", "198.51.100.10"), float("")}, false, []string{"transport-float"}},
		// Observed: the floating address in answers and in calls to phones.
		{"external address on both", []pjsipTransport{node("198.51.100.11:5060", "198.51.100.10"), float("198.51.100.10")}, true, nil},
		// Observed: answers fine, but a call to a phone left from the node's
		// transport with its address in the Contact.
		{"node's transport on another port", []pjsipTransport{node("198.51.100.11:5070", ""), float("")}, false, []string{"transport-node"}},
		// Observed: the node's address (and the answer sent from it).
		{"0.0.0.0 alone", []pjsipTransport{{ID: "transport-any", Protocol: "udp", Bind: "0.0.0.0:5060"}}, false, []string{"transport-any"}},
		// Observed: the floating address in the Contact.
		{"0.0.0.0 with the external address", []pjsipTransport{{ID: "transport-any", Protocol: "udp", Bind: "0.0.0.0:5060", ExtSignaling: "198.51.100.10"}}, true, nil},
		{"floating alone", []pjsipTransport{float("")}, true, nil},
		{"local_net exempts the phones", []pjsipTransport{node("198.51.100.11:5060", "198.51.100.10"), {ID: "transport-float", Protocol: "udp",
			Bind: "198.51.100.10:5060", ExtSignaling: "198.51.100.10", LocalNet: "198.51.100.0/24"}}, false, []string{"transport-float"}},
		{"a TCP transport is not judged", []pjsipTransport{float(""), {ID: "tcp", Protocol: "tcp", Bind: "198.51.100.11:5060"}}, true, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ok, culprits, why := contactVerdict(tc.ts, fl)
			if ok != tc.ok || !slices.Equal(culprits, tc.culprits) {
				t.Fatalf("ok %v culprits %v (%s), want %v %v", ok, culprits, why, tc.ok, tc.culprits)
			}
		})
	}
}
