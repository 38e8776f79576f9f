package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/fanpbx/fan/lab/netlab"
	"github.com/fanpbx/fan/lab/phone"
	"github.com/fanpbx/fan/lab/stack"
	"github.com/fanpbx/fan/pkg/platform/waittest"
)

// TestCallsCarriedAcrossSwitchover: a planned move carries a direct-media
// call and leaves nothing behind. A calls B through the floating address
// on n1 (fan's stand-in, a B2BUA as Asterisk 22 is); `fanctl switchover
// --to n2` moves the group without waiting for the call, which n2 adopts.
// What must be true:
//
//   - the call stays up through the move: no BYE or 481 reaches either
//     phone, and the audio still flows between them after it;
//   - n1's PBX still has the call's two channels while n2 keeps it (its
//     replicator must not hang up a live call: that would end it);
//   - A hangs up: B is told within 2 s by a BYE from the floating address;
//   - then n1's replicator, seeing n2's kept record go, hangs up n1's two
//     channels: n1's PBX has none left, no record of the call remains in
//     the bucket, and neither phone is in a call again (the PBX's requests
//     in their finished dialogs are answered 481).
func TestCallsCarriedAcrossSwitchover(t *testing.T) {
	opts := stack.Options{PBX: stack.PBXStandIn, Endpoints: []stack.Endpoint{
		{User: "6001", Password: "pw-6001"}, {User: "6002", Password: "pw-6002"},
	}}
	ctx, l, st := startCallLab(t, 4*time.Minute, opts)
	vip := netip.AddrPortFrom(l.FloatingIP().Addr(), netlab.SIPPort)
	if err := st.WaitHolder(ctx, "n1", 60*time.Second); err != nil {
		t.Fatalf("initial placement: %v", err)
	}
	var a, b *phone.Phone
	for _, pt := range []struct {
		host, user string
		answers    bool
		p          **phone.Phone
	}{{"pa", "6001", false, &a}, {"pb", "6002", true, &b}} {
		p, err := st.NewPhone(pt.host, pt.user, 5061, func(c *phone.Config) {
			c.AutoAnswer, c.AnswerAfter, c.MediaTimeout = pt.answers, 100*time.Millisecond, 5*time.Second
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Close)
		*pt.p = p
		if err := stack.RegisterPhone(ctx, p, 30*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, p := range []*phone.Phone{a, b} {
				t.Logf("phone %s: %+v\n%s", p.User(), p.Status(), phoneEvents(p))
			}
		}
	})

	if err := a.Call(ctx, b.User()); err != nil {
		t.Fatalf("A calls B: %v", err)
	}
	waitPhone(t, ctx, b, "answered", 5*time.Second, func(s phone.Status) bool { return s.Up() })
	for _, pair := range [][2]*phone.Phone{{a, b}, {b, a}} {
		waitPhone(t, ctx, pair[0], "media direct to "+pair[1].User(), 5*time.Second, func(s phone.Status) bool { return s.Media == pair[1].RTPAddr() })
		waitAudio(t, pair[1], pair[0].RTPAddr(), 10)
	}
	if keys := waitRecords(t, ctx, st, 1, 5*time.Second); len(keys) != 1 {
		t.Fatalf("call records before the move: %v", keys)
	}
	// The arbiter reads what a move would carry from n1's calls summary,
	// restated every 2 s: let one carry the record.
	time.Sleep(3 * time.Second)

	asked := time.Now()
	out, err := st.Fanctl(ctx, "--cluster", st.Cluster(), "--operator", "alice", "switchover", "--to", "n2", "--reason", "carry the calls")
	if err != nil {
		t.Fatalf("fanctl switchover: %v\n%s", err, out)
	}
	if err := st.WaitHolder(ctx, "n2", 30*time.Second); err != nil {
		t.Fatalf("the switchover with only a carriable call up: %v\n%s", err, out)
	}
	t.Logf("switchover asked to n2 holding: %v (fanctl: %s)", time.Since(asked).Round(time.Millisecond), strings.TrimSpace(string(out)))
	waitCallKeys(t, ctx, st, "kept", 1, 30*time.Second, "the carried call kept")

	// The call is up, its audio flows, and n1's PBX still has it.
	before := map[*phone.Phone]uint64{a: a.RTP().Sources[b.RTPAddr()], b: b.RTP().Sources[a.RTPAddr()]}
	time.Sleep(2 * time.Second)
	for p, n := range before {
		if s := p.Status(); !s.Up() {
			t.Fatalf("%s's call ended with the move: %+v", p.User(), s)
		}
		peer := b
		if p == b {
			peer = a
		}
		waitAudio(t, p, peer.RTPAddr(), n+25)
		for _, ev := range p.Events() {
			if ev.Dir == "in" && !ev.At.Before(asked) && (ev.What == "BYE" || strings.HasPrefix(ev.What, "481")) {
				t.Errorf("%s received %s from %s during the move", p.User(), ev.What, ev.Peer)
			}
		}
	}
	if ch, _, err := st.PBXChannels(ctx, "n1"); err != nil || ch != 2 {
		t.Errorf("n1's PBX while n2 keeps the call: %d channels (%v), want its 2", ch, err)
	}

	// A hangs up at n2: B is told, then n1's channels go.
	hangup := time.Now()
	if err := a.Hangup(ctx); err != nil {
		t.Logf("A's BYE: %v", err) // n2's PBX answers it 481
	}
	checkToldBy(t, ctx, b, "A's hangup", hangup, vip)
	waittest.Succeeds(t, 15*time.Second, "n1's channels of the carried call gone after it ended at n2", func() error {
		ch, _, err := st.PBXChannels(ctx, "n1")
		if err == nil && ch != 0 {
			err = fmt.Errorf("n1's PBX still has %d channels", ch)
		}
		return err
	})
	t.Logf("n1's channels of the carried call gone %v after A's hangup", time.Since(hangup).Round(time.Millisecond))
	waitCallKeys(t, ctx, st, "kept", 0, 10*time.Second, "no kept records left after the call ended")
	waitCallKeys(t, ctx, st, "calls", 0, 10*time.Second, "no call records left after n1's channels went")
	// n1's PBX ended its dialogs too: the phones answered 481 and stay idle.
	time.Sleep(time.Second)
	for _, p := range []*phone.Phone{a, b} {
		if s := p.Status(); s.Up() {
			t.Errorf("%s is in a call again: %+v", p.User(), s)
		}
		for _, ev := range p.Events() {
			if ev.Dir == "out" && ev.At.After(hangup) && strings.HasPrefix(ev.What, "200") && ev.CSeq != "" && !strings.HasSuffix(ev.CSeq, "BYE") {
				t.Errorf("%s accepted %s from %s after the call ended", p.User(), ev.CSeq, ev.Peer)
			}
		}
	}
}

// waitCallKeys waits until the calls bucket holds n records of kind
// ("calls", "kept").
func waitCallKeys(t *testing.T, ctx context.Context, st *stack.Stack, kind string, n int, within time.Duration, what string) {
	t.Helper()
	waittest.Succeeds(t, within, what, func() error {
		keys, err := callKeys(ctx, st, kind)
		if err == nil && len(keys) != n {
			err = fmt.Errorf("%d %s records, want %d: %v", len(keys), kind, n, keys)
		}
		return err
	})
}
