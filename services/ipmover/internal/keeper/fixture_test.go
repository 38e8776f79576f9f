package keeper

import (
	"net/netip"
	"time"

	"github.com/fanpbx/fan/pkg/events"
)

// The lab of the keeper's tests (198.51.100.0/24): the floating address,
// the node's own address, phone A (the caller) and phone B, one call
// between them set up by n1.
var (
	floating = netip.MustParseAddrPort("198.51.100.10:5060")
	phoneA   = netip.MustParseAddrPort("198.51.100.21:5062")
	phoneB   = netip.MustParseAddrPort("198.51.100.22:5064")
	stranger = netip.MustParseAddrPort("198.51.100.66:5060")
	nodeAddr = netip.MustParseAddrPort("198.51.100.11:5060") // the node's own SIP transport
	t0       = time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC)
)

// callRecord is the call as n1's recorder writes it: leg 0 is phone A's
// dialog with the PBX (the PBX answered A's INVITE), leg 1 the PBX's
// dialog with phone B (the PBX called B, with a display name in From).
func callRecord(id string) events.CallRecord {
	return events.CallRecord{
		Cluster: "lab", Group: "pbx", Node: "n1", ID: id, Media: events.MediaDirect,
		AnsweredAt: t0, DirectSince: t0.Add(70 * time.Millisecond), UpdatedAt: t0.Add(time.Second),
		Legs: []events.CallLeg{
			{Channel: "PJSIP/6001-00000001", Endpoint: "6001", CallID: "callA-" + id + "@198.51.100.21",
				LocalTag: "ast-tag-A-" + id, RemoteTag: "phoneA-tag-" + id,
				LocalURI: "sip:6002@198.51.100.10", RemoteURI: "sip:6001@198.51.100.10",
				RemoteTarget: "sip:6001@198.51.100.21:5062", RemoteAddr: "198.51.100.21:5062", Transport: "udp"},
			{Channel: "PJSIP/6002-00000002", Endpoint: "6002", CallID: "ast-callB-" + id,
				LocalTag: "ast-tag-B-" + id, RemoteTag: "phoneB-tag-" + id,
				LocalURI: `"6001" <sip:6001@198.51.100.10>`, RemoteURI: "sip:6002@198.51.100.22:5064",
				RemoteTarget: "sip:6002@198.51.100.22:5064", RemoteAddr: "198.51.100.22:5064", Transport: "udp"},
		},
	}
}

// keptRecord is callRecord as n2 adopts it.
func keptRecord(id string) events.CallRecord {
	p := PlanAdoption(PlanInput{Cluster: "lab", Group: "pbx", Node: "n2", Now: t0.Add(time.Minute),
		Records: []Stored{stored("calls", callRecord(id))}})
	if len(p.Adopt) != 1 {
		panic("the fixture's call is not adopted")
	}
	return p.Adopt[0]
}
