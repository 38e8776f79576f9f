package gateway

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/fanpbx/fan/lab/netlab/netlabtest"
	"github.com/fanpbx/fan/services/ipmover/internal/sysctl"
)

// In a namespace: Apply turns forwarding on and installs the route through
// the LAN; Undo removes the route and puts forwarding back as it was.
func TestApplyUndoInNamespace(t *testing.T) {
	p := netlabtest.NewPair(t, "fangw", "vip0", "peer0")
	p.A.IP(t, "addr", "add", "192.0.2.1/24", "dev", "vip0")
	sys := sysctl.Namespace{NS: p.A.Handle}
	hostBefore, err := sysctl.Namespace{}.Get("net.ipv4.ip_forward")
	if err != nil {
		t.Fatal(err)
	}
	if err := sys.Set("net.ipv4.ip_forward", "0"); err != nil {
		t.Fatal(err)
	}
	var g *Gateway
	g, err = New(Config{
		Sysctls: map[string]string{"net.ipv4.ip_forward": "1"},
		Routes:  []Route{{To: netip.MustParsePrefix("203.0.113.0/24"), Via: netip.MustParseAddr("192.0.2.254")}},
	}, "vip0", p.A.Handle, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.Close)
	for range 2 { // idempotent
		if err := g.Apply(); err != nil {
			t.Fatal(err)
		}
	}
	if v, _ := sys.Get("net.ipv4.ip_forward"); v != "1" {
		t.Fatalf("ip_forward after Apply = %q", v)
	}
	if out := p.A.IP(t, "route", "show", "203.0.113.0/24"); !strings.Contains(out, "via 192.0.2.254 dev vip0") {
		t.Fatalf("route after Apply: %q", out)
	}
	for range 2 {
		if err := g.Undo(); err != nil {
			t.Fatal(err)
		}
	}
	if v, _ := sys.Get("net.ipv4.ip_forward"); v != "0" {
		t.Fatalf("ip_forward after Undo = %q, want the original 0", v)
	}
	if out := p.A.IP(t, "route", "show", "203.0.113.0/24"); strings.TrimSpace(out) != "" {
		t.Fatalf("route after Undo: %q", out)
	}
	// Only the node's namespace was touched, never the host's.
	if v, _ := (sysctl.Namespace{}).Get("net.ipv4.ip_forward"); v != hostBefore {
		t.Fatalf("host ip_forward changed from %q to %q", hostBefore, v)
	}
}
