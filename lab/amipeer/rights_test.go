package amipeer

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The files under testdata/asterisk22 are Asterisk 22.10.1's answers, byte
// for byte, to a session configured as observedConfig describes
// (docs/asterisk22.md, "What fanctl doctor asks"): manager.conf users with
// the rights below, pjsip.conf with two transports and two endpoints. Each
// was asked with the ActionID its file's answer carries.

// observedConfig is the peer set up as that Asterisk was.
func observedConfig() Config {
	return Config{
		// startPeer's default user would take the name "fan".
		Username: "admin", Secret: "admin-secret", AuthFailDelay: -1,
		Users: []User{
			{Name: "all", Secret: "all-secret", Read: []string{"all"}, Write: []string{"all"}},
			{Name: "fan", Secret: "fan-secret", Read: []string{"system", "call", "reporting"}, Write: []string{"system", "command", "reporting"}},
			{Name: "cmdonly", Secret: "co-secret", Read: []string{"system"}, Write: []string{"command"}},
			{Name: "norights", Secret: "nr-secret", Read: []string{"call"}, Write: []string{"call"}},
		},
		Transports: []Transport{
			{ID: "transport-float", Bind: "198.51.100.10:5060", ExternalSignalingAddress: "198.51.100.10", ExternalMediaAddress: "198.51.100.10"},
			{ID: "transport-node", Bind: "198.51.100.11:5060", ExternalSignalingAddress: "198.51.100.10", ExternalMediaAddress: "198.51.100.10"},
		},
		Endpoints: []Endpoint{
			{Name: "6001", Transport: "transport-float", Timers: "no", NoDirectMedia: true},
			{Name: "6002"},
		},
	}
}

func observed(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "asterisk22", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// loginAs opens a session as user with Events: off.
func loginAs(t *testing.T, p *Peer, user, secret string) *rawConn {
	t.Helper()
	r := dialRaw(t, p.Addr())
	r.banner()
	r.send("Action: Login", "Username: "+user, "Secret: "+secret, "Events: off")
	if got, want := r.read(2*time.Second), msg("Response: Success", "Message: Authentication accepted"); got != want {
		t.Fatalf("login %s: %q", user, got)
	}
	return r
}

// exchange sends one action and reads until the answer is as long as want.
func exchange(r *rawConn, want string, lines ...string) string {
	r.send(lines...)
	var got strings.Builder
	for got.Len() < len(want) {
		got.WriteString(r.read(2 * time.Second))
	}
	return got.String()
}

// TestRightsAsAsterisk22 checks ListCommands and "Permission denied" against
// what Asterisk 22 answered users of limited rights.
func TestRightsAsAsterisk22(t *testing.T) {
	p := startPeer(t, observedConfig())
	cases := []struct {
		user, secret, file string
		lines              []string
	}{
		{"all", "all-secret", "listcommands-write-all.txt", []string{"Action: ListCommands", "ActionID: 1"}},
		{"fan", "fan-secret", "listcommands-write-system-command-reporting.txt", []string{"Action: ListCommands", "ActionID: 1"}},
		{"cmdonly", "co-secret", "listcommands-write-command.txt", []string{"Action: ListCommands", "ActionID: 1"}},
		{"norights", "nr-secret", "listcommands-write-call.txt", []string{"Action: ListCommands", "ActionID: 1"}},
		{"cmdonly", "co-secret", "coresettings-denied.txt", []string{"Action: CoreSettings", "ActionID: 2"}},
		{"norights", "nr-secret", "command-denied.txt", []string{"Action: Command", "ActionID: 2", "Command: core show channels count"}},
		{"norights", "nr-secret", "dbput-denied.txt", []string{"Action: DBPut", "ActionID: 3", "Family: x", "Key: y", "Val: z"}},
	}
	for _, tc := range cases {
		t.Run(tc.file, func(t *testing.T) {
			r := loginAs(t, p, tc.user, tc.secret)
			want := observed(t, tc.file)
			if got := exchange(r, want, tc.lines...); got != want {
				t.Errorf("%s as %s:\n got %q\nwant %q", tc.lines[0], tc.user, got, want)
			}
		})
	}
	// A denied DBPut must not have written anything.
	if db := p.DB(); len(db) != 0 {
		t.Errorf("denied DBPut wrote %v", db)
	}
}

// TestFullyBootedOnlyWithSystemRead: Asterisk sends FullyBooted after the
// login only to a user who reads class system, and Emit follows the same
// rule for every event that names its classes.
func TestFullyBootedOnlyWithSystemRead(t *testing.T) {
	p := startPeer(t, observedConfig())
	login := func(user, secret string) *rawConn {
		r := dialRaw(t, p.Addr())
		r.banner()
		r.send("Action: Login", "Username: "+user, "Secret: "+secret)
		if got := r.read(2 * time.Second); got != msg("Response: Success", "Message: Authentication accepted") {
			t.Fatalf("login %s: %q", user, got)
		}
		return r
	}
	sys := login("cmdonly", "co-secret")
	if got := sys.read(2 * time.Second); !strings.HasPrefix(got, "Event: FullyBooted\r\nPrivilege: system,all\r\n") {
		t.Errorf("system reader: %q", got)
	}
	call := login("norights", "nr-secret")
	call.expectSilence(200 * time.Millisecond)

	if n := p.Emit(Field{"Event", "ContactStatus"}, Field{"Privilege", "system,all"}, Field{"ContactStatus", "Reachable"}); n != 1 {
		t.Errorf("a system event reached %d sessions, want 1 (the system reader)", n)
	}
	if got := sys.read(2 * time.Second); !strings.HasPrefix(got, "Event: ContactStatus\r\n") {
		t.Errorf("system reader missed the event: %q", got)
	}
	call.expectSilence(200 * time.Millisecond)
	if n := p.Emit(Field{"Event", "Newchannel"}, Field{"Privilege", "call,all"}); n != 1 {
		t.Errorf("a call event reached %d sessions, want 1 (the call reader)", n)
	}
}

// TestWrongUserOrSecret: an unknown user and a wrong secret are refused the
// same way.
func TestWrongUserOrSecret(t *testing.T) {
	p := startPeer(t, observedConfig())
	for _, creds := range [][2]string{{"fan", "wrong"}, {"nobody", "fan-secret"}} {
		r := dialRaw(t, p.Addr())
		r.banner()
		r.send("Action: Login", "Username: "+creds[0], "Secret: "+creds[1])
		if got := r.read(2 * time.Second); got != msg("Response: Error", "Message: Authentication failed") {
			t.Errorf("%v: %q", creds, got)
		}
		r.expectEOF(2 * time.Second)
	}
}
