package amipeer

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/platform/waittest"
)

// Exchanges observed on Asterisk 22.10.1 (systemname pbx, a phone 6001 at
// sip:6001@127.0.0.1:5370; docs/asterisk22.md, "Registrations as they
// happen"), replayed against the peer's registrar.

var (
	observedNonQualified = msg("Event: ContactStatus", "Privilege: system,all", "SystemName: pbx",
		"URI: sip:6001@127.0.0.1:5370", "ContactStatus: NonQualified", "AOR: 6001", "EndpointName: 6001", "RoundtripUsec: 0")
	observedRemoved = msg("Event: ContactStatus", "Privilege: system,all", "SystemName: pbx",
		"URI: sip:6001@127.0.0.1:5370", "ContactStatus: Removed", "AOR: 6001", "EndpointName: 6001", "RoundtripUsec: 0")
	observedValue = `{"via_addr":"127.0.0.1","qualify_timeout":"3.000000","qualify_2xx_only":"false","call_id":"c2@x",` +
		`"reg_server":"pbx","prune_on_boot":"no","path":"","endpoint":"6001","via_port":"5370","authenticate_qualify":"no",` +
		`"uri":"sip:6001@127.0.0.1:5370","qualify_frequency":"0","user_agent":"obsphone","expiration_time":"1796660576","outbound_proxy":""}`
)

func registrarPeer(t *testing.T, rc RegistrarConfig) *Peer {
	t.Helper()
	p := startPeer(t, Config{SystemName: "pbx"})
	p.EnableRegistrar(rc)
	return p
}

// follow logs in with Events: system and a name(ContactStatus) filter, as
// fan's replicator does.
func follow(t *testing.T, p *Peer) *rawConn {
	t.Helper()
	r := dialRaw(t, p.Addr())
	r.banner()
	r.send("Action: Login", "Username: "+testUser, "Secret: "+testSecret, "Events: system")
	if got := r.read(2 * time.Second); got != msg("Response: Success", "Message: Authentication accepted") {
		t.Fatalf("login: %q", got)
	}
	if got := r.read(2 * time.Second); !strings.HasPrefix(got, "Event: FullyBooted\r\n") {
		t.Fatalf("want FullyBooted, got %q", got)
	}
	r.send("Action: Filter", "ActionID: f1", "Operation: Add", "MatchCriteria: name(ContactStatus)")
	if got, want := r.read(2*time.Second), msg("Response: Success", "ActionID: f1", "Message: Success"); got != want {
		t.Fatalf("filter:\n got %q\nwant %q", got, want)
	}
	return r
}

func phone6001(expires int) Registration {
	return Registration{AOR: "6001", URI: "sip:6001@127.0.0.1:5370", CallID: "c2@x", ViaAddr: "127.0.0.1",
		ViaPort: 5370, UserAgent: "obsphone", Expires: expires}
}

func TestRegistrarAsAsterisk22(t *testing.T) {
	p := registrarPeer(t, RegistrarConfig{RemoveExisting: true})
	r := follow(t, p)

	contacts, exp, err := p.Register(phone6001(300))
	if err != nil || exp != 300 || len(contacts) != 1 {
		t.Fatalf("register: %v %d %v", contacts, exp, err)
	}
	if got := r.read(2 * time.Second); got != observedNonQualified {
		t.Fatalf("new contact:\n got %q\nwant %q", got, observedNonQualified)
	}
	// The key is the AOR and the MD5 of the URI; the value Asterisk's JSON
	// in its order (only expiration_time differs from the observed one).
	key := "/registrar/contact/6001;@1af1a3a283d770c64aeed4e8e68d1b9f"
	v, ok := p.DB()[key]
	if !ok {
		t.Fatalf("no %s in %v", key, p.DB())
	}
	exptime := contacts[0].Expiration.Unix()
	if want := strings.Replace(observedValue, "1796660576", strconv.FormatInt(exptime, 10), 1); v != want {
		t.Fatalf("value:\n got %s\nwant %s", v, want)
	}
	if d := exptime - time.Now().Unix(); d < 299 || d > 300 {
		t.Fatalf("expiration_time %d is %d s away", exptime, d)
	}

	// A refresh raises nothing without send_contact_status_on_update_registration.
	if _, _, err := p.Register(phone6001(300)); err != nil {
		t.Fatal(err)
	}
	r.expectSilence(200 * time.Millisecond)

	// Expires: 0 removes the contact: Removed (PeerStatus is filtered out).
	if contacts, exp, err := p.Register(phone6001(0)); err != nil || exp != 0 || len(contacts) != 0 {
		t.Fatalf("unregister: %v %d %v", contacts, exp, err)
	}
	if got := r.read(2 * time.Second); got != observedRemoved {
		t.Fatalf("removed:\n got %q\nwant %q", got, observedRemoved)
	}
	if _, ok := p.DB()[key]; ok {
		t.Fatal("contact still stored after Expires: 0")
	}

	// DBDel of a missing key, and DBGet of it, as Asterisk answers them.
	r.send("Action: DBDel", "ActionID: d1", "Family: registrar", "Key: contact/6001;@1af1a3a283d770c64aeed4e8e68d1b9f")
	if got, want := r.read(2*time.Second), msg("Response: Error", "ActionID: d1", "Message: Database entry could not be deleted"); got != want {
		t.Fatalf("DBDel missing:\n got %q\nwant %q", got, want)
	}
}

// With events on and no filter a new contact's first registration raises
// PeerStatus, DeviceStateChange and ContactStatus in that order; a session
// that asked for system events only does not get DeviceStateChange (call).
func TestRegistrarEventOrderAndMask(t *testing.T) {
	p := registrarPeer(t, RegistrarConfig{})
	all := dialRaw(t, p.Addr())
	all.banner()
	all.send("Action: Login", "Username: "+testUser, "Secret: "+testSecret)
	all.read(2 * time.Second)
	all.read(2 * time.Second) // FullyBooted
	sys := dialRaw(t, p.Addr())
	sys.banner()
	sys.send("Action: Login", "Username: "+testUser, "Secret: "+testSecret, "Events: system")
	sys.read(2 * time.Second)
	sys.read(2 * time.Second)

	if _, _, err := p.Register(phone6001(300)); err != nil {
		t.Fatal(err)
	}
	wantAll := []string{
		msg("Event: PeerStatus", "Privilege: system,all", "SystemName: pbx", "ChannelType: PJSIP", "Peer: PJSIP/6001", "PeerStatus: Reachable"),
		msg("Event: DeviceStateChange", "Privilege: call,all", "SystemName: pbx", "Device: PJSIP/6001", "State: NOT_INUSE"),
		observedNonQualified,
	}
	for i, w := range wantAll {
		if got := all.read(2 * time.Second); got != w {
			t.Fatalf("event %d:\n got %q\nwant %q", i, got, w)
		}
	}
	for _, w := range []string{wantAll[0], wantAll[2]} {
		if got := sys.read(2 * time.Second); got != w {
			t.Fatalf("system-only session:\n got %q\nwant %q", got, w)
		}
	}
	sys.expectSilence(100 * time.Millisecond)
}

func TestRegistrarRefreshWithStatusOnUpdate(t *testing.T) {
	p := registrarPeer(t, RegistrarConfig{SendContactStatusOnUpdate: true})
	r := follow(t, p)
	for range 2 {
		if _, _, err := p.Register(phone6001(300)); err != nil {
			t.Fatal(err)
		}
		if got := r.read(2 * time.Second); got != observedNonQualified {
			t.Fatalf("got %q", got)
		}
	}
}

// remove_existing: the new contact's NonQualified, then Removed for the one
// it replaced.
func TestRegistrarRemoveExisting(t *testing.T) {
	p := registrarPeer(t, RegistrarConfig{RemoveExisting: true})
	r := follow(t, p)
	if _, _, err := p.Register(phone6001(300)); err != nil {
		t.Fatal(err)
	}
	r.read(2 * time.Second)
	moved := phone6001(300)
	moved.URI, moved.ViaPort = "sip:6001@127.0.0.1:5371", 5371
	contacts, _, err := p.Register(moved)
	if err != nil || len(contacts) != 1 || contacts[0].URI != moved.URI {
		t.Fatalf("moved: %v %v", contacts, err)
	}
	if got, want := r.read(2*time.Second), strings.Replace(observedNonQualified, ":5370", ":5371", 1); got != want {
		t.Fatalf("new: %q", got)
	}
	if got := r.read(2 * time.Second); got != observedRemoved {
		t.Fatalf("replaced: %q", got)
	}
	// Without remove_existing a second contact is refused.
	q := registrarPeer(t, RegistrarConfig{})
	if _, _, err := q.Register(phone6001(300)); err != nil {
		t.Fatal(err)
	}
	if _, _, err := q.Register(moved); err != ErrTooManyContacts {
		t.Fatalf("want ErrTooManyContacts, got %v", err)
	}
}

// A contact that only reached the database (a DBPut, as on a standby) has
// no status: it expires without an event, and the first REGISTER for its
// AOR gives it one (NonQualified) before the refresh's own event.
func TestRegistrarContactFromDBPut(t *testing.T) {
	p := registrarPeer(t, RegistrarConfig{SendContactStatusOnUpdate: true})
	r := follow(t, p)
	c := Contact{AOR: "6001", Endpoint: "6001", URI: "sip:6001@127.0.0.1:5370", CallID: "c2@x", ViaAddr: "127.0.0.1",
		ViaPort: 5370, UserAgent: "obsphone", RegServer: "pbx", Expiration: time.Now().Add(200 * time.Second)}
	p.DBPut("registrar", "contact/"+ContactID(c.AOR, c.URI), c.Value())
	r.expectSilence(100 * time.Millisecond)
	if _, _, err := p.Register(phone6001(300)); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if got := r.read(2 * time.Second); got != observedNonQualified {
			t.Fatalf("got %q", got)
		}
	}

	// Expired: the registered one raises Removed, a DBPut one nothing.
	other := c
	other.AOR, other.Endpoint, other.URI = "6002", "6002", "sip:6002@127.0.0.1:5380"
	other.Expiration = time.Now().Add(-time.Second)
	p.DBPut("registrar", "contact/"+ContactID(other.AOR, other.URI), other.Value())
	if n := p.PruneExpired(time.Now().Add(301 * time.Second)); n != 2 {
		t.Fatalf("pruned %d, want 2", n)
	}
	if got := r.read(2 * time.Second); got != observedRemoved {
		t.Fatalf("got %q", got)
	}
	r.expectSilence(100 * time.Millisecond)
	if n := len(p.Contacts("")); n != 0 {
		t.Fatalf("%d contacts left", n)
	}
}

func TestOriginateDialsContacts(t *testing.T) {
	p := registrarPeer(t, RegistrarConfig{})
	var mu sync.Mutex
	var dialed []string
	p.SetDialer(func(ctx context.Context, cs []Contact) error {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range cs {
			dialed = append(dialed, c.URI)
		}
		return nil
	})
	if _, _, err := p.Register(phone6001(300)); err != nil {
		t.Fatal(err)
	}
	r := dialRaw(t, p.Addr())
	r.login()
	r.send("Action: Originate", "ActionID: o1", "Channel: PJSIP/6001", "Application: Echo", "Async: true")
	if got, want := r.read(2*time.Second), msg("Response: Success", "ActionID: o1", "Message: Originate successfully queued"); got != want {
		t.Fatalf("async: %q", got)
	}
	waittest.Until(t, 2*time.Second, "the dialer called", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(dialed) == 1
	})
	mu.Lock()
	got := slices.Clone(dialed)
	mu.Unlock()
	if got[0] != "sip:6001@127.0.0.1:5370" {
		t.Fatalf("dialed %v", got)
	}
	// Nobody registered: a synchronous Originate fails, an async one is
	// queued all the same (Asterisk answers both so).
	r.send("Action: Originate", "ActionID: o2", "Channel: PJSIP/9999", "Application: Echo", "Timeout: 2000")
	if got, want := r.read(2*time.Second), msg("Response: Error", "ActionID: o2", "Message: Originate failed"); got != want {
		t.Fatalf("sync: %q", got)
	}
	r.send("Action: Originate", "ActionID: o3", "Channel: PJSIP/9999", "Application: Echo", "Async: true")
	if got, want := r.read(2*time.Second), msg("Response: Success", "ActionID: o3", "Message: Originate successfully queued"); got != want {
		t.Fatalf("async nobody: %q", got)
	}
}
