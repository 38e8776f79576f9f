package ami

import (
	"testing"
	"time"

	"github.com/fanpbx/fan/lab/amipeer"
	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/waittest"
)

func contactStatus(uri, status string) []amipeer.Field {
	return []amipeer.Field{{Name: "Event", Value: "ContactStatus"}, {Name: "Privilege", Value: "system,all"},
		{Name: "URI", Value: uri}, {Name: "ContactStatus", Value: status}, {Name: "AOR", Value: "6001"},
		{Name: "EndpointName", Value: "6001"}, {Name: "RoundtripUsec", Value: "0"}}
}

func waitGap(t *testing.T, s *Session) {
	t.Helper()
	select {
	case <-s.Gaps():
	case <-time.After(5 * time.Second):
		t.Fatal("no gap signalled")
	}
}

func nextEvent(t *testing.T, s *Session) Event {
	t.Helper()
	select {
	case ev := <-s.Events():
		return ev
	case <-time.After(5 * time.Second):
		t.Fatal("no event")
	}
	return Event{}
}

// nextContactStatus skips the FullyBooted each login brings (Asterisk
// sends it with the login's answer, before any filter is added).
func nextContactStatus(t *testing.T, s *Session) Event {
	t.Helper()
	for {
		if ev := nextEvent(t, s); ev.Name() != "FullyBooted" {
			return ev
		}
	}
}

// emitWhenLoggedIn emits once the peer has a session with events on (the
// session's connection may still be logging in when the test emits).
func emitWhenLoggedIn(t *testing.T, p *amipeer.Peer, fields []amipeer.Field) {
	t.Helper()
	waittest.Until(t, 5*time.Second, "a session taking events", func() bool { return p.Emit(fields...) > 0 })
}

// A following session connects by itself, asks for system events and the
// named ones only, signals a gap on every connection and carries events
// across a reconnection it makes without any action being called.
func TestSessionFollowsEventsAcrossReconnects(t *testing.T) {
	t.Parallel()
	p := startPeer(t, amipeer.Config{})
	cfg := cfgFor(p)
	cfg.Events, cfg.EventMask, cfg.EventNames = true, "system", []string{"ContactStatus"}
	s := NewSession(cfg, nil)
	defer s.Close()

	waitGap(t, s)
	acts := p.Actions()
	if len(acts) < 2 || acts[0].Field("Events") != "system" || acts[1].Name != "Filter" ||
		acts[1].Field("MatchCriteria") != "name(ContactStatus)" || acts[1].Field("Operation") != "Add" {
		t.Fatalf("login and filter sent as %+v", acts)
	}
	emitWhenLoggedIn(t, p, contactStatus("sip:6001@127.0.0.1:5370", "NonQualified"))
	if ev := nextContactStatus(t, s); ev.Name() != "ContactStatus" || ev.Field("ContactStatus") != "NonQualified" {
		t.Fatalf("got %q", ev.String())
	}
	// Asterisk does not even send what the filter leaves out.
	if n := p.Emit(amipeer.Field{Name: "Event", Value: "PeerStatus"}, amipeer.Field{Name: "Privilege", Value: "system,all"}); n != 0 {
		t.Fatalf("PeerStatus written to %d filtered sessions", n)
	}

	// Asterisk restarts: the session dials again on its own and says so.
	p.DropSessions()
	waitGap(t, s)
	emitWhenLoggedIn(t, p, contactStatus("sip:6001@127.0.0.1:5370", "Removed"))
	if ev := nextContactStatus(t, s); ev.Field("ContactStatus") != "Removed" {
		t.Fatalf("after the reconnection got %q", ev.String())
	}
	if n := s.DroppedEvents(); n != 0 {
		t.Fatalf("dropped %d", n)
	}
}

// A reader that falls behind loses events, and each loss is counted and
// signalled; the answers to actions never wait for the reader.
func TestSessionEventOverflowIsCountedAndSignalled(t *testing.T) {
	t.Parallel()
	p := startPeer(t, amipeer.Config{})
	cfg := cfgFor(p)
	cfg.Events, cfg.EventBuffer = true, 4
	s := NewSession(cfg, nil)
	defer s.Close()
	waitGap(t, s)
	// FullyBooted came with the login: the queue holds it.
	for i := range 10 {
		emitWhenLoggedIn(t, p, contactStatus("sip:6001@127.0.0.1:"+formatPort(i), "NonQualified"))
	}
	// An action is answered while the queue is full.
	r, err := s.Action(ctxFor(t, 2*time.Second), "Ping")
	if err != nil || !r.Success() {
		t.Fatalf("Ping while the queue is full: %v %v", r, err)
	}
	// Ping's answer came after every event: all were handed over by then.
	if n := s.DroppedEvents(); n != 7 {
		t.Fatalf("dropped %d, want 7 (11 events, room for 4)", n)
	}
	waitGap(t, s)
	for range 4 {
		nextEvent(t, s)
	}
	emitWhenLoggedIn(t, p, contactStatus("sip:6001@127.0.0.1:9999", "Removed"))
	if ev := nextEvent(t, s); ev.Field("URI") != "sip:6001@127.0.0.1:9999" {
		t.Fatalf("after draining got %q", ev.String())
	}
}

func formatPort(i int) string { return string(rune('0'+i/10)) + string(rune('0'+i%10)) }

// A user who may not add filters (no system write) still follows events:
// unfiltered, with a warning.
func TestSessionFilterRefusedEventsUnfiltered(t *testing.T) {
	t.Parallel()
	p := startPeer(t, amipeer.Config{Users: []amipeer.User{
		{Name: "reader", Secret: "r", Read: []string{"system"}, Write: []string{"reporting"}}}})
	cfg := Config{Addr: p.Addr(), Username: "reader", Secret: "r", Events: true, EventNames: []string{"ContactStatus"}}
	s := NewSession(cfg, nil)
	defer s.Close()
	waitGap(t, s)
	emitWhenLoggedIn(t, p, []amipeer.Field{{Name: "Event", Value: "PeerStatus"}, {Name: "Privilege", Value: "system,all"}})
	for {
		ev := nextEvent(t, s)
		if ev.Name() == "FullyBooted" {
			continue
		}
		if ev.Name() != "PeerStatus" {
			t.Fatalf("got %q", ev.String())
		}
		break
	}
}

func TestEventSelectionValidated(t *testing.T) {
	t.Parallel()
	for _, cfg := range []Config{
		{Events: true, EventMask: "system\r\nAction: Bogus"},
		{Events: true, EventNames: []string{"Contact)Status"}},
		{Events: true, EventNames: []string{""}},
	} {
		cfg.Addr, cfg.Username, cfg.Secret = "127.0.0.1:1", "u", "s"
		if _, err := Dial(ctxFor(t, time.Second), cfg, nil); err == nil || Classify(err) == events.ErrorRefused {
			t.Errorf("%+v: want a refusal before dialing, got %v", cfg, err)
		}
	}
}
