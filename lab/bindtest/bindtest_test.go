package bindtest

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/fanpbx/fan/pkg/platform/waittest"
)

// The secondary must learn of a change within moments, not at the SOA
// refresh an hour later; otherwise tests that wait on it only time out.
func TestSecondaryFollowsPrimary(t *testing.T) {
	primary, secondary := StartWithSecondary(t, "voip.test", `$TTL 60
@   IN SOA ns1.voip.test. hostmaster.voip.test. ( 1 3600 600 86400 30 )
    IN NS  ns1.voip.test.
ns1 IN A   127.0.0.1
sip 30 IN A 192.0.2.10
`, "sip.voip.test. A")
	if got, serial := secondary.Lookup(t, "sip.voip.test", dns.TypeA); !slices.Equal(got, []string{"30 192.0.2.10"}) || serial != 1 {
		t.Fatalf("secondary serves %q at serial %d before any update, want the zone file's record at 1", got, serial)
	}

	primary.SetA(t, "sip.voip.test", "203.0.113.20")
	waittest.Succeeds(t, 5*time.Second, "the secondary serving the update at serial 2", func() error {
		got, serial := secondary.Lookup(t, "sip.voip.test", dns.TypeA)
		if !slices.Equal(got, []string{"30 203.0.113.20"}) || serial != 2 {
			return fmt.Errorf("secondary still serves %q at serial %d", got, serial)
		}
		return nil
	})
}
