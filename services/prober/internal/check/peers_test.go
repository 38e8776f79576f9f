package check

import (
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/fanpbx/fan/lab/bindtest"
	"github.com/fanpbx/fan/lab/kamailio"
	"github.com/fanpbx/fan/lab/kamailio/kamailiotest"
	"github.com/fanpbx/fan/pkg/platform/porttest"
	"github.com/fanpbx/fan/pkg/platform/waittest"
)

// Real peers for the check tests, from the lab's harnesses: Kamailio, SIPp
// and BIND from Debian, each on a free loopback port, each killed when its
// test ends.

// startKamailio returns the Kamailio and its "200" and "503" ports.
func startKamailio(t *testing.T) (*kamailiotest.Events, int, int) {
	t.Helper()
	kamailiotest.Need(t, "kamailio")
	ok, busy := porttest.Port(t), porttest.Port(t)
	k := kamailiotest.Start(t, "options", kamailio.OptionsConfig(ok, busy))
	waittest.Until(t, 10*time.Second, "kamailio listening", func() bool {
		c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", ok))
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	return k, ok, busy
}

// sippUAS answers every OPTIONS the way Asterisk answers an unknown source:
// 401 with a digest challenge (docs/asterisk22.md).
const sippUAS = `<?xml version="1.0" encoding="ISO-8859-1" ?>
<scenario name="asterisk-like OPTIONS 401">
  <recv request="OPTIONS"/>
  <send><![CDATA[
SIP/2.0 401 Unauthorized
[last_Via:]
[last_Call-ID:]
[last_From:]
[last_To:];tag=[pid]SIPpTag01[call_number]
[last_CSeq:]
WWW-Authenticate: Digest realm="asterisk",nonce="1a2b3c",opaque="4d5e",algorithm=MD5,qop="auth"
Server: Asterisk PBX 22.10.1
Content-Length: 0

]]></send>
</scenario>
`

func startSIPp(t *testing.T) int {
	t.Helper()
	kamailiotest.Need(t, "sipp")
	return kamailiotest.SIPpServer(t, sippUAS)
}

// startNamed runs BIND authoritative for voip.test (configured as
// docs/bind.md says) and returns it once it answers.
func startNamed(t *testing.T) (*bindtest.Named, string) {
	t.Helper()
	zone := `$TTL 60
@    IN SOA ns1.voip.test. hostmaster.voip.test. ( 1 3600 600 86400 30 )
     IN NS  ns1.voip.test.
ns1  IN A   127.0.0.1
sip 30 IN A 192.0.2.10
`
	n := bindtest.Start(t, "voip.test", zone)
	return n, n.Addr
}
