package netlabtest

import (
	"net"

	"github.com/fanpbx/fan/lab/pbxstandin"
)

// ServeOPTIONS answers the SIP requests read from c as the lab's PBX
// stand-in does (pbxstandin.Respond: 200 to OPTIONS, copying the headers a
// client matches on), after ignoring the first drop requests, until c is
// closed. It stands in for a PBX's SIP stack in tests that need something
// answering on an address.
func ServeOPTIONS(c net.PacketConn, drop int) {
	buf := make([]byte, 65535)
	for n := 0; ; n++ {
		k, from, err := c.ReadFrom(buf)
		if err != nil {
			return
		}
		if n < drop {
			continue
		}
		if resp := pbxstandin.Respond(buf[:k], "netlabtest"); resp != nil {
			_, _ = c.WriteTo(resp, from)
		}
	}
}
