package dnsupdate

import (
	"context"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/fanpbx/fan/lab/bindtest"
)

// Two primaries of the zone, one per site, no transfer between them: each
// is moved on its own. A frozen server (its site dark) is unreachable and
// changes nothing on the other; once it answers again it is moved from what
// it still serves; a server holding records of no site is never written.
func TestMoveOnEachPrimary(t *testing.T) {
	ns := bindtest.StartPrimaries(t, 2, "voip.test", zoneFile, updatable...)
	a, b := ns[0], ns[1]
	cfg := testConfig("", a.Secret, "A")
	cfg.Primaries = []string{a.Addr, b.Addr}
	cfg.Timeout = 300 * time.Millisecond
	u := newUpdater(t, cfg)
	ctx := context.Background()

	for _, n := range ns {
		if got, err := u.Read(ctx, n.Addr); err != nil || got.Site != "a" || !got.TTLOK {
			t.Fatalf("read %s: %+v %v, want site a", n.Addr, got, err)
		}
	}

	// Site A goes dark: its server answers nothing.
	a.Signal(t, syscall.SIGSTOP)
	start := time.Now()
	ma, mb := u.MoveOn(ctx, a.Addr, "a", "b"), u.MoveOn(ctx, b.Addr, "a", "b")
	if ma.Outcome != MoveUnreachable || ma.Err == nil || Reachable(ma.Err) {
		t.Fatalf("dark server: %v %v, want unreachable", ma.Outcome, ma.Err)
	}
	if waited := time.Since(start); waited > 2*time.Second {
		t.Errorf("the dark server held the move for %v (timeout %v)", waited, cfg.Timeout)
	}
	if mb.Outcome != MoveUpdated || mb.Before.Site != "a" || mb.Before.Known || mb.After.Site != "b" || mb.After.Serial != 2 {
		t.Fatalf("site B's server: %+v", mb)
	}
	wantRRs(t, b, "sip.voip.test", dns.TypeA, "30 203.0.113.20")
	t.Logf("site B's server moved: accepted %v, verified %v", mb.Accepted, mb.Verified)

	// Back. A frozen named took the connection in its kernel, so the
	// update may be applied now (a dark site's server, whose packets are
	// lost, never sees it); either way it is then moved from what it
	// serves, read first, here site A's records as when it went dark.
	a.Signal(t, syscall.SIGCONT)
	if again := u.MoveOn(ctx, b.Addr, "a", "b"); again.Outcome != MoveAlready {
		t.Fatalf("site B's server again: %v %v, want already served", again.Outcome, again.Err)
	}
	a.SetA(t, "sip.voip.test", "192.0.2.10")
	back := u.MoveOn(ctx, a.Addr, "", "b")
	if back.Outcome != MoveUpdated || back.Before.Site != "a" || !back.Before.Known {
		t.Fatalf("site A's server back: %+v", back)
	}
	wantRRs(t, a, "sip.voip.test", dns.TypeA, "30 203.0.113.20")
	// The arbiter's previous site is not what a server serves (it missed
	// the move): the update on it fails, the server is read and moved.
	a.SetA(t, "sip.voip.test", "192.0.2.10")
	if m := u.MoveOn(ctx, a.Addr, "b", "b"); m.Outcome != MoveUpdated || m.Before.Site != "a" {
		t.Fatalf("a server that missed a move: %v %+v", m.Outcome, m.Before)
	}
	a.SetA(t, "sip.voip.test", "192.0.2.10")
	if m := u.MoveOn(ctx, a.Addr, "b", "a"); m.Outcome != MoveAlready {
		t.Fatalf("a server already on the site, asked from another: %v %v", m.Outcome, m.Err)
	}

	// Someone else writes on one server: that server is left alone and
	// says what it serves; the other still moves.
	b.SetA(t, "sip.voip.test", "198.51.100.99")
	foreign := u.MoveOn(ctx, b.Addr, "b", "a")
	if foreign.Outcome != MoveRefused || foreign.Err == nil || !strings.Contains(foreign.Err.Error(), "198.51.100.99") || foreign.Before.Site != "" {
		t.Fatalf("foreign records: %v %v", foreign.Outcome, foreign.Err)
	}
	wantRRs(t, b, "sip.voip.test", dns.TypeA, "30 198.51.100.99")
	if m := u.MoveOn(ctx, a.Addr, "a", "b"); m.Outcome != MoveUpdated {
		t.Fatalf("site A's server beside it: %v %v", m.Outcome, m.Err)
	}
	wantRRs(t, a, "sip.voip.test", dns.TypeA, "30 203.0.113.20")
}

// primary and primaries exclude each other, servers is refused beside
// primaries, and a server listed twice is refused.
func TestPrimariesConfig(t *testing.T) {
	base := testConfig("", unknownSecret, "A")
	for name, c := range map[string]func(*Config){
		"both": func(c *Config) { c.Primary, c.Primaries = "127.0.0.1:53", []string{"127.0.0.1:54"} },
		"servers": func(c *Config) {
			c.Primaries, c.Servers = []string{"127.0.0.1:53", "127.0.0.1:54"}, []string{"127.0.0.1:55"}
		},
		"twice":      func(c *Config) { c.Primaries = []string{"127.0.0.1:53", "127.0.0.1:53"} },
		"no primary": func(*Config) {},
	} {
		cfg := base
		c(&cfg)
		if _, err := New(cfg, testLog(t)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	cfg := base
	cfg.Primaries = []string{"127.0.0.1:53", "127.0.0.1:54"}
	if _, err := New(cfg, testLog(t)); err != nil {
		t.Fatalf("two primaries refused: %v", err)
	}
}
