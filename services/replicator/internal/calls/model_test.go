package calls

import (
	"slices"
	"testing"
)

func enter(uid, name, linked, bridge string) chanEvent {
	return chanEvent{name: EventBridgeEnter, uniqueid: uid, channel: name, linkedid: linked, bridge: bridge}
}

// The model follows channels into and out of bridges; a call is a bridge
// of exactly two, the caller's channel first.
func TestModelFollowsBridges(t *testing.T) {
	m := newModel()
	m.apply(chanEvent{name: EventNewchannel, uniqueid: "pbx-1.7", channel: "PJSIP/6001-00000007", linkedid: "pbx-1.7"})
	m.apply(chanEvent{name: EventNewchannel, uniqueid: "pbx-1.8", channel: "PJSIP/6002-00000008", linkedid: "pbx-1.7"})
	// The callee enters first, as Asterisk does.
	m.apply(enter("pbx-1.8", "PJSIP/6002-00000008", "pbx-1.7", "b1"))
	if len(m.calls()) != 0 {
		t.Fatal("one channel in a bridge is not a call")
	}
	m.apply(enter("pbx-1.7", "PJSIP/6001-00000007", "pbx-1.7", "b1"))
	if got := m.legsOf("b1"); !slices.Equal(got, []string{"pbx-1.7", "pbx-1.8"}) {
		t.Fatalf("legs %v, want the caller's first", got)
	}
	// A third channel (a conference) is not a two-party call.
	m.apply(enter("pbx-1.9", "PJSIP/6003-00000009", "pbx-1.9", "b1"))
	if len(m.calls()) != 0 || len(m.chans) != 3 {
		t.Fatalf("three in a bridge: calls %v, %d channels", m.calls(), len(m.chans))
	}
	m.apply(chanEvent{name: EventBridgeLeave, uniqueid: "pbx-1.9", bridge: "b1"})
	m.apply(chanEvent{name: EventRename, uniqueid: "pbx-1.8", newname: "PJSIP/6002-0000000a"})
	if m.chans["pbx-1.8"].name != "PJSIP/6002-0000000a" || len(m.calls()) != 1 {
		t.Fatal("rename")
	}
	if _, media := m.apply(chanEvent{name: EventHold, uniqueid: "pbx-1.7"}); media != "pbx-1.7" {
		t.Fatal("a hold asks for the media again")
	}
	m.apply(chanEvent{name: EventHangup, uniqueid: "pbx-1.7"})
	if len(m.calls()) != 0 || len(m.bridges["b1"]) != 1 {
		t.Fatal("hang-up")
	}
}

// A reconcile's answer replaces the model except for the channels events
// spoke of while it was out: a hang-up it predates stays a hang-up, a
// call bridged after it stays a call.
func TestModelReconcileKeepsNewerEvents(t *testing.T) {
	m := newModel()
	m.apply(enter("u1", "PJSIP/a-1", "u1", "old"))
	m.apply(enter("u2", "PJSIP/b-2", "u1", "old"))
	m.startReconcile()
	m.apply(chanEvent{name: EventHangup, uniqueid: "u1"})
	m.apply(enter("u5", "PJSIP/e-5", "u5", "new"))
	m.apply(enter("u6", "PJSIP/f-6", "u5", "new"))
	// The answer was read before those events: u1 still up, u5 and u6
	// unknown; u3 and u4 a call no event told of (events lost).
	m.reconcile([]snapChannel{
		{uniqueid: "u1", name: "PJSIP/a-1", linkedid: "u1", bridge: "old"},
		{uniqueid: "u2", name: "PJSIP/b-2", linkedid: "u1", bridge: "old"},
		{uniqueid: "u3", name: "PJSIP/c-3", linkedid: "u3", bridge: "lost"},
		{uniqueid: "u4", name: "PJSIP/d-4", linkedid: "u3", bridge: "lost"},
	})
	if got := m.calls(); !slices.Equal(got, []string{"lost", "new"}) {
		t.Fatalf("calls %v", got)
	}
	if _, up := m.chans["u1"]; up || len(m.chans) != 5 {
		t.Fatalf("channels %v", m.chans)
	}
	if m.touched != nil {
		t.Fatal("the reconcile did not end")
	}
}

func TestTransportOf(t *testing.T) {
	for uri, want := range map[string]string{
		"sip:6001@198.51.100.50:5060":                 "udp",
		"sip:6002@198.51.100.51:5062;transport=UDP":   "udp",
		"<sip:6002@198.51.100.51;transport=tcp;ob>":   "tcp",
		"sips:6002@example.com":                       "tls",
		"sip:6002@198.51.100.51;ob;transport=ws":      "ws",
		"sip:6002@198.51.100.51?Replaces=x;transport": "udp",
	} {
		if got := transportOf(uri); got != want {
			t.Errorf("%s: %s, want %s", uri, got, want)
		}
	}
	if endpointOf("PJSIP/6001-00000002") != "6001" || endpointOf("PJSIP/front-desk-0000000a") != "front-desk" {
		t.Error("endpointOf")
	}
}
