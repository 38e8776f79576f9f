package bindtest

import (
	"testing"

	"github.com/miekg/dns"
)

// StartPrimaries runs n primaries of zone, each loading the same zone file
// and taking updates signed with one shared TSIG key, with no zone transfer
// or NOTIFY between them: the shape of two sites that each run their own
// authoritative server for the zone, kept in step by whoever updates them.
func StartPrimaries(t testing.TB, n int, zone, zoneFile string, grants ...string) []*Named {
	t.Helper()
	bin := namedBinary(t)
	secret, err := newSecret()
	if err != nil {
		t.Fatal(err)
	}
	out := make([]*Named, n)
	for i := range out {
		out[i] = startPrimary(t, bin, role{zone: dns.Fqdn(zone), zoneFile: zoneFile, grants: grants, secret: secret})
	}
	return out
}
