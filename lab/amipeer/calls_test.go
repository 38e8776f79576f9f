package amipeer

import (
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"
)

// The call-*.txt files under testdata/asterisk22 are Asterisk 22.10.1's
// events and answers for phone 6001 calling 6002 through Dial (6002
// answering, 6001 hanging up), as a user reading system,call,reporting
// received them (docs/asterisk22.md, "Calls: a B2BUA, its dialogs and its
// AMI events"). The ids differ from run to run: normalize replaces them.

var (
	uniqueidRE = regexp.MustCompile(`pbx-\d+\.(\d+)`)
	uuidRE     = regexp.MustCompile(`[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`)
	durationRE = regexp.MustCompile(`Duration: \d\d:\d\d:\d\d`)
)

func normalize(s string) string {
	s = uniqueidRE.ReplaceAllString(s, "pbx-T.$1")
	s = uuidRE.ReplaceAllString(s, "UUID")
	return durationRE.ReplaceAllString(s, "Duration: D")
}

// callConfig is the peer set up as that Asterisk was.
func callConfig() Config {
	return Config{
		Username: "admin", Secret: "admin-secret", AuthFailDelay: -1, SystemName: "pbx",
		Users: []User{
			{Name: "rec", Secret: "rec-secret", Read: []string{"system", "call", "reporting"}, Write: []string{"system", "command", "reporting"}},
			{Name: "fan", Secret: "fan-secret", Read: []string{"system"}, Write: []string{"system", "command"}},
			{Name: "callw", Secret: "callw-secret", Read: []string{"call"}, Write: []string{"call"}},
		},
		Endpoints: []Endpoint{{Name: "6001", Context: "from-phones"}, {Name: "6002", Context: "from-phones"}},
	}
}

// callerVars and calleeVars are the legs' dialogs as Asterisk reported
// them with the call up and its media direct.
var (
	callerVars = LegVars{CallID: "b3cc1200a13d057b@198.51.100.50", LocalTag: "b963f3a1-2b18-4ff0-845a-6c16e243c047",
		RemoteTag: "34caa59d", LocalURI: "<sip:6002@198.51.100.10>", RemoteURI: "<sip:6001@198.51.100.10>",
		TargetURI: "sip:6001@198.51.100.50:5060", RequestURI: "sip:6002@198.51.100.10", RemoteAddr: "198.51.100.50:5060",
		LocalAddr: "198.51.100.10:5060", RTPDest: "198.51.100.50:10000", RTPSrc: "198.51.100.11:14020", RTPDirect: "198.51.100.51:20000"}
	calleeVars = LegVars{CallID: "c91bb727-e5df-47e8-82ce-96178be02bfd", LocalTag: "e0ce68d8-b7a9-4b45-ac36-cc9462a7452e",
		RemoteTag: "831e819d", LocalURI: "<sip:6001@198.51.100.11>", RemoteURI: "<sip:6002@198.51.100.51>",
		TargetURI: "sip:6002@198.51.100.51:5060", RTPDest: "198.51.100.51:20000", RTPSrc: "198.51.100.11:10120", RTPDirect: "198.51.100.50:10000"}
)

// readEvents reads n messages, skipping FullyBooted.
func readEvents(r *rawConn, n int) string {
	var b strings.Builder
	for i := 0; i < n; {
		m := r.read(2 * time.Second)
		if strings.HasPrefix(m, "Event: FullyBooted") {
			continue
		}
		b.WriteString(m)
		i++
	}
	return b.String()
}

func TestCallEventsAsAsterisk22(t *testing.T) {
	p := startPeer(t, callConfig())
	r := dialRaw(t, p.Addr())
	r.banner()
	r.send("Action: Login", "Username: rec", "Secret: rec-secret")
	if got := r.read(2 * time.Second); !strings.Contains(got, "Authentication accepted") {
		t.Fatalf("login: %q", got)
	}
	// A user that reads only system receives none of them.
	sys := dialRaw(t, p.Addr())
	sys.banner()
	sys.send("Action: Login", "Username: fan", "Secret: fan-secret")
	sys.read(2 * time.Second)
	sys.read(2 * time.Second) // FullyBooted

	c := p.StartCall("6001", "6002", "6002", callerVars)
	c.Ringing()
	c.Answered()
	c.SetVars(&callerVars, &calleeVars)
	c.HungUp(true)

	want := normalize(observed(t, "call-events.txt"))
	if got := normalize(readEvents(r, strings.Count(want, "\r\n\r\n"))); got != want {
		t.Errorf("events differ from Asterisk's:\n%s", firstDifference(got, want))
	}
	if m, err := sys.tryRead(200 * time.Millisecond); err == nil {
		t.Errorf("a system-only reader got %q", m)
	}
}

// firstDifference shows where two answers part.
func firstDifference(got, want string) string {
	g, w := strings.Split(got, "\r\n"), strings.Split(want, "\r\n")
	for i := range max(len(g), len(w)) {
		var gl, wl string
		if i < len(g) {
			gl = g[i]
		}
		if i < len(w) {
			wl = w[i]
		}
		if gl != wl {
			return fmt.Sprintf("line %d: got %q, want %q", i+1, gl, wl)
		}
	}
	return "equal"
}

func TestCallActionsAsAsterisk22(t *testing.T) {
	p := startPeer(t, callConfig())
	c := p.StartCall("6001", "6002", "6002", callerVars)
	c.Ringing()
	c.Answered()
	c.SetVars(&callerVars, &calleeVars)
	caller, callee := c.Channels()
	if caller != "PJSIP/6001-00000000" || callee != "PJSIP/6002-00000001" {
		t.Fatalf("channels %s %s", caller, callee)
	}
	rec := loginAs(t, p, "rec", "rec-secret")
	for _, tc := range []struct {
		file  string
		lines []string
	}{
		{"call-coreshowchannels.txt", []string{"Action: CoreShowChannels", "ActionID: act-32"}},
		{"call-bridgelist.txt", []string{"Action: BridgeList", "ActionID: act-61"}},
		{"call-bridgeinfo.txt", []string{"Action: BridgeInfo", "BridgeUniqueid: " + c.BridgeID(), "ActionID: act-62"}},
	} {
		raw := observed(t, tc.file)
		want := normalize(raw)
		if got := normalize(exchange(rec, raw, tc.lines...)); got != want {
			t.Errorf("%s:\n%s", tc.file, firstDifference(got, want))
		}
	}

	// Getvar: every value as Asterisk read it, from the right leg.
	for _, tc := range []struct{ channel, variable, value string }{
		{caller, "CHANNEL(pjsip,call-id)", callerVars.CallID},
		{caller, "CHANNEL(pjsip,local_uri)", "<sip:6002@198.51.100.10>"},
		{caller, "CHANNEL(rtp,direct)", "198.51.100.51:20000"},
		{callee, "CHANNEL(pjsip,target_uri)", "sip:6002@198.51.100.51:5060"},
		{callee, "CHANNEL(pjsip,remote_addr)", ""},
		{callee, "CHANNEL(pjsip,call-id)x", ""},
	} {
		want := msg("Response: Success", "ActionID: g", "Variable: "+tc.variable, "Value: "+tc.value)
		if got := exchange(rec, want, "Action: Getvar", "Channel: "+tc.channel, "Variable: "+tc.variable, "ActionID: g"); got != want {
			t.Errorf("Getvar %s %s: %q", tc.channel, tc.variable, got)
		}
	}
	anchored := callerVars
	anchored.RTPDirect = ""
	c.SetVars(&anchored, nil)
	if want, got := msg("Response: Success", "Variable: CHANNEL(rtp,direct)", "Value: (null)"),
		exchange(rec, msg("Response: Success", "Variable: CHANNEL(rtp,direct)", "Value: (null)"), "Action: Getvar", "Channel: "+caller, "Variable: CHANNEL(rtp,direct)"); got != want {
		t.Errorf("anchored rtp,direct: %q", got)
	}
	if want, got := msg("Response: Error", "ActionID: n", "Message: No such channel"),
		exchange(rec, msg("Response: Error", "ActionID: n", "Message: No such channel"), "Action: Getvar", "Channel: PJSIP/nosuch-00000000", "Variable: CHANNEL(pjsip,call-id)", "ActionID: n"); got != want {
		t.Errorf("no such channel: %q", got)
	}
	// Getvar needs write call or reporting.
	fan := loginAs(t, p, "fan", "fan-secret")
	if want, got := observed(t, "getvar-denied.txt"), exchange(fan, observed(t, "getvar-denied.txt"), "Action: Getvar", "Channel: "+caller, "Variable: CHANNEL(pjsip,call-id)", "ActionID: fan-2"); got != want {
		t.Errorf("denied: %q", got)
	}
	callw := loginAs(t, p, "callw", "callw-secret")
	if got := exchange(callw, msg("Response: Success", "Variable: CHANNEL(pjsip,call-id)", "Value: "+callerVars.CallID), "Action: Getvar", "Channel: "+caller, "Variable: CHANNEL(pjsip,call-id)"); !strings.Contains(got, callerVars.CallID) {
		t.Errorf("write=call: %q", got)
	}

	count := msg("Response: Success", "Message: Command output follows", "Output: 2 active channels", "Output: 1 active call", "Output: 1 call processed")
	if got := exchange(rec, count, "Action: Command", "Command: core show channels count"); got != count {
		t.Errorf("count: %q", got)
	}

	// A crash: nothing left, no event.
	p.DropCalls()
	empty := msg("Response: Success", "EventList: start", "Message: Channels will follow") +
		msg("Event: CoreShowChannelsComplete", "EventList: Complete", "ListItems: 0")
	if got := exchange(rec, empty, "Action: CoreShowChannels"); got != empty {
		t.Errorf("after DropCalls: %q", got)
	}
	for _, tc := range []struct{ lines []string }{
		{[]string{"Action: BridgeInfo", "BridgeUniqueid: nosuch"}},
		{[]string{"Action: BridgeInfo"}},
	} {
		want := msg("Response: Error", "Message: Specified BridgeUniqueid not found")
		if len(tc.lines) == 1 {
			want = msg("Response: Error", "Message: BridgeUniqueid must be provided")
		}
		if got := exchange(rec, want, tc.lines...); got != want {
			t.Errorf("%v: %q", tc.lines, got)
		}
	}
}

func TestCallFailuresRaiseAsterisksEvents(t *testing.T) {
	p := startPeer(t, callConfig())
	r := dialRaw(t, p.Addr())
	r.banner()
	r.send("Action: Login", "Username: rec", "Secret: rec-secret", "Events: call")
	r.read(2 * time.Second)
	names := func(n int) []string {
		var out []string
		for _, m := range strings.Split(strings.TrimSuffix(readEvents(r, n), "\r\n\r\n"), "\r\n\r\n") {
			line := strings.SplitN(m, "\r\n", 2)[0]
			if ch := regexp.MustCompile(`(?m)^(Channel|Device|DialStatus|Cause|TechCause): (.*)$`).FindAllString(m, -1); len(ch) > 0 {
				line += " " + strings.Join(ch, " ")
			}
			out = append(out, strings.ReplaceAll(line, "\r", ""))
		}
		return out
	}
	c := p.StartCall("6001", "6002", "6002", LegVars{})
	c.Ringing()
	c.Busy(486)
	got := names(5 + 5 + 9)[10:]
	want := []string{
		"Event: HangupRequest Channel: PJSIP/6002-00000001 Cause: 17 TechCause: 486",
		"Event: DialEnd Channel: PJSIP/6001-00000000 DialStatus: BUSY",
		"Event: Newstate Channel: PJSIP/6001-00000000",
		"Event: Hangup Channel: PJSIP/6002-00000001 Cause: 17 TechCause: 486",
		"Event: DeviceStateChange Device: PJSIP/6002",
		"Event: HangupRequest Channel: PJSIP/6001-00000000 Cause: 17 TechCause: 486",
		"Event: SoftHangupRequest Channel: PJSIP/6001-00000000 Cause: 16 TechCause: 486",
		"Event: Hangup Channel: PJSIP/6001-00000000 Cause: 17 TechCause: 486",
		"Event: DeviceStateChange Device: PJSIP/6001",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("busy:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	p.Unreachable("6001", "6003", LegVars{})
	got = names(5)
	want = []string{
		"Event: Newchannel Channel: PJSIP/6001-00000002",
		"Event: Newstate Channel: PJSIP/6001-00000002",
		"Event: HangupRequest Channel: PJSIP/6001-00000002 Cause: 34 TechCause: 503",
		"Event: SoftHangupRequest Channel: PJSIP/6001-00000002 Cause: 16 TechCause: 503",
		"Event: Hangup Channel: PJSIP/6001-00000002 Cause: 34 TechCause: 503",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("unreachable:\n%s", strings.Join(got, "\n"))
	}
	c = p.StartCall("6001", "6002", "6002", LegVars{})
	c.Ringing()
	c.Cancelled()
	got = names(5 + 5 + 7)[10:]
	if got[0] != "Event: HangupRequest Channel: PJSIP/6001-00000003 Cause: 127 TechCause: 487" ||
		got[1] != "Event: DialEnd Channel: PJSIP/6001-00000003 DialStatus: CANCEL" ||
		got[5] != "Event: Hangup Channel: PJSIP/6002-00000004 Cause: 127 TechCause: 500" {
		t.Errorf("cancel:\n%s", strings.Join(got, "\n"))
	}
}

// TestHangupAsAsterisk22: AMI Hangup answered and followed as Asterisk
// 22.10.1 did (testdata/asterisk22/hangup-*.txt): refused without write
// class system or call, an error for no channel or one that is gone,
// "Channel Hungup" for a leg of an answered call, which then ends with
// both its channels, with the events Asterisk raised (no HangupRequest:
// the soft hang-up of the channel named). The SIP side, when one is set,
// is told.
func TestHangupAsAsterisk22(t *testing.T) {
	cfg := callConfig()
	cfg.Users = append(cfg.Users, User{Name: "rponly", Secret: "rp-secret", Read: []string{"system", "call"}, Write: []string{"reporting"}})
	p := startPeer(t, cfg)
	r := dialRaw(t, p.Addr())
	r.banner()
	r.send("Action: Login", "Username: rec", "Secret: rec-secret")
	r.read(2 * time.Second)

	c := p.StartCall("6001", "6002", "6002", callerVars)
	c.Ringing()
	c.Answered()
	c.SetVars(&callerVars, &calleeVars)
	readEvents(r, 17) // to the second BridgeEnter (call-events.txt)

	rp := loginAs(t, p, "rponly", "rp-secret")
	if want, got := observed(t, "hangup-denied.txt"), exchange(rp, observed(t, "hangup-denied.txt"), "Action: Hangup", "Channel: PJSIP/6001-00000000", "ActionID: fan-2"); got != want {
		t.Errorf("denied: %q", got)
	}
	fan := loginAs(t, p, "fan", "fan-secret") // write = system: allowed
	for _, tc := range []struct {
		file  string
		lines []string
	}{
		{"hangup-nosuch.txt", []string{"Action: Hangup", "Channel: PJSIP/6009-0000000f", "ActionID: fan-3"}},
		{"hangup-nochannel.txt", []string{"Action: Hangup", "ActionID: fan-4"}},
		{"hangup-ok.txt", []string{"Action: Hangup", "Channel: PJSIP/6001-00000000", "Cause: 16", "ActionID: fan-5"}},
	} {
		if want, got := observed(t, tc.file), exchange(fan, observed(t, tc.file), tc.lines...); got != want {
			t.Errorf("%s: %q", tc.file, got)
		}
	}
	want := normalize(observed(t, "hangup-events.txt"))
	if got := normalize(readEvents(r, strings.Count(want, "\r\n\r\n"))); got != want {
		t.Errorf("events differ from Asterisk's:\n%s", firstDifference(got, want))
	}
	empty := msg("Response: Success", "EventList: start", "Message: Channels will follow") +
		msg("Event: CoreShowChannelsComplete", "EventList: Complete", "ListItems: 0")
	if got := exchange(fan, empty, "Action: CoreShowChannels"); got != empty {
		t.Errorf("channels after the hang-up: %q", got)
	}
	// The other leg went with it: hanging it up finds nothing.
	nosuch := msg("Response: Error", "Message: No such channel")
	if got := exchange(fan, nosuch, "Action: Hangup", "Channel: PJSIP/6002-00000001"); got != nosuch {
		t.Errorf("the callee's leg after the hang-up: %q", got)
	}
	// Nothing more is raised: the call ended once.
	if m, err := r.tryRead(200 * time.Millisecond); err == nil {
		t.Errorf("after the hang-up: %q", m)
	}

	// With a SIP side, it is told which call and channel.
	told := make(chan string, 1)
	p.OnHangup(func(c *Call, channel string) {
		c.HungUpByAMI(channel)
		told <- channel
	})
	c = p.StartCall("6001", "6002", "6002", callerVars)
	c.Answered()
	_, callee := c.Channels()
	if got := exchange(fan, msg("Response: Success", "Message: Channel Hungup"), "Action: Hangup", "Channel: "+callee); !strings.Contains(got, "Channel Hungup") {
		t.Fatalf("hang up %s: %q", callee, got)
	}
	select {
	case ch := <-told:
		if ch != callee {
			t.Errorf("told of %s, hung up %s", ch, callee)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("the SIP side was not told")
	}
}
