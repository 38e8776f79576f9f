package calls_test

import (
	"context"
	"io"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/fanpbx/fan/lab/asterisktest"
	"github.com/fanpbx/fan/lab/netlab"
	"github.com/fanpbx/fan/lab/netlab/netlabtest"
	"github.com/fanpbx/fan/lab/phone"
	"github.com/fanpbx/fan/lab/stack"
	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/bus/bustest"
	"github.com/fanpbx/fan/pkg/platform/waittest"
	"github.com/fanpbx/fan/services/replicator/internal/calls"
)

// The recorder against a real Asterisk 22 (FAN_ASTERISK names the
// install), configured as fan ships it (deploy/asterisk, its manager user
// included, through the lab's stack.WriteAsteriskEtc), in a namespace of
// its own with the node's, the floating and the phones' addresses on its
// loopback; phones of the lab's (lab/phone) call through the floating
// address.

var (
	astNode     = netip.MustParseAddr("198.51.100.11")
	astFloating = netip.MustParseAddr("198.51.100.10")
	astPhones   = []stack.Endpoint{{User: "6001", Password: "pw6001"}, {User: "6002", Password: "pw6002"},
		{User: "6003", Password: "pw6003", Anchored: true}, {User: "6004", Password: "pw6004", Anchored: true}}
)

const astSecret = "recorder-test"

type asteriskNode struct {
	*asterisktest.Node
	// ami is a loopback address of the test's own namespace that reaches
	// Asterisk's AMI in the node's namespace.
	ami string
}

func startAsteriskNode(t *testing.T) *asteriskNode {
	t.Helper()
	n := &asteriskNode{Node: asterisktest.New(t, "frec", stack.AsteriskEtc{NodeAddr: astNode, Floating: astFloating,
		AMISecret: astSecret, Endpoints: astPhones})}
	n.ami = forwardAMI(t, n.NS)
	n.Start(t)
	return n
}

// forwardAMI listens on the test's loopback and carries each connection to
// 127.0.0.1:5038 inside ns: the recorder's AMI session dials again by
// itself, from whatever thread, and a thread is in a namespace only
// inside netlab.InNamespace.
func forwardAMI(t *testing.T, ns netlabtest.NS) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				var up net.Conn
				err := netlab.InNamespace(ns.Handle, func() error {
					var err error
					up, err = net.DialTimeout("tcp", "127.0.0.1:5038", time.Second)
					return err
				})
				if err != nil {
					return
				}
				defer up.Close()
				done := make(chan struct{}, 2)
				go func() { _, _ = io.Copy(up, c); done <- struct{}{} }()
				go func() { _, _ = io.Copy(c, up); done <- struct{}{} }()
				<-done
			}()
		}
	}()
	return ln.Addr().String()
}

func (n *asteriskNode) phone(t *testing.T, user, addr string, answer bool) *phone.Phone {
	t.Helper()
	pw := ""
	for _, e := range astPhones {
		if e.User == user {
			pw = e.Password
		}
	}
	var p *phone.Phone
	var err error
	n.NS.Do(t, func() {
		p, err = phone.New(phone.Config{User: user, Password: pw, Server: netip.AddrPortFrom(astFloating, 5060),
			Addr: netip.MustParseAddrPort(addr), AutoAnswer: answer, AnswerAfter: 50 * time.Millisecond})
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	waittest.Succeeds(t, 60*time.Second, "register "+user, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		return p.Register(ctx)
	})
	return p
}

// call has from call to and waits until both are up; it returns when the
// callee answered (its state's change).
func call(t *testing.T, from, to *phone.Phone) time.Time {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := from.Call(ctx, to.User()); err != nil {
		t.Fatalf("%s calls %s: %v", from.User(), to.User(), err)
	}
	s, err := to.Wait(ctx, func(s phone.Status) bool { return s.Up() })
	if err != nil {
		t.Fatalf("%s answers: %v", to.User(), err)
	}
	return s.Since
}

func hangup(t *testing.T, p *phone.Phone) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.Hangup(ctx); err != nil {
		t.Fatalf("%s hangs up: %v", p.User(), err)
	}
}

// recordOf finds the record of the call whose caller's leg has callID.
func (l *lab) recordOf(callID string) (events.CallRecord, bool) {
	for _, r := range l.records() {
		if len(r.Legs) == 2 && r.Legs[0].CallID == callID {
			return r, true
		}
	}
	return events.CallRecord{}, false
}

// TestAsteriskRecords: with the shipped manager user, a direct-media call
// and an anchored one are recorded moments after the answer, each with its
// media as it is; a restarted recorder keeps the record of the call still
// up, deletes the one of the call that ended while it was away; a hang-up
// deletes the record.
func TestAsteriskRecords(t *testing.T) {
	n := startAsteriskNode(t)
	s := bustest.Server(t)
	b := bustest.Connect(t, s, bus.Identity{Cluster: cluster, Service: "replicator", Node: "n1"})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	kv, err := b.CallsKV(ctx)
	if err != nil {
		t.Fatal(err)
	}
	l := &lab{t: t, bus: b, kv: kv, node: "n1", ctx: ctx}
	l.hold("n1", 1)
	a := n.phone(t, "6001", "198.51.100.51:5060", false)
	bb := n.phone(t, "6002", "198.51.100.52:5060", true)
	c := n.phone(t, "6003", "198.51.100.51:5062", false)
	d := n.phone(t, "6004", "198.51.100.52:5062", true)
	r := l.startAMI(n.ami, "fan", astSecret)
	waittest.Until(t, 20*time.Second, "a first summary", func() bool { return r.last().Holder })

	answered := call(t, a, bb)
	var direct events.CallRecord
	waittest.Until(t, 10*time.Second, "the direct call's record", func() bool {
		var ok bool
		direct, ok = l.recordOf(a.Status().CallID)
		return ok
	})
	t.Logf("direct call recorded %v after the callee answered", time.Since(answered).Round(time.Millisecond))
	if !direct.Carriable() || direct.Media != events.MediaDirect {
		t.Fatalf("the direct call's record: %+v", direct)
	}
	if direct.Legs[1].CallID != bb.Status().CallID || direct.Legs[0].RemoteAddr != "198.51.100.51:5060" ||
		!strings.Contains(direct.Legs[1].RemoteTarget, "198.51.100.52:5060") {
		t.Fatalf("the direct call's dialogs do not match the phones': %+v", direct.Legs)
	}

	answered = call(t, c, d)
	var anchored events.CallRecord
	waittest.Until(t, 10*time.Second, "the anchored call's record", func() bool {
		var ok bool
		anchored, ok = l.recordOf(c.Status().CallID)
		return ok
	})
	t.Logf("anchored call recorded %v after the callee answered", time.Since(answered).Round(time.Millisecond))
	if anchored.Media != events.MediaAnchored || anchored.Carriable() || anchored.Complete() != nil {
		t.Fatalf("the anchored call's record: %+v", anchored)
	}
	waittest.Until(t, 10*time.Second, "the summary", func() bool {
		s := r.last()
		return s.Calls == 2 && s.Carriable == 1 && s.Anchored == 1 && s.Channels == 4 && s.CarriedChannels == 2
	})

	// The recorder away while the anchored call ends.
	r.stop()
	hangup(t, d)
	r = l.startAMI(n.ami, "fan", astSecret)
	waittest.Until(t, 20*time.Second, "the records reconciled after the restart", func() bool {
		_, gone := l.recordOf(c.Status().CallID)
		_, kept := l.recordOf(a.Status().CallID)
		return !gone && kept && len(l.records()) == 1
	})

	// The phones' hold: the record follows its media, whatever Asterisk
	// does with it, and comes back direct after the resume.
	hctx, hcancel := context.WithTimeout(ctx, 10*time.Second)
	defer hcancel()
	if err := a.Hold(hctx); err != nil {
		t.Fatalf("hold: %v", err)
	}
	time.Sleep(time.Second)
	held, _ := l.recordOf(a.Status().CallID)
	t.Logf("on hold, the record says %s", held.Media)
	if err := a.Resume(hctx); err != nil {
		t.Fatalf("resume: %v", err)
	}
	waittest.Until(t, 10*time.Second, "the record direct after the resume", func() bool {
		rec, ok := l.recordOf(a.Status().CallID)
		return ok && rec.Media == events.MediaDirect
	})

	hung := time.Now()
	hangup(t, a)
	waittest.Until(t, 10*time.Second, "the record deleted at the hang-up", func() bool { return len(l.records()) == 0 })
	t.Logf("record deleted %v after the hang-up", time.Since(hung).Round(time.Millisecond))
	waittest.Until(t, 10*time.Second, "an empty summary", func() bool {
		s := r.last()
		return s.Calls == 0 && s.Channels == 0
	})
	if n := metric(t, r.reg, "fan_replicator_call_events_dropped_total"); n != 0 {
		t.Errorf("%v events dropped", n)
	}
}

// TestAsteriskHangsUpCarriedCall: after a planned move, a direct call the
// new holder keeps is ended by its phones there (their dialogs over, as
// the keeper leaves them); when its kept record goes, the recorder hangs
// the call's channels up with the shipped manager user (write = system:
// AMI Hangup), and Asterisk's requests in the phones' old dialogs (a
// re-INVITE to take the audio back, BYEs) are answered 481 and not sent
// again: nothing reaches a user.
func TestAsteriskHangsUpCarriedCall(t *testing.T) {
	n := startAsteriskNode(t)
	s := bustest.Server(t)
	b := bustest.Connect(t, s, bus.Identity{Cluster: cluster, Service: "replicator", Node: "n1"})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	kv, err := b.CallsKV(ctx)
	if err != nil {
		t.Fatal(err)
	}
	l := &lab{t: t, bus: b, kv: kv, node: "n1", ctx: ctx}
	l.hold("n1", 1)
	a := n.phone(t, "6001", "198.51.100.51:5060", false)
	bb := n.phone(t, "6002", "198.51.100.52:5060", true)
	r := l.startAMI(n.ami, "fan", astSecret)
	waittest.Until(t, 20*time.Second, "a first summary", func() bool { return r.last().Holder })
	call(t, a, bb)
	var rec events.CallRecord
	waittest.Until(t, 10*time.Second, "the call's record", func() bool {
		var ok bool
		rec, ok = l.recordOf(a.Status().CallID)
		return ok && rec.Carriable()
	})

	// The phones' dialogs end elsewhere: phones on the same addresses that
	// know no call answer Asterisk 481, as phones do once a keeper's BYE
	// ended their dialogs.
	addrs := []string{"198.51.100.51:5060", "198.51.100.52:5060"}
	var after []*phone.Phone
	for i, p := range []*phone.Phone{a, bb} {
		user := p.User()
		p.Close()
		var np *phone.Phone
		n.NS.Do(t, func() {
			np, err = phone.New(phone.Config{User: user, Server: netip.AddrPortFrom(astFloating, 5060), Addr: netip.MustParseAddrPort(addrs[i])})
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(np.Close)
		after = append(after, np)
	}

	l.hold("n2", 2)
	kept := l.keep("n2", rec)
	waittest.Until(t, 10*time.Second, "the call seen kept by n2", func() bool {
		return metricWith(t, r.reg, "fan_replicator_moved_calls", "state", "kept") == 1
	})
	if s := r.last(); s.Channels != 2 {
		t.Fatalf("channels before the end: %+v", s)
	}
	ended := time.Now()
	l.unkeep(kept)
	waittest.Until(t, 10*time.Second, "Asterisk's channels gone", func() bool {
		s := r.last()
		return s.Channels == 0 && s.At.After(ended)
	})
	t.Logf("channels gone %v after the kept record", time.Since(ended).Round(time.Millisecond))
	waittest.Until(t, 10*time.Second, "the record deleted", func() bool {
		_, ok := l.recordOf(rec.Legs[0].CallID)
		return !ok
	})
	// Every retransmission would come within 32 s; the first ones within
	// a second and a half (T1, 2·T1): none came.
	time.Sleep(2 * time.Second)
	for _, p := range after {
		requests := map[string]int{}
		for _, e := range p.Events() {
			t.Logf("%s %s %-4s %-36s %-14s %s %s", p.User(), e.At.Format("15:04:05.000"), e.Dir, e.What, e.CSeq, e.Peer, e.Note)
			if e.Dir == "in" && (e.What == "BYE" || e.What == "INVITE") {
				requests[e.CSeq]++
			}
			if e.Dir == "out" && !strings.HasPrefix(e.What, "481") {
				t.Errorf("%s answered %s: a request reached a dialog it knew", p.User(), e.What)
			}
		}
		byes := 0
		for cseq, n := range requests {
			if n > 1 {
				t.Errorf("%s got %s %d times: an answered request was sent again", p.User(), cseq, n)
			}
			if strings.HasSuffix(cseq, "BYE") {
				byes++
			}
		}
		if byes == 0 {
			t.Errorf("%s got no BYE", p.User())
		}
	}
	if got := metricWith(t, r.reg, "fan_replicator_moved_calls_hung_up_total", "reason", calls.HungUpEnded); got != 1 {
		t.Errorf("hung up (ended): %v", got)
	}
}
