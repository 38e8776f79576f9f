package astdb

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/fanpbx/fan/lab/amipeer"
	"github.com/fanpbx/fan/pkg/ami"
	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/waittest"
	"github.com/fanpbx/fan/services/replicator/internal/fstree"
)

func peer(t *testing.T) (*amipeer.Peer, *ami.Session) {
	t.Helper()
	p, err := amipeer.Start(amipeer.Config{Username: "fan", Secret: "s", SystemName: "pbx"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	s := ami.NewSession(ami.Config{Addr: p.Addr(), Username: "fan", Secret: "s"}, nil)
	t.Cleanup(func() { s.Close() })
	return p, s
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return c
}

// The key Asterisk 22 stored for sip:6001@127.0.0.1:5370 (observed).
func TestContactKeyAsAsterisk(t *testing.T) {
	if got, want := ContactKey("6001", "sip:6001@127.0.0.1:5370"), "registrar/contact/6001;@1af1a3a283d770c64aeed4e8e68d1b9f"; got != want {
		t.Fatalf("got %s, want %s", got, want)
	}
}

func contact(aor string, port int, expires time.Time) (string, string) {
	c := amipeer.Contact{AOR: aor, Endpoint: aor, URI: fmt.Sprintf("sip:%s@127.0.0.1:%d", aor, port), CallID: aor + "@x",
		ViaAddr: "127.0.0.1", ViaPort: port, RegServer: "pbx", Expiration: expires}
	return ContactKey(c.AOR, c.URI), c.Value()
}

// fill puts n live contacts on p and returns their entries.
func fill(t *testing.T, p *amipeer.Peer, n int) []fstree.Entry {
	t.Helper()
	var es []fstree.Entry
	for i := range n {
		k, v := contact(fmt.Sprint(6000+i), 5000+i, time.Now().Add(time.Hour))
		p.DBPut("registrar", k[len("registrar/"):], v)
		es = append(es, fstree.Entry{Path: k, Kind: fstree.KindValue, Value: v})
	}
	fstree.Sort(es)
	return es
}

// A manifest that lacks many live keys is a wipe: the deletions are held,
// the rest applied. Expired contacts go whatever their number, and a key a
// newer delta changed is left as the delta left it.
func TestApplyManifestHoldsUnexplainedDeletions(t *testing.T) {
	p, s := peer(t)
	es := fill(t, p, 20)
	// The holder lost 15 of them; it has one new contact; two of those
	// the standby has expired already.
	newKey, newVal := contact("6100", 6100, time.Now().Add(time.Hour))
	want := append([]fstree.Entry{}, es[15:]...)
	want = append(want, fstree.Entry{Path: newKey, Kind: fstree.KindValue, Value: newVal})
	fstree.Sort(want)
	for _, i := range []int{0, 1} {
		k, v := contact(fmt.Sprint(6000+i), 5000+i, time.Now().Add(-time.Minute))
		p.DBPut("registrar", k[len("registrar/"):], v)
	}
	newer := es[2].Path // a delta changed it after the manifest was read
	res, err := ApplyManifest(ctx(t), s, []string{"registrar"}, want, ManifestOptions{
		Newer: func(k string) bool { return k == newer }, MaxDeleteShare: 0.1, AllowDeletes: 2, Parallel: 4})
	if err != nil {
		t.Fatal(err)
	}
	if res.Put != 1 || res.Expired != 2 || res.Deleted != 2 || len(res.Held) != 12 || res.Have != 20 {
		t.Fatalf("result %+v", res)
	}
	db := p.DB()
	if _, ok := db["/"+newKey]; !ok {
		t.Fatal("the holder's new contact was not put")
	}
	if _, ok := db["/"+newer]; !ok {
		t.Fatal("a key a newer delta put was deleted")
	}
	for _, k := range res.Held {
		if _, ok := db["/"+k]; !ok {
			t.Fatalf("held key %s deleted", k)
		}
	}
	if res.HeldUntil.Before(time.Now().Add(59*time.Minute)) || res.HeldUntil.After(time.Now().Add(time.Hour+time.Second)) {
		t.Fatalf("held until %v", res.HeldUntil)
	}

	// The holder gets most of them back (its phones re-register): the few
	// still missing stay held, though they are now within the share.
	held := map[string]bool{}
	for _, k := range res.Held {
		held[k] = true
	}
	back := append(append([]fstree.Entry{}, want...), es[2:13]...)
	fstree.Sort(back)
	res, err = ApplyManifest(ctx(t), s, []string{"registrar"}, back, ManifestOptions{
		Held: func(k string) bool { return held[k] }, MaxDeleteShare: 0.1, AllowDeletes: 2})
	if err != nil || res.Deleted != 0 || len(res.Held) != 2 {
		t.Fatalf("after most came back: %+v %v", res, err)
	}

	// Within the share, unexplained deletions are made.
	p2, s2 := peer(t)
	es2 := fill(t, p2, 20)
	res, err = ApplyManifest(ctx(t), s2, []string{"registrar"}, es2[2:], ManifestOptions{MaxDeleteShare: 0.1, AllowDeletes: 0})
	if err != nil || res.Deleted != 2 || len(res.Held) != 0 {
		t.Fatalf("within the share: %+v %v", res, err)
	}
}

// Events become changes: a contact read once at its last status, a
// Removed one deleted without a read, a qualify result that changes
// nothing published as nothing; a reconcile publishes what no event did.
func TestMirrorFollowsEventsAndReconciles(t *testing.T) {
	p, s := peer(t)
	k1, v1 := contact("6001", 5370, time.Now().Add(time.Hour))
	k2, _ := contact("6002", 5380, time.Now().Add(time.Hour))
	p.DBPut("registrar", k1[len("registrar/"):], v1)
	ev := func(aor string, port int, status string) ami.Event {
		return eventOf(t, p, "ContactStatus", aor, fmt.Sprintf("sip:%s@127.0.0.1:%d", aor, port), status)
	}
	m := NewMirror([]string{"registrar"})
	evs := []ami.Event{ev("6001", 5370, "NonQualified"), ev("6001", 5370, "Reachable"), ev("6002", 5380, "Removed")}
	changes, touched, err := m.FromEvents(ctx(t), s, evs, 4)
	if err != nil {
		t.Fatal(err)
	}
	want := []events.AstDBChange{{Key: k1, Value: v1}, {Key: k2, Deleted: true}}
	if fmt.Sprint(changes) != fmt.Sprint(want) || !touched[k1] || !touched[k2] {
		t.Fatalf("changes %v touched %v", changes, touched)
	}
	if dbgets := countActions(p, "DBGet"); dbgets != 1 {
		t.Fatalf("%d DBGet for one contact", dbgets)
	}
	// A qualify result: the value did not change, nothing to publish.
	if changes, _, _ := m.FromEvents(ctx(t), s, []ami.Event{ev("6001", 5370, "Unreachable")}, 4); len(changes) != 0 {
		t.Fatalf("qualify published %v", changes)
	}
	// An unreported refresh is found by a reconcile.
	_, v1b := contact("6001", 5370, time.Now().Add(2*time.Hour))
	p.DBPut("registrar", k1[len("registrar/"):], v1b)
	read, err := Read(ctx(t), s, []string{"registrar"})
	if err != nil {
		t.Fatal(err)
	}
	m.primed = true
	puts, gone, unreported := m.Reconcile(read, []string{"registrar"}, nil)
	if len(puts) != 1 || puts[0].Value != v1b || gone != 0 || unreported != 1 {
		t.Fatalf("reconcile: %v gone %d unreported %d", puts, gone, unreported)
	}
	if es := m.Entries(); len(es) != 1 || es[0].Value != v1b {
		t.Fatalf("entries %v", es)
	}
}

func countActions(p *amipeer.Peer, name string) int {
	n := 0
	for _, a := range p.Actions() {
		if a.Name == name {
			n++
		}
	}
	return n
}

// eventOf makes an event as a session receives it: the peer emits it to a
// session following events.
func eventOf(t *testing.T, p *amipeer.Peer, name, aor, uri, status string) ami.Event {
	t.Helper()
	s := ami.NewSession(ami.Config{Addr: p.Addr(), Username: "fan", Secret: "s", Events: true, EventNames: []string{name}}, nil)
	defer s.Close()
	select {
	case <-s.Gaps():
	case <-time.After(5 * time.Second):
		t.Fatal("no connection")
	}
	fields := []amipeer.Field{{Name: "Event", Value: name}, {Name: "Privilege", Value: "system,all"}, {Name: "URI", Value: uri},
		{Name: "ContactStatus", Value: status}, {Name: "AOR", Value: aor}, {Name: "EndpointName", Value: aor}, {Name: "RoundtripUsec", Value: "0"}}
	waittest.Until(t, 5*time.Second, "a session to emit "+name+" to", func() bool { return p.Emit(fields...) > 0 })
	for {
		select {
		case ev := <-s.Events():
			if ev.Name() == name {
				return ev
			}
		case <-time.After(5 * time.Second):
			t.Fatal("no event")
		}
	}
}
