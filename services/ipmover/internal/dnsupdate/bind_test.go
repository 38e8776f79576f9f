package dnsupdate

import (
	"testing"

	"github.com/fanpbx/fan/lab/bindtest"
)

// zoneFile is the starting zone of every test. "other" exists but is outside
// the update-policy.
const zoneFile = `$TTL 60
@        IN SOA ns1.voip.test. hostmaster.voip.test. ( 1 3600 600 86400 30 )
         IN NS  ns1.voip.test.
ns1      IN A   127.0.0.1
sip   30 IN A    192.0.2.10
sip   30 IN AAAA 2001:db8::10
_sip._udp 30 IN SRV 10 0 5060 pbx-a.voip.test.
pbx-a    IN A   192.0.2.10
pbx-b    IN A   203.0.113.20
other 30 IN A   192.0.2.99
`

// updatable is the update-policy: exactly what testConfig swaps, so that a
// change outside it is refused by BIND, not by the Updater.
var updatable = []string{"sip.voip.test. A AAAA", "_sip._udp.voip.test. SRV"}

// unknownSecret is a well-formed TSIG secret that no named started here
// accepts.
const unknownSecret = "c2VjcmV0LXRoYXQtbmFtZWQtZG9lcy1ub3Qta25vdw==" // "secret-that-named-does-not-know"

func startNamed(t testing.TB) *bindtest.Named {
	t.Helper()
	return bindtest.Start(t, "voip.test", zoneFile, updatable...)
}
