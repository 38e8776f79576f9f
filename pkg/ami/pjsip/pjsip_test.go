package pjsip

import (
	"context"
	"errors"
	"log/slog"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/fanpbx/fan/lab/amipeer"
	"github.com/fanpbx/fan/pkg/ami"
)

// dial logs in to an AMI peer that answers byte for byte as Asterisk 22
// does (lab/amipeer's testdata) and returns its actions.
func dial(t *testing.T, cfg amipeer.Config) (Action, *amipeer.Peer) {
	t.Helper()
	cfg.Username, cfg.Secret = "fan", "s"
	peer, err := amipeer.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { peer.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	t.Cleanup(cancel)
	c, err := ami.Dial(ctx, ami.Config{Addr: peer.Addr(), Username: "fan", Secret: "s"}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return func(name string, f ...ami.Field) (ami.Response, error) { return c.Action(ctx, name, f...) }, peer
}

// The transports as Asterisk 22 lists them.
func TestReadTransportsFromAsterisk22Listing(t *testing.T) {
	act, _ := dial(t, amipeer.Config{Transports: []amipeer.Transport{
		{ID: "transport-node", Bind: "198.51.100.11:5060", ExternalSignalingAddress: "198.51.100.10"},
		{ID: "transport-any6", Protocol: "udp", Bind: "[::]:5060", LocalNet: "2001:db8::/64"},
		{ID: "transport-float", Bind: "198.51.100.10:5070", ExternalMediaAddress: "198.51.100.10"},
	}})
	ts, err := ReadTransports(act)
	if err != nil {
		t.Fatal(err)
	}
	want := []Transport{
		{ID: "transport-node", Protocol: "udp", Bind: "198.51.100.11:5060", ExtSignaling: "198.51.100.10"},
		{ID: "transport-any6", Protocol: "udp", Bind: "[::]:5060", LocalNet: "2001:db8::/64"},
		{ID: "transport-float", Protocol: "udp", Bind: "198.51.100.10:5070", ExtMedia: "198.51.100.10"},
	}
	if !slices.Equal(ts, want) {
		t.Fatalf("transports %+v, want %+v", ts, want)
	}
	if ap, ok := ts[1].BindAddr(); !ok || !ap.Addr().IsUnspecified() || ap.Port() != 5060 {
		t.Fatalf("[::]:5060 read as %v %v", ap, ok)
	}
	if got := MediaRewriters(ts); !slices.Equal(got, []string{"transport-float"}) {
		t.Fatalf("media rewriters %v", got)
	}
	fl := netip.MustParseAddr("198.51.100.10")
	if p := FloatingPort(ts, fl); p != 5070 {
		t.Fatalf("port on the floating address %d, want the transport's 5070", p)
	}
	if p := FloatingPort(ts[:2], fl); p != DefaultSIPPort {
		t.Fatalf("port without a transport on the floating address %d", p)
	}
}

// The variants tried on Asterisk 22.10.1 with a phone on the LAN
// (docs/asterisk22.md, "What fanctl doctor asks"): what the Contact of a
// dialog on the floating address carried.
func TestContactVerdictFollowsAsterisk22(t *testing.T) {
	fl := netip.MustParseAddrPort("198.51.100.10:5060")
	node := func(bind, ext string) Transport {
		return Transport{ID: "transport-node", Protocol: "udp", Bind: bind, ExtSignaling: ext}
	}
	float := func(ext string) Transport {
		return Transport{ID: "transport-float", Protocol: "udp", Bind: "198.51.100.10:5060", ExtSignaling: ext}
	}
	for _, tc := range []struct {
		name     string
		ts       []Transport
		ok       bool
		culprits []string
	}{
		// Observed: the node's address in the 200 OK's Contact.
		{"node and floating on 5060", []Transport{node("198.51.100.11:5060", ""), float("")}, false, []string{"transport-float", "transport-node"}},
		// Observed: an endpoint tied to transport-float still got the node's.
		{"external address on the node's transport only", []Transport{node("198.51.100.11:5060", "198.51.100.10"), float("")}, false, []string{"transport-float"}},
		// Observed: the floating address in answers and in calls to phones.
		{"external address on both", []Transport{node("198.51.100.11:5060", "198.51.100.10"), float("198.51.100.10")}, true, nil},
		// Observed: answers fine, but a call to a phone left from the node's
		// transport with its address in the Contact.
		{"node's transport on another port", []Transport{node("198.51.100.11:5070", ""), float("")}, false, []string{"transport-node"}},
		// Observed: the node's address (and the answer sent from it).
		{"0.0.0.0 alone", []Transport{{ID: "transport-any", Protocol: "udp", Bind: "0.0.0.0:5060"}}, false, []string{"transport-any"}},
		// Observed: the floating address in the Contact.
		{"0.0.0.0 with the external address", []Transport{{ID: "transport-any", Protocol: "udp", Bind: "0.0.0.0:5060", ExtSignaling: "198.51.100.10"}}, true, nil},
		{"floating alone", []Transport{float("")}, true, nil},
		{"local_net exempts the phones", []Transport{node("198.51.100.11:5060", "198.51.100.10"), {ID: "transport-float", Protocol: "udp",
			Bind: "198.51.100.10:5060", ExtSignaling: "198.51.100.10", LocalNet: "198.51.100.0/24"}}, false, []string{"transport-float"}},
		{"a TCP transport is not judged", []Transport{float(""), {ID: "tcp", Protocol: "tcp", Bind: "198.51.100.11:5060"}}, true, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ok, culprits, why := ContactVerdict(tc.ts, fl)
			if ok != tc.ok || !slices.Equal(culprits, tc.culprits) {
				t.Fatalf("ok %v culprits %v (%s), want %v %v", ok, culprits, why, tc.ok, tc.culprits)
			}
		})
	}
}

func TestFloating(t *testing.T) {
	for in, want := range map[string]string{"198.51.100.10/24": "198.51.100.10", "198.51.100.10/32": "198.51.100.10",
		"2001:db8::10/64": "2001:db8::10", "198.51.100.0/24": ""} {
		a, ok := Floating(netip.MustParsePrefix(in))
		if got := map[bool]string{true: a.String(), false: ""}[ok]; got != want {
			t.Errorf("Floating(%s) = %q, want %q", in, got, want)
		}
	}
}

// The endpoints' timers and direct media as Asterisk 22 details them.
func TestReadEndpoints(t *testing.T) {
	act, peer := dial(t, amipeer.Config{Endpoints: []amipeer.Endpoint{
		{Name: "6001", Timers: "no"}, {Name: "6002"}, {Name: "6003", Timers: "always", NoDirectMedia: true}}})
	eps, err := ReadEndpoints(context.Background(), act, 3*time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(eps.Names, []string{"6001", "6002", "6003"}) || eps.Read != 3 ||
		!slices.Equal(eps.Timers, []Endpoint{{"6002", "yes"}, {"6003", "always"}}) || !slices.Equal(eps.NoDirectMedia, []string{"6003"}) {
		t.Fatalf("endpoints %+v", eps)
	}
	// A bound on how many are read in detail.
	if eps, err := ReadEndpoints(context.Background(), act, 3*time.Second, 1); err != nil || eps.Read != 1 || len(eps.Names) != 3 {
		t.Fatalf("with at most one read: %+v %v", eps, err)
	}
	// No endpoint at all is no error.
	peer.SetPJSIP(nil, nil)
	if eps, err := ReadEndpoints(context.Background(), act, 3*time.Second, 0); err != nil || len(eps.Names) != 0 {
		t.Fatalf("without endpoints: %+v %v", eps, err)
	}
}

// A user that may not run the actions is told apart from a silent
// Asterisk.
func TestReadRefused(t *testing.T) {
	act := func(name string, f ...ami.Field) (ami.Response, error) {
		return ami.Response{}, nil // an answer that is not a success
	}
	if _, err := ReadEndpoints(context.Background(), act, time.Second, 0); !errors.Is(err, ErrRefused) {
		t.Fatalf("endpoints refused: %v", err)
	}
	if _, err := ReadTransports(act); !errors.Is(err, ErrRefused) {
		t.Fatalf("transports refused: %v", err)
	}
	silent := func(name string, f ...ami.Field) (ami.Response, error) { return ami.Response{}, ami.ErrTimeout }
	if _, err := ReadEndpoints(context.Background(), silent, time.Second, 0); errors.Is(err, ErrRefused) || !errors.Is(err, ami.ErrTimeout) {
		t.Fatalf("endpoints unanswered: %v", err)
	}
}
