package keeper

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/waittest"
)

// sent is one datagram the keeper sent.
type sent struct {
	src, dst netip.AddrPort
	msg      message
	raw      []byte
}

// fakeNet stands for the capture and the raw socket: the test delivers
// datagrams as the capture would, and reads what the keeper sent.
type fakeNet struct {
	mu      sync.Mutex
	sources []*fakeSource
	out     chan sent
}

type fakeSource struct {
	in     chan Packet
	closed chan struct{}
	once   sync.Once
}

func (s *fakeSource) Read(ctx context.Context, deliver func(Packet)) error {
	for {
		select {
		case p := <-s.in:
			deliver(p)
		case <-ctx.Done():
			return nil
		case <-s.closed:
			return nil
		}
	}
}

func (s *fakeSource) Close() error { s.once.Do(func() { close(s.closed) }); return nil }

func (n *fakeNet) open(netip.AddrPort) (Source, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	s := &fakeSource{in: make(chan Packet), closed: make(chan struct{})}
	n.sources = append(n.sources, s)
	return s, nil
}

func (n *fakeNet) SendUDP(src, dst netip.AddrPort, payload []byte) error {
	m, err := parseMessage(payload)
	if err != nil {
		return fmt.Errorf("the keeper sent something unreadable: %w", err)
	}
	n.out <- sent{src: src, dst: dst, msg: m, raw: bytes.Clone(payload)}
	return nil
}

// deliver hands a datagram to the open capture, as it arrives on the wire.
func (n *fakeNet) deliver(t *testing.T, src, dst netip.AddrPort, payload []byte) {
	t.Helper()
	n.mu.Lock()
	s := n.sources[len(n.sources)-1]
	n.mu.Unlock()
	select {
	case s.in <- Packet{Src: src, Dst: dst, Payload: payload}:
	case <-s.closed:
	case <-time.After(2 * time.Second):
		t.Fatal("the capture does not read")
	}
}

// next waits for the keeper's next datagram.
func (n *fakeNet) next(t *testing.T, within time.Duration) sent {
	t.Helper()
	select {
	case s := <-n.out:
		return s
	case <-time.After(within):
		t.Fatalf("nothing sent within %s", within)
		return sent{}
	}
}

// quiet checks that nothing is sent for d.
func (n *fakeNet) quiet(t *testing.T, d time.Duration) {
	t.Helper()
	select {
	case s := <-n.out:
		t.Fatalf("sent %s to %s: %q", s.msg.method, s.dst, s.raw)
	case <-time.After(d):
	}
}

type fakeStore struct {
	mu  sync.Mutex
	ops []string
}

func (s *fakeStore) Put(_ context.Context, key string, _ []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ops = append(s.ops, "put "+key)
	return nil
}

func (s *fakeStore) Delete(_ context.Context, key string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ops = append(s.ops, "delete "+key)
	return nil
}

func (s *fakeStore) waitOps(t *testing.T, want ...string) {
	t.Helper()
	waittest.Succeeds(t, 3*time.Second, fmt.Sprintf("record writes %q", want), func() error {
		s.mu.Lock()
		defer s.mu.Unlock()
		if !slices.Equal(s.ops, want) {
			return fmt.Errorf("record writes %q", s.ops)
		}
		return nil
	})
}

func newTestKeeper(t *testing.T, cfg Config) (*Keeper, *fakeNet, *fakeStore) {
	t.Helper()
	n := &fakeNet{out: make(chan sent, 64)}
	st := &fakeStore{}
	cfg.Cluster, cfg.Node, cfg.Open, cfg.Sender, cfg.Store = "lab", "n2", n.open, n, st
	if cfg.T1 == 0 {
		cfg.T1 = 20 * time.Millisecond
	}
	if cfg.Now == nil {
		// The fixture's calls are adopted at t0 + 1 min: their lifetime
		// runs from there.
		cfg.Now = clockAt(t0.Add(time.Minute))
	}
	k := New(cfg)
	t.Cleanup(func() { k.Close(context.Background()) })
	return k, n, st
}

func keep(t *testing.T, k *Keeper, ids ...string) []events.CallRecord {
	t.Helper()
	var recs []events.CallRecord
	for _, id := range ids {
		recs = append(recs, keptRecord(id))
	}
	n, err := k.Keep("pbx", floating, recs)
	if err != nil || n != len(recs) {
		t.Fatalf("Keep: %d, %v", n, err)
	}
	return recs
}

// request renders a phone's in-dialog request in leg l of rec.
func request(rec events.CallRecord, l int, method string, cseq int) []byte {
	leg := rec.Legs[l]
	return []byte(fmt.Sprintf("%s sip:%s SIP/2.0\r\nVia: SIP/2.0/UDP %s;branch=z9hG4bK-%s-%d;rport\r\nMax-Forwards: 70\r\n"+
		"From: %s;tag=%s\r\nTo: %s;tag=%s\r\nCall-ID: %s\r\nCSeq: %d %s\r\nContent-Length: 0\r\n\r\n",
		method, floating, leg.RemoteAddr, strings.ToLower(method), cseq, leg.RemoteURI, leg.RemoteTag, leg.LocalURI, leg.LocalTag,
		leg.CallID, cseq, method))
}

// response renders a response to msg, as a phone or the PBX sends it.
func response(msg message, status int) []byte {
	return []byte(fmt.Sprintf("SIP/2.0 %d Whatever\r\nVia: SIP/2.0/UDP %s;branch=%s\r\nFrom: <sip:x>;tag=%s\r\nTo: <sip:y>;tag=%s\r\n"+
		"Call-ID: %s\r\nCSeq: %d %s\r\nContent-Length: 0\r\n\r\n", status, floating, msg.branch, msg.fromTag, msg.toTag,
		msg.callID, msg.cseq, msg.cseqMethod))
}

// Phone A hangs up: phone B gets a BYE in its own dialog from the floating
// address and port at once, again on T1 doubling while unanswered, and no
// more once it answers; the kept record goes.
func TestByeFromOnePhoneEndsTheOther(t *testing.T) {
	k, n, st := newTestKeeper(t, Config{})
	rec := keep(t, k, "c1")[0]
	key := events.KeptKey("lab", "pbx", "n2", "c1")
	st.waitOps(t, "put "+key)

	n.deliver(t, phoneA, floating, request(rec, 0, "BYE", 2))
	first := n.next(t, time.Second)
	want := message{request: true, method: "BYE", callID: rec.Legs[1].CallID, fromTag: rec.Legs[1].LocalTag,
		toTag: rec.Legs[1].RemoteTag, cseq: CSeqBase, cseqMethod: "BYE", branch: first.msg.branch}
	if first.src != floating || first.dst != phoneB || first.msg != want {
		t.Fatalf("sent %+v from %s to %s; want %+v from %s to %s", first.msg, first.src, first.dst, want, floating, phoneB)
	}
	if !strings.HasPrefix(string(first.raw), "BYE sip:6002@198.51.100.22:5064 SIP/2.0\r\n") ||
		!strings.Contains(string(first.raw), "Via: SIP/2.0/UDP 198.51.100.10:5060;rport;branch=z9hG4bK") {
		t.Fatalf("BYE %q", first.raw)
	}
	// Retransmissions: the same request (same branch, same CSeq), T1 then 2*T1 later.
	var at []time.Time
	for range 2 {
		again := n.next(t, time.Second)
		at = append(at, time.Now())
		if !bytes.Equal(again.raw, first.raw) || again.dst != phoneB {
			t.Fatalf("retransmission differs: %q", again.raw)
		}
	}
	if gap := at[1].Sub(at[0]); gap < 30*time.Millisecond {
		t.Fatalf("second retransmission %s after the first: the interval does not double", gap)
	}
	// A provisional answer does not end it; a final one does.
	n.deliver(t, phoneB, floating, response(first.msg, 100))
	n.deliver(t, phoneB, floating, response(first.msg, 200))
	st.waitOps(t, "put "+key, "delete "+key)
	for len(n.out) > 0 { // a retransmission that crossed the answer
		<-n.out
	}
	n.quiet(t, 200*time.Millisecond)
	m := k.Metrics()
	if k.Kept() != 0 || testutil.ToFloat64(m.ended.WithLabelValues("0", CauseBye)) != 1 || testutil.ToFloat64(m.byes) != 1 ||
		testutil.ToFloat64(m.retransmissions) < 2 || testutil.ToFloat64(m.answered.WithLabelValues("2xx")) != 1 ||
		testutil.ToFloat64(m.kept) != 0 {
		t.Fatalf("kept %d; metrics ended %v byes %v retransmissions %v answered %v", k.Kept(),
			testutil.ToFloat64(m.ended.WithLabelValues("0", CauseBye)), testutil.ToFloat64(m.byes),
			testutil.ToFloat64(m.retransmissions), testutil.ToFloat64(m.answered.WithLabelValues("2xx")))
	}
	// Phone A's BYE sent again (the PBX's 481 lost) changes nothing.
	n.deliver(t, phoneA, floating, request(rec, 0, "BYE", 2))
	n.quiet(t, 100*time.Millisecond)
}

// Phone B puts the call on hold (a re-INVITE): phone A gets a BYE at once,
// phone B only once the PBX's 481 to its re-INVITE has gone out.
func TestOtherRequestEndsBothSides(t *testing.T) {
	k, n, st := newTestKeeper(t, Config{Await481: time.Hour})
	rec := keep(t, k, "c1")[0]
	reinvite := request(rec, 1, "INVITE", 7)
	n.deliver(t, phoneB, floating, reinvite)
	toA := n.next(t, time.Second)
	if toA.dst != phoneA || toA.msg.callID != rec.Legs[0].CallID || toA.msg.method != "BYE" || toA.msg.toTag != rec.Legs[0].RemoteTag {
		t.Fatalf("first BYE %+v to %s", toA.msg, toA.dst)
	}
	n.deliver(t, phoneA, floating, response(toA.msg, 200))
	n.quiet(t, 100*time.Millisecond) // no BYE to B before the PBX answered B
	// The ACK of the 481 and an answer to something else are nothing.
	inv, _ := parseMessage(reinvite)
	n.deliver(t, floating, phoneB, response(message{callID: inv.callID, fromTag: inv.fromTag, toTag: inv.toTag, cseq: 6,
		cseqMethod: "INVITE", branch: "z9hG4bK-x"}, 481))
	n.deliver(t, nodeAddr, stranger, response(inv, 481)) // to someone else
	n.quiet(t, 50*time.Millisecond)
	// Asterisk answers from the node's own address (docs/asterisk22.md).
	n.deliver(t, nodeAddr, phoneB, response(inv, 481))
	toB := n.next(t, time.Second)
	if toB.dst != phoneB || toB.msg.callID != rec.Legs[1].CallID || toB.msg.fromTag != rec.Legs[1].LocalTag {
		t.Fatalf("second BYE %+v to %s", toB.msg, toB.dst)
	}
	n.deliver(t, phoneB, floating, request(rec, 1, "ACK", 7))
	n.deliver(t, phoneB, floating, response(toB.msg, 481)) // B had ended its dialog already: final too
	key := events.KeptKey("lab", "pbx", "n2", "c1")
	st.waitOps(t, "put "+key, "delete "+key)
	if got := testutil.ToFloat64(k.Metrics().ended.WithLabelValues("1", CauseRequest)); got != 1 {
		t.Fatalf("ended{leg=1,cause=request} = %v", got)
	}
}

// Without the PBX's answer seen, the sender is sent its BYE after Await481.
func TestRequestSenderEndedWithoutA481(t *testing.T) {
	k, n, _ := newTestKeeper(t, Config{Await481: 50 * time.Millisecond, T1: time.Second})
	rec := keep(t, k, "c1")[0]
	n.deliver(t, phoneA, floating, request(rec, 0, "REFER", 3))
	if s := n.next(t, time.Second); s.dst != phoneB {
		t.Fatalf("first BYE to %s", s.dst)
	}
	if s := n.next(t, 500*time.Millisecond); s.dst != phoneA || s.msg.callID != rec.Legs[0].CallID {
		t.Fatalf("second BYE %+v to %s", s.msg, s.dst)
	}
	if got := testutil.ToFloat64(k.Metrics().unseen481); got != 1 {
		t.Fatalf("unseen PBX answers %v", got)
	}
}

// A BYE nobody answers is sent on timer E until timer F, then given up;
// the record goes anyway.
func TestUnansweredByeGivesUp(t *testing.T) {
	k, n, st := newTestKeeper(t, Config{T1: 10 * time.Millisecond, T2: 40 * time.Millisecond})
	rec := keep(t, k, "c1")[0]
	n.deliver(t, phoneA, floating, request(rec, 0, "BYE", 2))
	start := time.Now()
	key := events.KeptKey("lab", "pbx", "n2", "c1")
	st.waitOps(t, "put "+key, "delete "+key)
	elapsed := time.Since(start)
	sends := len(n.out)
	// At 0, 10, 30, then every 40 ms up to 640 ms: 18 transmissions, fewer
	// when the timers fire late on a loaded machine, never more.
	if sends < 8 || sends > 18 || elapsed < 600*time.Millisecond {
		t.Fatalf("%d transmissions in %s", sends, elapsed)
	}
	if got := testutil.ToFloat64(k.Metrics().unanswered); got != 1 {
		t.Fatalf("unanswered %v", got)
	}
}

// Released: the node no longer has the address, so it stops keeping, sends
// nothing more, and leaves the records for the next holder.
func TestReleaseStopsKeeping(t *testing.T) {
	k, n, st := newTestKeeper(t, Config{})
	recs := keep(t, k, "c1", "c2")
	key1, key2 := events.KeptKey("lab", "pbx", "n2", "c1"), events.KeptKey("lab", "pbx", "n2", "c2")
	// c2 is ending (its BYE out, unanswered) when the group goes.
	n.deliver(t, phoneA, floating, request(recs[1], 0, "BYE", 2))
	n.next(t, time.Second)
	k.Release("pbx")
	if k.Kept() != 0 {
		t.Fatalf("kept %d after the release", k.Kept())
	}
	for len(n.out) > 0 {
		<-n.out
	}
	n.quiet(t, 100*time.Millisecond) // no more retransmissions
	// c1 is left for the next holder; c2 was over but for its answer.
	st.waitOps(t, "put "+key1, "put "+key2, "delete "+key2)
	// Kept again on the same address later: a new capture.
	keep(t, k, "c3")
	if len(n.sources) != 2 {
		t.Fatalf("%d captures opened", len(n.sources))
	}
}

func TestKeepRefuses(t *testing.T) {
	k, _, _ := newTestKeeper(t, Config{})
	keep(t, k, "c1")
	if n, err := k.Keep("pbx", floating, []events.CallRecord{keptRecord("c1")}); n != 1 || err != nil || k.Kept() != 1 {
		t.Fatalf("the same call again: %d, %v; keeping %d", n, err, k.Kept())
	}
	if _, err := k.Keep("pbx", netip.MustParseAddrPort("198.51.100.12:5060"), []events.CallRecord{keptRecord("c2")}); err == nil {
		t.Fatal("a second address for one group was accepted")
	}
	notMine := keptRecord("c3")
	notMine.Node = "n3"
	origin := callRecord("c4")
	otherGroup := keptRecord("c6")
	otherGroup.Group = "other"
	sameDialog := keptRecord("c7") // c1's dialog with phone A under another id
	sameDialog.Legs[0] = keptRecord("c1").Legs[0]
	if n, err := k.Keep("pbx", floating, []events.CallRecord{notMine, origin, otherGroup, sameDialog}); n != 0 || err != nil {
		t.Fatalf("records this keeper must not keep: %d, %v", n, err)
	}
	k.Close(context.Background())
	if _, err := k.Keep("pbx", floating, []events.CallRecord{keptRecord("c5")}); !errors.Is(err, ErrClosed) {
		t.Fatalf("after Close: %v", err)
	}
}

// What anyone can put on the wire to the PBX's port: malformed messages,
// requests in a kept dialog from elsewhere or with the wrong tags, answers
// to the keeper's BYE from elsewhere. None makes it send, and none stops
// the real hang-up from working.
func TestHostileMessagesAreRefused(t *testing.T) {
	k, n, _ := newTestKeeper(t, Config{})
	rec := keep(t, k, "c1")[0]
	bye := request(rec, 0, "BYE", 2)
	wrongTag := bytes.Replace(bye, []byte(rec.Legs[0].RemoteTag), []byte("forged"), 1)
	viaElsewhere := bytes.Replace(bye, []byte("Via: SIP/2.0/UDP 198.51.100.21:5062"), []byte("Via: SIP/2.0/UDP 198.51.100.66:5060"), 1)
	for _, p := range []Packet{
		{stranger, floating, bye}, // the right dialog from another host
		{stranger, floating, viaElsewhere},
		{phoneA, floating, wrongTag}, // from the phone, another From tag
		{phoneA, floating, []byte("\r\n\r\n")},
		{phoneA, floating, []byte{0, 0, 0, 0}},
		{phoneA, floating, []byte("BYE sip:x SIP/2.0\r\nCall-ID: " + rec.Legs[0].CallID + "\r\nCall-ID: y\r\n\r\n")},
		{phoneA, floating, bytes.Repeat([]byte("A"), 70000)},
		{phoneA, floating, bytes.ReplaceAll(bye, []byte("\r\n"), []byte("\r\n\x00"))},
		{phoneA, phoneB, bye},   // not to the floating address at all
		{floating, phoneA, bye}, // a request leaving it (the PBX's, or ours)
	} {
		n.deliver(t, p.Src, p.Dst, p.Payload)
	}
	n.quiet(t, 100*time.Millisecond)
	if got := testutil.ToFloat64(k.Metrics().refused.WithLabelValues(RefusedSource)); got != 3 {
		t.Fatalf("refused{source} %v, want 3", got)
	}
	// The real hang-up, then an answer to the keeper's BYE from a stranger
	// (it knows the branch): retransmissions go on until phone B answers.
	n.deliver(t, phoneA, floating, bye)
	first := n.next(t, time.Second)
	n.deliver(t, stranger, floating, response(first.msg, 200))
	if again := n.next(t, time.Second); again.dst != phoneB {
		t.Fatalf("retransmission to %s", again.dst)
	}
	n.deliver(t, phoneB, floating, response(first.msg, 200))
}

// FuzzCapture: whatever arrives on the capture, from wherever, the keeper
// only ever sends from the floating address to the phones of its records
// (go test -fuzz FuzzCapture ./internal/keeper).
func FuzzCapture(f *testing.F) {
	rec := keptRecord("c1")
	for _, b := range [][]byte{request(rec, 0, "BYE", 2), request(rec, 1, "INVITE", 3), request(rec, 0, "UPDATE", 9),
		readSIP(f, "481-to-reinvite.sip"), readSIP(f, "200-to-bye.sip")} {
		for _, src := range []byte{21, 22, 66} {
			f.Add(b, src, true)
			f.Add(b, src, false)
		}
	}
	f.Fuzz(func(t *testing.T, payload []byte, srcHost byte, inbound bool) {
		out := make(chan sent, 1024)
		n := &fakeNet{out: out}
		k := New(Config{Cluster: "lab", Node: "n2", Open: n.open, Sender: n, Store: &fakeStore{}, T1: time.Hour, Await481: time.Hour,
			Now: clockAt(t0.Add(time.Minute))})
		defer k.Close(context.Background())
		if _, err := k.Keep("pbx", floating, []events.CallRecord{rec}); err != nil {
			t.Fatal(err)
		}
		k.mu.Lock()
		g := k.groups["pbx"]
		gen := g.gen
		k.mu.Unlock()
		peer := netip.AddrPortFrom(netip.AddrFrom4([4]byte{198, 51, 100, srcHost}), 5062)
		p := Packet{Src: peer, Dst: floating, Payload: payload}
		if !inbound {
			p.Src, p.Dst = floating, peer
		}
		k.handle(g, gen, p)
		// Again as the other phone's, so that a 481 can follow a request.
		k.handle(g, gen, Packet{Src: phoneB, Dst: floating, Payload: payload})
		k.handle(g, gen, Packet{Src: floating, Dst: phoneA, Payload: payload})
		for len(out) > 0 {
			s := <-out
			if s.src != floating || (s.dst != phoneA && s.dst != phoneB) || s.msg.method != "BYE" {
				t.Fatalf("sent %s from %s to %s", s.msg.method, s.src, s.dst)
			}
		}
	})
}
