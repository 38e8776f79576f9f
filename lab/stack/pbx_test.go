package stack

import (
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fanpbx/fan/lab/pbxstandin"
)

// TestWriteAsteriskEtc: the lab's configuration is deploy/asterisk's as
// shipped, for the lab's addresses and secret, with the lab's endpoints on
// its templates; the stand-in reads it as Asterisk would.
func TestWriteAsteriskEtc(t *testing.T) {
	shipped, err := FindShippedAsterisk()
	if err != nil {
		t.Fatal(err)
	}
	base := t.TempDir()
	conf, err := WriteAsteriskEtc(base, AsteriskEtc{Shipped: shipped, NodeAddr: netip.MustParseAddr("198.51.100.11"),
		Floating: netip.MustParseAddr("198.51.100.10"), AMISecret: "lab-secret",
		Endpoints: []Endpoint{{User: "6001", Password: "a"}, {User: "6002", Password: "b", Anchored: true}}})
	if err != nil {
		t.Fatal(err)
	}
	if conf != filepath.Join(base, "etc", "asterisk.conf") {
		t.Fatalf("asterisk.conf at %s", conf)
	}
	pj, err := os.ReadFile(filepath.Join(base, "etc", "pjsip.conf"))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(pj), "192.0.2.") || strings.Contains(string(pj), "change-me") {
		t.Fatalf("shipped example addresses or credentials left in:\n%s", pj)
	}
	e, err := pbxstandin.LoadEtc(filepath.Join(base, "etc"))
	if err != nil {
		t.Fatal(err)
	}
	if e.AMIAddr != "127.0.0.1:5038" || len(e.Users) != 1 || e.Users[0].Name != amiUser || e.Users[0].Secret != "lab-secret" {
		t.Fatalf("manager.conf: %s %+v", e.AMIAddr, e.Users)
	}
	if len(e.SIP) != 2 || e.SIP[0] != "198.51.100.11:5060" || e.SIP[1] != "198.51.100.10:5060" {
		t.Fatalf("transports %v, want the node's and the floating address", e.SIP)
	}
	if !e.SendContactStatusOnUpdate || e.SystemName == "" {
		t.Fatalf("global %v, systemname %q", e.SendContactStatusOnUpdate, e.SystemName)
	}
	eps := map[string]bool{}
	for _, ep := range e.Endpoints {
		if ep.Context != "from-phones" || ep.Timers != "no" {
			t.Fatalf("endpoint %+v not on the fan-phone template", ep)
		}
		eps[ep.Name] = ep.NoDirectMedia
	}
	if len(eps) != 2 || eps["6001"] || !eps["6002"] {
		t.Fatalf("endpoints (name: no direct media) %v, want 6001 direct and 6002 anchored, the shipped example gone", eps)
	}
	ext, err := os.ReadFile(filepath.Join(base, "etc", "extensions.conf"))
	if err != nil || !strings.Contains(string(ext), "[from-phones]") || !strings.Contains(string(ext), "Dial(PJSIP/${EXTEN})") {
		t.Fatalf("extensions.conf: %s %v", ext, err)
	}
}
