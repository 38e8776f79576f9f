package e2e

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/fanpbx/fan/lab/netlab"
	"github.com/fanpbx/fan/lab/phone"
	"github.com/fanpbx/fan/lab/stack"
	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/waittest"
	"github.com/nats-io/nats.go/jetstream"
)

// TestCallsSurviveFailover: calls between phones through the floating
// address outlive the holder's PBX. Six phones on two client hosts (pa,
// pb) register through the floating address with n1's PBX (fan's
// stand-in, a B2BUA as Asterisk 22 is; with FAN_ASTERISK a real Asterisk
// 22 with deploy/asterisk's configuration); A calls B and C calls D with
// direct media, E calls F with its audio through the PBX
// (direct_media = no). Then n1's PBX is killed (kill -9) and fan moves the
// address to n2. What must be true:
//
//   - per direct-media call, the audio between the phones never stops for
//     as long as a failover could have made it stop: the longest gap of
//     each direction, from the phones' receive times, stays below half the
//     lab's detection time (check interval × fall: 300 ms), not counting
//     the part of a silence during which the sending phone itself did
//     not send (a loaded machine's scheduling stalls the phone, not the
//     path). Phones send every 20 ms and their audio passes no node, so
//     nothing fan does may show there; half the detection time is still
//     shorter than any gap a failure could cause (it lasts at least until
//     the failure is detected);
//   - the calls are still up 2 minutes later (FAN_CALLS_HOLD sets the
//     time): no BYE reached them, no 481 ended them;
//   - A hangs up: B is told within 2 s, by a BYE in its dialog from the
//     floating address; both are idle;
//   - C puts the call on hold (a re-INVITE, which nobody can carry out now):
//     the call ends on both sides, D told within 2 s the same way;
//   - no leg is left up: every phone idle, n2's PBX has no channel, and no
//     kept call remains in the bucket;
//   - the anchored call lost its audio at the kill and ended (its phones
//     hang up on silence after 3 s), and the claim's result says one call
//     was not adopted because its media was anchored, two adopted.
func TestCallsSurviveFailover(t *testing.T) {
	hold := 2 * time.Minute
	if v := os.Getenv("FAN_CALLS_HOLD"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("FAN_CALLS_HOLD=%q: %v", v, err)
		}
		hold = d
	}
	opts := stack.Options{PBX: stack.PBXStandIn, Endpoints: []stack.Endpoint{
		{User: "6001", Password: "pw-6001"}, {User: "6002", Password: "pw-6002"},
		{User: "6003", Password: "pw-6003"}, {User: "6004", Password: "pw-6004"},
		{User: "6005", Password: "pw-6005", Anchored: true}, {User: "6006", Password: "pw-6006", Anchored: true},
	}}
	if a := os.Getenv("FAN_ASTERISK"); a != "" {
		opts.PBX, opts.Asterisk = stack.PBXAsterisk, a
	}
	ctx, l, st := startCallLab(t, hold+3*time.Minute, opts)
	vip := netip.AddrPortFrom(l.FloatingIP().Addr(), netlab.SIPPort)
	// Half the lab's detection time (check interval × fall): any gap a
	// failure caused lasts at least the whole of it.
	gapBound := 200 * time.Millisecond * 3 / 2

	if err := st.WaitHolder(ctx, "n1", 60*time.Second); err != nil {
		t.Fatalf("initial placement: %v", err)
	}
	type party struct {
		host, user string
		port       uint16
		answers    bool
		silence    time.Duration
	}
	parties := []party{
		{"pa", "6001", 5061, false, 5 * time.Second}, {"pb", "6002", 5061, true, 5 * time.Second},
		{"pa", "6003", 5062, false, 5 * time.Second}, {"pb", "6004", 5062, true, 5 * time.Second},
		{"pa", "6005", 5063, false, 3 * time.Second}, {"pb", "6006", 5063, true, 3 * time.Second},
	}
	ph := map[string]*phone.Phone{}
	for _, pt := range parties {
		p, err := st.NewPhone(pt.host, pt.user, pt.port, func(c *phone.Config) {
			c.AutoAnswer, c.AnswerAfter, c.MediaTimeout = pt.answers, 100*time.Millisecond, pt.silence
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Close)
		ph[pt.user] = p
		if err := stack.RegisterPhone(ctx, p, 30*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	a, b, c, d, e, f := ph["6001"], ph["6002"], ph["6003"], ph["6004"], ph["6005"], ph["6006"]
	t.Cleanup(func() {
		if t.Failed() {
			for _, p := range []*phone.Phone{a, b, c, d, e, f} {
				t.Logf("phone %s: %+v\n%s", p.User(), p.Status(), phoneEvents(p))
			}
		}
	})

	for _, call := range [][2]*phone.Phone{{a, b}, {c, d}, {e, f}} {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := call[0].Call(cctx, call[1].User())
		cancel()
		if err != nil {
			t.Fatalf("%s calls %s: %v", call[0].User(), call[1].User(), err)
		}
		waitPhone(t, ctx, call[1], "answered", 5*time.Second, func(s phone.Status) bool { return s.Up() })
	}
	// Direct media: each phone sends to the other, and hears it.
	for _, pair := range [][2]*phone.Phone{{a, b}, {b, a}, {c, d}, {d, c}} {
		tx, rx := pair[0], pair[1]
		waitPhone(t, ctx, tx, "media direct to "+rx.User(), 5*time.Second, func(s phone.Status) bool { return s.Media == rx.RTPAddr() })
		waitAudio(t, rx, tx.RTPAddr(), 10)
	}
	// Anchored: each phone sends to the PBX's media address (the floating
	// one, or n1's own).
	n1, _ := l.Host("n1")
	for _, p := range []*phone.Phone{e, f} {
		if s := p.Status(); s.Media.Addr() != vip.Addr() && s.Media.Addr() != n1.Addr.Addr() {
			t.Fatalf("anchored phone %s sends to %s, want n1's PBX", p.User(), s.Media)
		}
		waitAudio(t, p, p.Status().Media, 10)
	}
	// The recorder writes a call's record within about a second of the
	// answer or of the media going direct; the kill comes after them (the
	// adoption checked at the end needs them), and
	// after a second of audio every way (the gaps are measured from a
	// second before it).
	records := waitRecords(t, ctx, st, 3, 5*time.Second)
	t.Logf("call records before the kill: %v", records)
	time.Sleep(time.Second)

	kill := time.Now()
	if err := st.CrashPBX("n1"); err != nil {
		t.Fatal(err)
	}
	if err := st.WaitHolder(ctx, "n2", 30*time.Second); err != nil {
		t.Fatalf("failover: %v", err)
	}
	t.Logf("n1's PBX killed; n2 holds the floating address %v later", time.Since(kill).Round(time.Millisecond))

	// The anchored call lost its audio with n1's PBX and ends: its phones
	// hang up on the silence.
	for _, p := range []*phone.Phone{e, f} {
		s := waitPhone(t, ctx, p, "anchored call ended", 10*time.Second, func(s phone.Status) bool { return !s.Up() })
		if !strings.HasPrefix(s.Reason, phone.ReasonNoAudio) {
			t.Errorf("anchored %s ended %q, want on its silence (%s)", p.User(), s.Reason, phone.ReasonNoAudio)
		}
		t.Logf("anchored call at %s: %s", p.User(), s.Reason)
	}

	// The direct calls stay up, their audio flowing, for the hold.
	direct := []*phone.Phone{a, b, c, d}
	until := kill.Add(hold)
	for time.Now().Before(until) {
		for _, p := range direct {
			if s := p.Status(); !s.Up() {
				t.Fatalf("%s's call ended %v after the kill: %s", p.User(), time.Since(kill).Round(time.Second), s.Reason)
			}
		}
		select {
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		case <-time.After(min(5*time.Second, time.Until(until))):
		}
	}
	end := time.Now()
	peer := map[*phone.Phone]*phone.Phone{a: b, b: a, c: d, d: c}
	for _, p := range direct {
		g := p.Gap(kill.Add(-time.Second), end)
		t.Logf("%s: longest gap %v of %d packets received from a second before the kill to %v after it (%s's own longest stall in sending: %v)",
			p.User(), g.Longest.Round(time.Millisecond), g.Packets, end.Sub(kill).Round(time.Second), peer[p].User(), peer[p].RTP().SendStall.Round(time.Millisecond))
		// Each silence counts only for the part the sending phone's own
		// stalls at that moment (a loaded machine's scheduling) do not
		// cover.
		for _, g := range p.GapsOver(kill.Add(-time.Second), end, gapBound) {
			stalls := peer[p].SendStalls(g.At, g.At.Add(g.Longest))
			if u := g.Unexplained(stalls); u >= gapBound {
				t.Errorf("%s's audio stopped for %v at %s (+%v after the kill), %v of it not while %s stalled in sending; bound %v",
					p.User(), g.Longest.Round(time.Millisecond), g.At.Format("15:04:05.000"), g.At.Sub(kill).Round(time.Millisecond),
					u.Round(time.Millisecond), peer[p].User(), gapBound)
			} else if len(stalls) > 0 {
				t.Logf("%s: a silence of %v at +%v, all but %v of it while %s stalled in sending", p.User(), g.Longest.Round(time.Millisecond),
					g.At.Sub(kill).Round(time.Millisecond), u.Round(time.Millisecond), peer[p].User())
			}
		}
		for _, ev := range p.Events() {
			if ev.At.Before(kill) || ev.Dir != "in" {
				continue
			}
			if ev.What == "BYE" || strings.HasPrefix(ev.What, "481") {
				t.Errorf("%s received %s from %s %v after the kill, while nobody hung up", p.User(), ev.What, ev.Peer, ev.At.Sub(kill).Round(time.Millisecond))
			}
		}
	}

	// A hangs up: B is told by a BYE in its dialog from the floating
	// address, within 2 s.
	hangup := time.Now()
	if err := a.Hangup(ctx); err != nil {
		t.Logf("A's BYE: %v", err) // the new holder's PBX answers it 481, or nobody does
	}
	checkToldBy(t, ctx, b, "A's hangup", hangup, vip)

	// C holds: nobody can carry out the re-INVITE, so the call ends on
	// both sides, D told within 2 s the same way.
	holdAt := time.Now()
	if err := c.Hold(ctx); err == nil && c.Status().Up() {
		t.Errorf("C's hold succeeded with n1's PBX dead and the call still up: %+v", c.Status())
	}
	sc := waitPhone(t, ctx, c, "C's call ended after its hold", 5*time.Second, func(s phone.Status) bool { return !s.Up() })
	t.Logf("C after its hold: %s", sc.Reason)
	checkToldBy(t, ctx, d, "C's hold", holdAt, vip)

	// No leg left up.
	for _, p := range []*phone.Phone{a, b, c, d, e, f} {
		if s := p.Status(); s.Up() {
			t.Errorf("%s still has its call up: %+v", p.User(), s)
		}
	}
	if ch, calls, err := st.PBXChannels(ctx, "n2"); err != nil || ch != 0 {
		t.Errorf("n2's PBX: %d channels, %d calls (%v), want none", ch, calls, err)
	}
	waitCallKeys(t, ctx, st, "kept", 0, 10*time.Second, "no kept calls left in "+events.CallsBucket+" after both calls ended")

	// The trail: the claim's result says what was adopted and what not.
	checkAdoption(t, ctx, st, 2, map[string]int{events.NotAdoptedAnchored: 1})
}

// startCallLab is startLab with the phones' client hosts (netlab.PhoneHosts).
func startCallLab(t *testing.T, within time.Duration, opts stack.Options) (context.Context, *netlab.Lab, *stack.Stack) {
	t.Helper()
	stack.RequireLab(t)
	ctx, cancel := context.WithTimeout(context.Background(), within)
	t.Cleanup(cancel)
	opts.BinDir = stack.BinDirForTest(t)
	opts.Log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	spec := netlab.Spec{Logger: opts.Log, Clients: netlab.PhoneHosts()}
	l, err := netlab.Build(ctx, opts.Topology.LabSpec(spec))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := l.Close(); err != nil {
			t.Errorf("lab close: %v", err)
		}
	})
	st, err := stack.Start(ctx, l, opts)
	if st != nil {
		t.Cleanup(func() {
			if t.Failed() {
				t.Log(st.Logs(3000))
			}
			st.Stop()
		})
	}
	if err != nil {
		t.Fatal(err)
	}
	return ctx, l, st
}

func waitPhone(t *testing.T, ctx context.Context, p *phone.Phone, what string, within time.Duration, cond func(phone.Status) bool) phone.Status {
	t.Helper()
	wctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	s, err := p.Wait(wctx, cond)
	if err != nil {
		t.Fatalf("%s %s: %v", p.User(), what, err)
	}
	return s
}

// waitAudio waits until rx has n packets from from.
func waitAudio(t *testing.T, rx *phone.Phone, from netip.AddrPort, n uint64) {
	t.Helper()
	waittest.Succeeds(t, 5*time.Second, fmt.Sprintf("%s hearing %d packets from %s", rx.User(), n, from), func() error {
		if got := rx.RTP().Sources; got[from] < n {
			return fmt.Errorf("hears %v", got)
		}
		return nil
	})
}

// checkToldBy asserts p's call ended by a BYE in its dialog from the
// floating address, within 2 s of since.
func checkToldBy(t *testing.T, ctx context.Context, p *phone.Phone, cause string, since time.Time, vip netip.AddrPort) {
	t.Helper()
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	s, err := p.Wait(wctx, func(s phone.Status) bool { return !s.Up() })
	if err != nil {
		t.Errorf("%s not told of %s within 5 s: %v", p.User(), cause, err)
		return
	}
	var bye *phone.Event
	for _, ev := range p.Events() {
		if ev.Dir == "in" && ev.What == "BYE" && ev.InDialog && !ev.At.Before(since) {
			bye = &ev
			break
		}
	}
	switch {
	case bye == nil:
		t.Errorf("%s's call ended (%s) after %s with no BYE in its dialog", p.User(), s.Reason, cause)
	case bye.At.Sub(since) > 2*time.Second:
		t.Errorf("%s told of %s %v later, want within 2 s", p.User(), cause, bye.At.Sub(since).Round(time.Millisecond))
	case bye.Peer != vip:
		t.Errorf("%s's BYE came from %s, want the floating address %s", p.User(), bye.Peer, vip)
	default:
		t.Logf("%s told of %s by a BYE from %s %v later", p.User(), cause, bye.Peer, bye.At.Sub(since).Round(time.Millisecond))
	}
}

func phoneEvents(p *phone.Phone) string {
	var b strings.Builder
	for _, e := range p.Events() {
		fmt.Fprintf(&b, "  %s %-5s %-36s %-14s %-21s in_dialog=%v %s\n", e.At.Format("15:04:05.000"), e.Dir, e.What, e.CSeq, e.Peer, e.InDialog, e.Note)
	}
	return b.String()
}

// callKeys lists the group's keys of prefix (calls or kept) in the calls
// bucket; a bucket that does not exist has none.
func callKeys(ctx context.Context, st *stack.Stack, prefix string) ([]string, error) {
	nc, js, err := st.Connect(netlab.ControlHost)
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	kv, err := js.KeyValue(ctx, events.CallsBucket)
	if err != nil {
		return nil, err
	}
	keys, err := kv.Keys(ctx)
	if errors.Is(err, jetstream.ErrNoKeysFound) {
		return nil, nil
	}
	var out []string
	for _, k := range keys {
		if strings.HasPrefix(k, prefix+"."+st.Cluster()+".") {
			out = append(out, k)
		}
	}
	return out, err
}

// waitRecords waits until n calls are recorded and fails the test if they
// are not within the bound: a failover carries only recorded calls, so
// without the records what follows would test nothing but their absence.
func waitRecords(t *testing.T, ctx context.Context, st *stack.Stack, n int, within time.Duration) []string {
	t.Helper()
	var keys []string
	waittest.Succeeds(t, within, fmt.Sprintf("%d calls recorded in %s", n, events.CallsBucket), func() error {
		var err error
		if keys, err = callKeys(ctx, st, "calls"); err != nil {
			return err
		}
		if len(keys) < n {
			return fmt.Errorf("%d of %d recorded: %v", len(keys), n, keys)
		}
		return nil
	})
	return keys
}

// checkAdoption finds the failover's claim on n2 in the trail and its
// adoption: in the claim's result, or in a calls.adopted event citing it.
func checkAdoption(t *testing.T, ctx context.Context, st *stack.Stack, adopted int, notAdopted map[string]int) {
	t.Helper()
	var (
		chain stack.FailoverChain
		got   *events.CallsAdoption
	)
	waittest.Succeeds(t, 10*time.Second, "the adoption of the calls in the trail of the failover n1 -> n2", func() error {
		evs, err := st.Events(ctx)
		if err != nil {
			return err
		}
		if chain, err = stack.FindFailoverChain(evs, "n1", "n2"); err != nil {
			return err
		}
		got = chain.Result.Payload.(*events.CommandResult).Calls
		if got != nil && got.Deferred {
			got = nil
			for _, e := range evs {
				if ca, ok := e.Payload.(*events.CallsAdopted); ok && ca.CommandID == chain.Claim.Env.ID {
					got = &ca.Calls
				}
			}
		}
		if got == nil {
			return fmt.Errorf("claim's result %+v", chain.Result.Payload)
		}
		return nil
	})
	t.Logf("claim on n2: adopted %d, not adopted %v, from %v", got.Adopted, got.NotAdopted, got.From)
	if got.Adopted != adopted || got.Error != "" {
		t.Errorf("the claim adopted %d calls (error %q), want %d", got.Adopted, got.Error, adopted)
	}
	for reason, n := range notAdopted {
		if got.NotAdopted[reason] != n {
			t.Errorf("the claim left %d calls as %s, want %d (%v)", got.NotAdopted[reason], reason, n, got.NotAdopted)
		}
	}
	// fanctl explain of the claim's result says it too, and why.
	out, err := st.Fanctl(ctx, "--cluster", st.Cluster(), "explain", chain.Result.Env.ID)
	if err != nil {
		t.Errorf("fanctl explain %s: %v: %s", chain.Result.Env.ID, err, out)
		return
	}
	t.Logf("fanctl explain of the claim's result:\n%s", out)
	for reason := range notAdopted {
		if !strings.Contains(string(out), reason) {
			t.Errorf("fanctl explain of the claim's result does not say why calls were lost (%s)", reason)
		}
	}
}
