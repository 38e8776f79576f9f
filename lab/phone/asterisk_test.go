package phone_test

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fanpbx/fan/lab/asterisktest"
	"github.com/fanpbx/fan/lab/phone"
	"github.com/fanpbx/fan/lab/stack"
	"github.com/fanpbx/fan/pkg/platform/waittest"
)

// The phone against a real Asterisk 22 (FAN_ASTERISK names the install),
// configured as fan ships it (deploy/asterisk, through the lab's
// stack.WriteAsteriskEtc): in one namespace of its own, the node's and
// the floating address and the phones' on its loopback.

var (
	nodeAddr  = netip.MustParseAddr("198.51.100.11")
	floating  = netip.MustParseAddr("198.51.100.10")
	endpoints = []stack.Endpoint{{User: "6001", Password: "pw6001"}, {User: "6002", Password: "pw6002"},
		{User: "6003", Password: "pw6003", Anchored: true}, {User: "6004", Password: "pw6004", Anchored: true}}
)

type asteriskLab struct {
	*asterisktest.Node
}

func startAsterisk(t *testing.T) *asteriskLab {
	t.Helper()
	n := asterisktest.New(t, "fph", stack.AsteriskEtc{NodeAddr: nodeAddr, Floating: floating, AMISecret: "phone-test", Endpoints: endpoints})
	n.Start(t)
	return &asteriskLab{n}
}

// phoneOn makes a phone in the namespace at addr.
func (l *asteriskLab) phoneOn(t *testing.T, user, addr string, answer bool) *phone.Phone {
	t.Helper()
	var p *phone.Phone
	var err error
	pw := ""
	for _, e := range endpoints {
		if e.User == user {
			pw = e.Password
		}
	}
	l.NS.Do(t, func() {
		p, err = phone.New(phone.Config{User: user, Password: pw, Server: netip.AddrPortFrom(floating, 5060),
			Addr: netip.MustParseAddrPort(addr), AutoAnswer: answer, AnswerAfter: 50 * time.Millisecond})
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// register registers p, waiting for Asterisk to start answering.
func register(t *testing.T, p *phone.Phone) {
	t.Helper()
	waittest.Succeeds(t, 60*time.Second, "register "+p.User(), func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		return p.Register(ctx)
	})
}

func wait(t *testing.T, p *phone.Phone, what string, within time.Duration, cond func(phone.Status) bool) phone.Status {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	s, err := p.Wait(ctx, cond)
	if err != nil {
		t.Fatalf("%s: %v\n%s", what, err, eventLines(p))
	}
	return s
}

func eventLines(p *phone.Phone) string {
	var b strings.Builder
	for _, e := range p.Events() {
		fmt.Fprintf(&b, "  %s %s %-5s %-40s %-14s %s in_dialog=%v retrans=%v %s\n", p.User(), e.At.Format("15:04:05.000"), e.Dir, e.What, e.CSeq, e.Peer, e.InDialog, e.Retransmission, e.Note)
	}
	return b.String()
}

// received waits until rx got n packets from from.
func received(t *testing.T, rx *phone.Phone, from netip.AddrPort, n uint64) {
	t.Helper()
	waittest.Succeeds(t, 10*time.Second, fmt.Sprintf("%s receiving %d packets from %s", rx.User(), n, from), func() error {
		if got := rx.RTP(); got.Sources[from] < n {
			return fmt.Errorf("received %+v", got)
		}
		return nil
	})
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return c
}

// TestAsteriskDirectMedia: 6001 calls 6002 through the floating address;
// Asterisk answers, bridges, and re-INVITEs both phones to send their
// audio to each other; a hold is accepted; the hangup reaches the other
// phone as a BYE in its dialog. The anchored endpoints' audio stays on
// Asterisk's media address.
func TestAsteriskDirectMedia(t *testing.T) {
	l := startAsterisk(t)
	a := l.phoneOn(t, "6001", "198.51.100.51:5060", false)
	b := l.phoneOn(t, "6002", "198.51.100.52:5060", true)
	register(t, a)
	register(t, b)
	if err := a.Call(ctx(t), "6002"); err != nil {
		t.Fatalf("%v\n%s%s", err, eventLines(a), eventLines(b))
	}
	wait(t, b, "b up", 5*time.Second, func(s phone.Status) bool { return s.Up() })
	wait(t, a, "a's audio to b", 5*time.Second, func(s phone.Status) bool { return s.Media == b.RTPAddr() })
	wait(t, b, "b's audio to a", 5*time.Second, func(s phone.Status) bool { return s.Media == a.RTPAddr() })
	received(t, a, b.RTPAddr(), 25)
	received(t, b, a.RTPAddr(), 25)
	t.Logf("direct media: a %+v, b %+v", a.RTP().Sources, b.RTP().Sources)

	if err := a.Hold(ctx(t)); err != nil {
		t.Fatalf("hold: %v\n%s", err, eventLines(a))
	}
	if s := a.Status(); !s.Up() || !s.Holding {
		t.Fatalf("after hold: %+v", s)
	}
	if err := a.Resume(ctx(t)); err != nil {
		t.Fatalf("resume: %v\n%s", err, eventLines(a))
	}
	wait(t, a, "a's audio to b after resume", 5*time.Second, func(s phone.Status) bool { return s.Up() && s.Media == b.RTPAddr() })

	hangup := time.Now()
	if err := a.Hangup(ctx(t)); err != nil {
		t.Fatal(err)
	}
	sb := wait(t, b, "b told", 5*time.Second, func(s phone.Status) bool { return s.State == phone.StateEnded })
	if sb.Reason != phone.ReasonByeReceived {
		t.Fatalf("b: %+v", sb)
	}
	for _, e := range b.Events() {
		if e.Dir == "in" && e.What == "BYE" {
			t.Logf("b's BYE from %s, in dialog %v, %v after a's hangup", e.Peer, e.InDialog, e.At.Sub(hangup).Round(time.Millisecond))
		}
	}
	t.Logf("a: %s", a.Status().Reason)
	t.Logf("signalling seen by b:\n%s", eventLines(b))
}

// TestAsteriskAnchored: endpoints with direct_media = no keep their audio
// on Asterisk's media addresses (the address of the transport each leg
// uses: the floating one for the caller's INVITE to it, the node's own for
// Asterisk's INVITE to the callee), never the other phone's.
func TestAsteriskAnchored(t *testing.T) {
	l := startAsterisk(t)
	c := l.phoneOn(t, "6003", "198.51.100.51:5062", false)
	d := l.phoneOn(t, "6004", "198.51.100.52:5062", true)
	register(t, c)
	register(t, d)
	if err := c.Call(ctx(t), "6004"); err != nil {
		t.Fatalf("%v\n%s", err, eventLines(c))
	}
	wait(t, d, "d up", 5*time.Second, func(s phone.Status) bool { return s.Up() })
	time.Sleep(time.Second) // no re-INVITE is coming
	for _, p := range []*phone.Phone{c, d} {
		s := p.Status()
		if s.Media.Addr() != floating && s.Media.Addr() != nodeAddr {
			t.Fatalf("%s sends to %s, want one of Asterisk's addresses (%s, %s)", p.User(), s.Media, floating, nodeAddr)
		}
		t.Logf("%s sends its audio to Asterisk at %s", p.User(), s.Media)
		// Asterisk's RTP socket is bound to every address; on this one
		// loopback the kernel gives its packets the phone's own address as
		// their source, so only the port tells them apart.
		if st := p.RTP(); st.LastFrom.Port() != s.Media.Port() || st.Received < 25 {
			t.Fatalf("%s received %+v, want audio from Asterisk's port %d", p.User(), st, s.Media.Port())
		}
	}
	if err := d.Hangup(ctx(t)); err != nil {
		t.Fatal(err)
	}
	wait(t, c, "c told", 5*time.Second, func(s phone.Status) bool { return s.State == phone.StateEnded && s.Reason == phone.ReasonByeReceived })
}

// TestAsteriskLostDialog: Asterisk killed and started again with a call
// up (the dialogs are gone, as on the other node after a failover): the
// audio goes on phone to phone, a hold is answered 481 and ends the
// caller's call, and the other phone hears nothing of it.
func TestAsteriskLostDialog(t *testing.T) {
	l := startAsterisk(t)
	a := l.phoneOn(t, "6001", "198.51.100.51:5064", false)
	b := l.phoneOn(t, "6002", "198.51.100.52:5064", true)
	register(t, a)
	register(t, b)
	if err := a.Call(ctx(t), "6002"); err != nil {
		t.Fatal(err)
	}
	wait(t, a, "a's audio to b", 5*time.Second, func(s phone.Status) bool { return s.Media == b.RTPAddr() })
	wait(t, b, "b's audio to a", 5*time.Second, func(s phone.Status) bool { return s.Media == a.RTPAddr() })

	kill := time.Now()
	l.Proc.Signal(t, syscall.SIGKILL)
	<-l.Proc.Done()
	l.Start(t)
	// Asterisk answers again: a REGISTER of a third phone goes through.
	register(t, l.phoneOn(t, "6003", "198.51.100.51:5066", false))
	if g := b.Gap(kill, time.Now()); g.Packets == 0 {
		t.Fatalf("b received no audio across Asterisk's restart: %+v", g)
	} else {
		t.Logf("longest gap at b across Asterisk's restart: %v (%d packets)", g.Longest.Round(time.Millisecond), g.Packets)
	}
	err := a.Hold(ctx(t))
	sa := a.Status()
	if err == nil || sa.State != phone.StateEnded || sa.Reason != phone.ReasonRequest481 {
		t.Fatalf("hold after the restart: %v, %+v\n%s", err, sa, eventLines(a))
	}
	time.Sleep(time.Second)
	if sb := b.Status(); !sb.Up() {
		t.Fatalf("b: %+v", sb)
	}
	t.Logf("b is left up with nobody to tell it: the orphaned leg fan's keeper ends")
}
