package replicate_test

import (
	"fmt"
	"maps"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fanpbx/fan/lab/amipeer"
	"github.com/fanpbx/fan/pkg/ami"
	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/waittest"
	"github.com/fanpbx/fan/services/replicator/internal/replicate"
)

// registrarNode is a node whose AMI peer is a registrar, as Asterisk 22's
// res_pjsip_registrar behaves (lab/amipeer), with
// send_contact_status_on_update_registration=yes as fan requires.
func registrarNode(t *testing.T, name string) *node {
	t.Helper()
	n := newNode(t, name)
	p, err := amipeer.Start(amipeer.Config{Username: "fan", Secret: "s", SystemName: "pbx"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	p.EnableRegistrar(amipeer.RegistrarConfig{SendContactStatusOnUpdate: true, RemoveExisting: true})
	n.peer = p
	return n
}

// following makes n's AstDB tree follow its Asterisk's events, as the
// service does, with no periodic reconcile and no periodic re-check (an
// hour): what reaches the standby in these tests reaches it by deltas, or
// by a reconcile something asked for.
func following(t *testing.T, n *node) func(*replicate.Config) {
	return func(c *replicate.Config) {
		sess := ami.NewSession(ami.Config{Addr: n.peer.Addr(), Username: "fan", Secret: "s", Events: true,
			EventMask: "system", EventNames: []string{"ContactStatus"}, EventBuffer: 4096}, nil)
		t.Cleanup(func() { sess.Close() })
		c.ScanInterval = time.Hour
		for i := range c.Trees {
			if c.Trees[i].Name == "astdb" {
				c.Trees[i].AMI, c.Trees[i].Watch, c.Trees[i].Reconcile = sess, sess, time.Hour
			}
		}
	}
}

func phone(i, port int, expires int) amipeer.Registration {
	user := fmt.Sprintf("%d", 7000+i)
	return amipeer.Registration{AOR: user, URI: fmt.Sprintf("sip:%s@127.0.0.1:%d", user, port), CallID: user + "@bench",
		ViaAddr: "127.0.0.1", ViaPort: port, UserAgent: "fan-test", Expires: expires}
}

func register(t *testing.T, n *node, r amipeer.Registration) {
	t.Helper()
	if _, _, err := n.peer.Register(r); err != nil {
		t.Fatal(err)
	}
}

// registrar is the node's registrar family.
func registrar(n *node) map[string]string {
	out := map[string]string{}
	for k, v := range n.peer.DB() {
		if strings.HasPrefix(k, "/registrar/") {
			out[k] = v
		}
	}
	return out
}

func (l *lab) sameRegistrar(what string, a, b *node) {
	l.t.Helper()
	waittest.Succeeds(l.t, l.patience(10*time.Second), what, func() error {
		ra, rb := registrar(a), registrar(b)
		if !maps.Equal(ra, rb) {
			return fmt.Errorf("%s has %d contacts, %s %d", a.name, len(ra), b.name, len(rb))
		}
		return nil
	})
}

// count counts the actions named name that n's Asterisk received.
func count(n *node, name string) int {
	c := 0
	for _, a := range n.peer.Actions() {
		if a.Name == name {
			c++
		}
	}
	return c
}

func startPair(t *testing.T) (*lab, *node, *node) {
	l := newLab(t)
	n1, n2 := registrarNode(t, "n1"), registrarNode(t, "n2")
	mark := l.mark()
	l.start(n1, following(t, n1))
	l.start(n2, following(t, n2))
	l.setHolder("n1", 1)
	l.waitCaughtUp(mark, "n1", "n2", "astdb", 1)
	return l, n1, n2
}

// TestRegistrationsAsTheyHappen: a registration, a refresh and an
// unregistration on the holder reach the standby by themselves, the
// standby writing each without reading its family first.
func TestRegistrationsAsTheyHappen(t *testing.T) {
	l, n1, n2 := startPair(t)
	trees := count(n2, "DBGetTree")
	for i := range 20 {
		register(t, n1, phone(i, 20000+i, 300))
	}
	l.sameRegistrar("registrations carried", n1, n2)
	// A refresh changes expiration_time and the call's CSeq-borne fields;
	// Asterisk reports it with the setting on. A longer expiry moves
	// expiration_time without waiting for the clock's next second.
	for i := range 5 {
		r := phone(i, 20000+i, 600)
		r.UserAgent = "refreshed"
		register(t, n1, r)
	}
	l.sameRegistrar("refreshes carried", n1, n2)
	for i := 5; i < 8; i++ {
		register(t, n1, phone(i, 20000+i, 0))
	}
	l.sameRegistrar("unregistrations carried", n1, n2)
	if len(registrar(n2)) != 17 {
		t.Fatalf("standby has %d contacts, want 17", len(registrar(n2)))
	}
	if got := count(n2, "DBGetTree"); got != trees {
		t.Fatalf("the standby read its family %d times for 28 changes", got-trees)
	}
	if puts, dels := count(n2, "DBPut"), count(n2, "DBDel"); puts < 25 || dels < 3 {
		t.Fatalf("standby got %d DBPut and %d DBDel", puts, dels)
	}
}

// TestMassChurnReplicatesWipeIsHeld: 30 % of the phones unregistering at
// once and 10 % coming back from new addresses reach the standby whole,
// whatever the safety share; a holder whose Asterisk comes back with an
// empty database (nothing reported) has its deletions held back and
// said, while the registrations made after it still flow.
func TestMassChurnReplicatesWipeIsHeld(t *testing.T) {
	l, n1, n2 := startPair(t)
	const phones = 60
	for i := range phones {
		register(t, n1, phone(i, 21000+i, 300))
	}
	l.sameRegistrar("all registered", n1, n2)

	mark := l.mark()
	var wg sync.WaitGroup
	for i := range phones * 3 / 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			register(t, n1, phone(i, 21000+i, 0))
		}()
	}
	wg.Wait()
	for i := range phones / 10 {
		// From a new address: remove_existing replaces the old contact.
		register(t, n1, phone(phones-1-i, 22000+i, 300))
	}
	l.sameRegistrar("the churn carried", n1, n2)
	if n := len(registrar(n2)); n != phones-phones*3/10 {
		t.Fatalf("standby has %d contacts, want %d", n, phones-phones*3/10)
	}
	if _, p, i := l.find(mark, func(_ events.Envelope, p events.Payload) bool {
		_, held := p.(*events.ReplicationHeld)
		_, alarm := p.(*events.ReplicationAlarm)
		return held || alarm
	}); i >= 0 {
		t.Fatalf("the churn raised %+v", p)
	}

	// n1's Asterisk restarts with an empty database: nothing is reported,
	// n1's replicator reconnects, reconciles and publishes an empty manifest.
	before := registrar(n2)
	mark = l.mark()
	n1.peer.Restart(false)
	var held *events.ReplicationHeld
	waittest.Succeeds(l.t, l.patience(10*time.Second), "deletions held back and said", func() error {
		_, p, i := l.find(mark, func(_ events.Envelope, p events.Payload) bool {
			_, ok := p.(*events.ReplicationHeld)
			return ok
		})
		if i < 0 {
			return fmt.Errorf("no replication.held")
		}
		held = p.(*events.ReplicationHeld)
		return nil
	})
	if held.Node != "n2" || held.Source != "n1" || held.Held != int64(len(before)) || held.TargetKeys != int64(len(before)) ||
		len(held.Keys) == 0 || held.Until.IsZero() {
		t.Fatalf("held: %+v (standby had %d)", held, len(before))
	}
	// A phone registering now still reaches the standby.
	register(t, n1, phone(0, 23000, 300))
	key := "/registrar/contact/" + amipeer.ContactID("7000", "sip:7000@127.0.0.1:23000")
	waittest.Succeeds(l.t, l.patience(10*time.Second), "a registration after the wipe carried", func() error {
		if _, ok := registrar(n2)[key]; !ok {
			return fmt.Errorf("not on n2")
		}
		return nil
	})
	for k, v := range before {
		if registrar(n2)[k] != v {
			t.Fatalf("held contact %s changed on the standby", k)
		}
	}
	if _, p, i := l.find(mark, func(_ events.Envelope, p events.Payload) bool {
		_, ok := p.(*events.ReplicationAlarm)
		return ok
	}); i >= 0 {
		t.Fatalf("the wipe stopped replication: %+v", p)
	}
}

// TestStandbyCatchesUpAfterMissingDeltas: a standby whose replicator was
// down while phones registered catches up when it comes back, by asking
// the holder for a reconcile, without waiting for the periodic one.
func TestStandbyCatchesUpAfterMissingDeltas(t *testing.T) {
	// Every first manifest counts as stale: the holder's last one is older
	// than the registrations below, as it would be after a while.
	prev := replicate.SetStaleManifest(0)
	t.Cleanup(func() { replicate.SetStaleManifest(prev) })
	l := newLab(t)
	n1, n2 := registrarNode(t, "n1"), registrarNode(t, "n2")
	mark := l.mark()
	l.start(n1, following(t, n1))
	stop2 := l.start(n2, following(t, n2))
	l.setHolder("n1", 1)
	l.waitCaughtUp(mark, "n1", "n2", "astdb", 1)
	stop2()
	for i := range 10 {
		register(t, n1, phone(i, 24000+i, 300))
	}
	l.start(n2, following(t, n2))
	l.sameRegistrar("caught up after a restart", n1, n2)
}
