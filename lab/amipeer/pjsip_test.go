package amipeer

import (
	"strings"
	"testing"
)

// TestPJSIPAsAsterisk22 checks the PJSIP listings doctor reads against
// Asterisk 22's answers to the same pjsip.conf (rights_test.go).
func TestPJSIPAsAsterisk22(t *testing.T) {
	p := startPeer(t, observedConfig())
	r := loginAs(t, p, "fan", "fan-secret")
	cases := []struct {
		file  string
		lines []string
	}{
		{"pjsipshowendpoints.txt", []string{"Action: PJSIPShowEndpoints", "ActionID: 2"}},
		{"pjsipshowendpoint-6001.txt", []string{"Action: PJSIPShowEndpoint", "ActionID: 3", "Endpoint: 6001"}},
		{"pjsipshowendpoint-6002.txt", []string{"Action: PJSIPShowEndpoint", "ActionID: 4", "Endpoint: 6002"}},
		{"pjsipshowendpoint-nosuch.txt", []string{"Action: PJSIPShowEndpoint", "ActionID: 5", "Endpoint: nosuch"}},
		{"command-pjsip-show-transports.txt", []string{"Action: Command", "ActionID: 6", "Command: pjsip show transports"}},
		{"command-pjsip-show-transport-node.txt", []string{"Action: Command", "ActionID: 7", "Command: pjsip show transport transport-node"}},
		{"command-pjsip-show-transport-nosuch.txt", []string{"Action: Command", "ActionID: 8", "Command: pjsip show transport nosuch"}},
	}
	for _, tc := range cases {
		want := observed(t, tc.file)
		if got := exchange(r, want, tc.lines...); got != want {
			t.Errorf("%s:\n got %q\nwant %q", tc.file, got, want)
		}
	}
}

// TestPJSIPSettingsAsAsterisk22: `pjsip show settings` with
// send_contact_status_on_update_registration = yes in [global], as Asterisk
// 22 printed it, and Asterisk's default (no) without the registrar.
func TestPJSIPSettingsAsAsterisk22(t *testing.T) {
	p := startPeer(t, observedConfig())
	p.EnableRegistrar(RegistrarConfig{SendContactStatusOnUpdate: true})
	r := loginAs(t, p, "fan", "fan-secret")
	want := observed(t, "command-pjsip-show-settings.txt")
	if got := exchange(r, want, "Action: Command", "ActionID: 1", "Command: pjsip show settings"); got != want {
		t.Errorf("pjsip show settings:\n got %q\nwant %q", got, want)
	}
	q := startPeer(t, observedConfig())
	r = loginAs(t, q, "fan", "fan-secret")
	want = strings.Replace(want, "send_contact_status_on_update_registration : yes", "send_contact_status_on_update_registration : no", 1)
	if got := exchange(r, want, "Action: Command", "ActionID: 1", "Command: pjsip show settings"); got != want {
		t.Errorf("pjsip show settings without the registrar:\n got %q\nwant %q", got, want)
	}
}

// TestPJSIPEmpty: with no endpoints and no transports, as Asterisk 22
// answers (docs/asterisk22.md).
func TestPJSIPEmpty(t *testing.T) {
	p := startPeer(t, Config{AuthFailDelay: -1})
	r := dialRaw(t, p.Addr())
	r.login()
	cases := []struct {
		want  string
		lines []string
	}{
		{"Response: Error\r\nActionID: e1\r\nMessage: No endpoints found\n\r\n\r\n", []string{"Action: PJSIPShowEndpoints", "ActionID: e1"}},
		{msg("Response: Success", "ActionID: e2", "Message: Command output follows", "Output: No objects found.", "Output: "),
			[]string{"Action: Command", "ActionID: e2", "Command: pjsip show transports"}},
	}
	for _, tc := range cases {
		if got := exchange(r, tc.want, tc.lines...); got != tc.want {
			t.Errorf("%s:\n got %q\nwant %q", tc.lines[0], got, tc.want)
		}
	}
	p.SetPJSIP([]Transport{{ID: "t", Bind: "0.0.0.0:5060"}}, []Endpoint{{Name: "7001"}})
	want := msg("Response: Success", "ActionID: e3", "EventList: start", "Message: A listing of Endpoints follows, presented as EndpointList events") +
		msg("Event: EndpointList", "ActionID: e3", "ObjectType: endpoint", "ObjectName: 7001", "Transport: ", "Aor: 7001",
			"Auths: ", "OutboundAuths: ", "Contacts: ", "DeviceState: Unavailable", "ActiveChannels: 0") +
		msg("Event: EndpointListComplete", "ActionID: e3", "EventList: Complete", "ListItems: 1")
	if got := exchange(r, want, "Action: PJSIPShowEndpoints", "ActionID: e3"); got != want {
		t.Errorf("after SetPJSIP:\n got %q\nwant %q", got, want)
	}
}
