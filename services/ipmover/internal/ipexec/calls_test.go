package ipexec

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fanpbx/fan/lab/netlab/netlabtest"
	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/waittest"
	"github.com/fanpbx/fan/services/ipmover/internal/execute"
	"github.com/fanpbx/fan/services/ipmover/internal/execute/executetest"
	"github.com/fanpbx/fan/services/ipmover/internal/keeper"
)

// The phones of these tests, on the client host cl (192.0.2.3).
var (
	phoneA = netip.MustParseAddrPort("192.0.2.3:5062")
	phoneB = netip.MustParseAddrPort("192.0.2.3:5064")
)

// callOf is a call n1's replicator recorded: leg 0 phone A's dialog, leg 1
// phone B's.
func callOf(id string, media events.CallMedia) events.CallRecord {
	leg := func(ch, callID, local, remote string, phone netip.AddrPort) events.CallLeg {
		return events.CallLeg{Channel: ch, CallID: callID, LocalTag: local, RemoteTag: remote,
			LocalURI: "<sip:pbx@192.0.2.10>", RemoteURI: "<sip:phone@" + phone.String() + ">",
			RemoteTarget: "sip:phone@" + phone.String(), RemoteAddr: phone.String(), Transport: "udp"}
	}
	return events.CallRecord{Cluster: "lab", Group: "pbx", Node: "n1", ID: id, Media: media,
		AnsweredAt: time.Now(), UpdatedAt: time.Now(),
		Legs: []events.CallLeg{leg("PJSIP/6001-1", "a-"+id, "ast-a-"+id, "ph-a-"+id, phoneA),
			leg("PJSIP/6002-2", "b-"+id, "ast-b-"+id, "ph-b-"+id, phoneB)}}
}

func (h *harness) callsKV() jetstream.KeyValue {
	h.t.Helper()
	kv, err := h.Ctl.CallsKV(h.t.Context())
	if err != nil {
		h.t.Fatal(err)
	}
	return kv
}

func (h *harness) putCall(rec events.CallRecord) {
	h.t.Helper()
	b, err := rec.Encode()
	if err != nil {
		h.t.Fatal(err)
	}
	if _, err := h.callsKV().Put(h.t.Context(), events.CallKey(rec.Cluster, rec.Group, rec.Node, rec.ID), b); err != nil {
		h.t.Fatal(err)
	}
}

// kept reads a kept record, or reports there is none.
func (h *harness) kept(node, id string) (events.CallRecord, bool) {
	h.t.Helper()
	e, err := h.callsKV().Get(h.t.Context(), events.KeptKey("lab", "pbx", node, id))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return events.CallRecord{}, false
	}
	if err != nil {
		h.t.Fatal(err)
	}
	rec, err := events.DecodeCallRecord(e.Value())
	if err != nil {
		h.t.Fatal(err)
	}
	return rec, true
}

// phoneOn opens a phone's SIP socket on the client host.
func (h *harness) phoneOn(ap netip.AddrPort) *net.UDPConn {
	h.t.Helper()
	var (
		c   *net.UDPConn
		err error
	)
	h.lan.Hosts["cl"].Do(h.t, func() { c, err = net.ListenUDP("udp4", net.UDPAddrFromAddrPort(ap)) })
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() { c.Close() })
	return c
}

// readSIP waits for one datagram on c.
func readSIP(t *testing.T, c *net.UDPConn, within time.Duration) (string, netip.AddrPort) {
	t.Helper()
	buf := make([]byte, 65535)
	_ = c.SetReadDeadline(time.Now().Add(within))
	n, from, err := c.ReadFromUDPAddrPort(buf)
	if err != nil {
		t.Fatalf("nothing received on %s within %s: %v", c.LocalAddr(), within, err)
	}
	return string(buf[:n]), netip.AddrPortFrom(from.Addr().Unmap(), from.Port())
}

func header(msg, name string) string {
	for _, line := range strings.Split(msg, "\r\n") {
		if n, v, ok := strings.Cut(line, ":"); ok && strings.EqualFold(strings.TrimSpace(n), name) {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// A failover with calls up: n2's claim reads the group's records while it
// proves the PBX answers, adopts the direct call (its result says so,
// with the anchored and incomplete ones and why), writes it under its kept
// key, and when phone A hangs up phone B is told from the floating address.
func TestClaimAdoptsCalls(t *testing.T) {
	h := newHarness(t)
	cfg := h.config("n2")
	// The claim's proof goes to another port, whose SIP stack leaves the
	// first OPTIONS unanswered: the claim lasts a verify.every longer, the
	// read of the records ends within it, and the result carries the
	// adoption. The calls are kept on the PBX's port, 5060.
	var slow net.PacketConn
	var err error
	h.lan.Hosts["n2"].Do(t, func() { slow, err = net.ListenPacket("udp", netip.AddrPortFrom(vip4.Addr(), 5070).String()) })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { slow.Close() })
	go netlabtest.ServeOPTIONS(slow, 1)
	cfg.Verify.Port, cfg.Calls.SIPPort = 5070, 5060
	h.start(cfg)
	anchored := callOf("c2", events.MediaAnchored)
	incomplete := callOf("c3", events.MediaDirect)
	incomplete.Incomplete = "legs[1] Local/6100@from-phones-00000000;2 is not a PJSIP channel"
	mine := callOf("c4", events.MediaDirect) // n2's own PBX has it up
	mine.Node = "n2"
	for _, r := range []events.CallRecord{callOf("c1", events.MediaDirect), anchored, incomplete, mine} {
		h.putCall(r)
	}
	a, b := h.phoneOn(phoneA), h.phoneOn(phoneB)

	h.PutStatus(events.GroupStatus{Group: "pbx", Addresses: []string{vip4.String(), vip6.String()}, Epoch: 1}, pendingState(1, "n2", "x"))
	r := h.Result(h.Send(1, claimCmd("n2", true, "n1")))
	want := []string{StepReceived, execute.StepTermChecked, execute.StepRecorded, StepAddressAdded, StepAnnounced, StepPBXAnswering, StepPBXVerified}
	if r.Outcome != events.OutcomeApplied || !slices.Equal(executetest.StepNames(r), want) {
		t.Fatalf("claim %s %q steps %v", r.Outcome, r.Error, executetest.StepNames(r))
	}
	wantCalls := events.CallsAdoption{Adopted: 1, NotAdopted: map[string]int{events.NotAdoptedAnchored: 1, events.NotAdoptedIncomplete: 1},
		From: []string{"n1"}}
	if c := r.Calls; c == nil || c.Adopted != 1 || !maps.Equal(c.NotAdopted, wantCalls.NotAdopted) || !slices.Equal(c.From, wantCalls.From) ||
		c.Deferred || c.Error != "" {
		t.Fatalf("claim's calls %+v, want %+v", r.Calls, wantCalls)
	}
	var rec events.CallRecord
	waittest.Until(t, 3*time.Second, "kept record written", func() bool {
		var ok bool
		rec, ok = h.kept("n2", "c1")
		return ok
	})
	if !rec.Kept || rec.AdoptedFrom != "n1" || rec.KeptSince.IsZero() || rec.Legs[0].CSeq != keeper.CSeqBase || rec.Legs[1].CSeq != keeper.CSeqBase {
		t.Fatalf("kept record %+v", rec)
	}

	// Phone A hangs up: its BYE reaches n2's PBX (which answers what it
	// answers), and phone B gets a BYE in its dialog from the floating
	// address and port.
	leg := callOf("c1", "").Legs[0]
	bye := "BYE sip:pbx@192.0.2.10 SIP/2.0\r\nVia: SIP/2.0/UDP " + phoneA.String() + ";branch=z9hG4bK-1\r\n" +
		"From: " + leg.RemoteURI + ";tag=" + leg.RemoteTag + "\r\nTo: " + leg.LocalURI + ";tag=" + leg.LocalTag + "\r\n" +
		"Call-ID: " + leg.CallID + "\r\nCSeq: 9 BYE\r\nContent-Length: 0\r\n\r\n"
	sent := time.Now()
	if _, err := a.WriteToUDPAddrPort([]byte(bye), netip.AddrPortFrom(vip4.Addr(), 5060)); err != nil {
		t.Fatal(err)
	}
	msg, from := readSIP(t, b, 2*time.Second)
	t.Logf("phone B told %s after phone A's BYE", time.Since(sent).Round(10*time.Microsecond))
	if from != netip.AddrPortFrom(vip4.Addr(), 5060) || !strings.HasPrefix(msg, "BYE sip:phone@192.0.2.3:5064 SIP/2.0\r\n") ||
		header(msg, "Call-ID") != "b-c1" || !strings.HasSuffix(header(msg, "From"), ";tag=ast-b-c1") ||
		!strings.HasSuffix(header(msg, "To"), ";tag=ph-b-c1") || header(msg, "CSeq") != "1073741824 BYE" {
		t.Fatalf("phone B got from %s:\n%s", from, msg)
	}
	answer := strings.Replace(msg, "BYE sip:phone@192.0.2.3:5064 SIP/2.0", "SIP/2.0 200 OK", 1)
	if _, err := b.WriteToUDPAddrPort([]byte(answer), from); err != nil {
		t.Fatal(err)
	}
	waittest.Until(t, 3*time.Second, "kept record deleted", func() bool { _, ok := h.kept("n2", "c1"); return !ok })
}

// A bus slower than the claim: the result says deferred, and the adoption
// follows in a calls.adopted event caused by the claim. Released later,
// the node leaves the kept record for the next holder.
func TestDeferredAdoptionAndRelease(t *testing.T) {
	h := newHarness(t)
	cfg := h.config("n2")
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	gate := make(chan struct{})
	s := New(cfg, slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})), "test")
	s.ns, s.callsReadGate = h.lan.Hosts["n2"].Handle, gate
	h.svcs["n2"] = s
	h.stops["n2"] = h.Start("ipmover", "n2", s.Run)
	h.putCall(callOf("c1", events.MediaDirect))

	h.PutStatus(events.GroupStatus{Group: "pbx", Addresses: []string{vip4.String()}, Epoch: 1}, pendingState(1, "n2", "x"))
	claim := h.Send(1, claimCmd("n2", true, "n1"))
	r := h.Result(claim)
	if r.Outcome != events.OutcomeApplied || r.Calls == nil || !r.Calls.Deferred {
		t.Fatalf("claim %s %q calls %+v; want applied, deferred", r.Outcome, r.Error, r.Calls)
	}
	close(gate)
	env, p := h.WaitEvent("calls adopted", func(_ events.Envelope, p events.Payload) bool {
		_, ok := p.(*events.CallsAdopted)
		return ok
	})
	ev := p.(*events.CallsAdopted)
	if env.CausationID != claim.ID || ev.CommandID != claim.ID || ev.Node != "n2" || ev.Calls.Adopted != 1 {
		t.Fatalf("calls.adopted %+v caused by %s; want 1 adopted, caused by the claim %s", ev, env.CausationID, claim.ID)
	}
	waittest.Until(t, 3*time.Second, "kept record written", func() bool { _, ok := h.kept("n2", "c1"); return ok })
	if s.keeper.Kept() != 1 {
		t.Fatalf("keeping %d calls", s.keeper.Kept())
	}
	if rr := h.Result(h.Send(1, releaseCmd("n2"))); rr.Outcome != events.OutcomeApplied {
		t.Fatalf("release %s %s", rr.Outcome, rr.Error)
	}
	if s.keeper.Kept() != 0 {
		t.Fatalf("still keeping %d calls after the release", s.keeper.Kept())
	}
	if _, ok := h.kept("n2", "c1"); !ok {
		t.Fatal("the kept record went with the release; the next holder needs it")
	}
	b, _ := json.Marshal(ev)
	t.Logf("calls.adopted: %s", b)
}

// adoption waits for what the claim whose result is r adopted: the result's,
// or the calls.adopted event it deferred to.
func (h *harness) adoption(claim events.Envelope, r *events.CommandResult) events.CallsAdoption {
	h.t.Helper()
	if r.Calls == nil {
		h.t.Fatalf("result of %s says nothing of calls", claim.ID)
	}
	if !r.Calls.Deferred {
		return *r.Calls
	}
	_, p := h.WaitEvent("calls adopted for "+claim.ID, func(env events.Envelope, p events.Payload) bool {
		ev, ok := p.(*events.CallsAdopted)
		return ok && ev.CommandID == claim.ID && env.CausationID == claim.ID
	})
	return p.(*events.CallsAdopted).Calls
}

// Calls follow the group through failovers back and forth: each new holder
// adopts the previous keeper's records (the origin n3 is gone), with CSeqs
// one above the last keeper's, and each keeper that let go deletes its own
// record once the next one has written its. The same moves run on a second
// lab with calls.keep false, move for move in turn, for the figures of the
// claim with and without calls kept (go test -v -run
// TestCallsFollowTheGroup ./internal/ipexec; MOVES=n for more).
func TestCallsFollowTheGroup(t *testing.T) {
	const calls = 50
	moves := 6
	if n, err := strconv.Atoi(os.Getenv("MOVES")); err == nil && n > 0 {
		moves = n
	}
	type lab struct {
		h                   *harness
		keep                bool
		announced, verified []float64
	}
	var labs []*lab
	for _, keep := range []bool{false, true} {
		l := &lab{h: newHarness(t), keep: keep}
		for _, n := range []string{"n1", "n2"} {
			cfg := l.h.config(n)
			cfg.Calls.Keep = &keep
			l.h.start(cfg)
		}
		for i := range calls {
			rec := callOf(fmt.Sprintf("c%03d", i), events.MediaDirect)
			rec.Node = "n3"
			l.h.putCall(rec)
		}
		labs = append(labs, l)
	}
	nodes := []string{"n2", "n1"}
	for i := 1; i <= moves; i++ {
		to, from := nodes[(i+1)%2], nodes[i%2]
		for j := range labs {
			l := labs[(i+j)%2] // each lab first in turn
			h := l.h
			epoch := uint64(i)
			if i > executetest.Terms {
				epoch = h.StartTerm()
			}
			h.PutStatus(events.GroupStatus{Group: "pbx", Addresses: []string{vip4.String(), vip6.String()}, Epoch: epoch},
				pendingState(int(epoch), to, "x"))
			if i > 1 {
				h.Result(h.Send(epoch, releaseCmd(from)))
			}
			time.Sleep(300 * time.Millisecond) // what the release left to do in the background is done
			claim := h.Send(epoch, claimCmd(to, true, from))
			r := h.Result(claim)
			if r.Outcome != events.OutcomeApplied {
				t.Fatalf("move %d: %s %s", i, r.Outcome, r.Error)
			}
			received := executetest.StepAt(t, r, StepReceived)
			l.announced = append(l.announced, executetest.StepAt(t, r, StepAnnounced).Sub(received).Seconds()*1000)
			l.verified = append(l.verified, executetest.StepAt(t, r, StepPBXVerified).Sub(received).Seconds()*1000)
			if !l.keep {
				if r.Calls != nil {
					t.Fatalf("calls.keep false, yet the result has %+v", r.Calls)
				}
				continue
			}
			a := h.adoption(claim, r)
			wantFrom := "n3"
			if i > 1 {
				wantFrom = from
			}
			if a.Adopted != calls || a.NotAdoptedTotal() != 0 || !slices.Equal(a.From, []string{wantFrom}) {
				t.Fatalf("move %d to %s: adopted %+v; want %d from %s", i, to, a, calls, wantFrom)
			}
			var rec events.CallRecord
			waittest.Until(t, 3*time.Second, "kept record of "+to, func() bool {
				var ok bool
				rec, ok = h.kept(to, "c000")
				return ok && rec.UpdatedAt.After(received)
			})
			if rec.AdoptedFrom != wantFrom || rec.Legs[0].CSeq != keeper.CSeqBase+uint32(i-1) {
				t.Fatalf("move %d: %s keeps c000 adopted from %s with CSeq %d; want from %s, CSeq %d",
					i, to, rec.AdoptedFrom, rec.Legs[0].CSeq, wantFrom, keeper.CSeqBase+i-1)
			}
			if i > 1 {
				waittest.Until(t, 10*time.Second, from+"'s records handed over", func() bool {
					_, ok := h.kept(from, "c000")
					return !ok
				})
			}
		}
	}
	pct := func(v []float64, p int) float64 {
		v = slices.Clone(v)
		slices.Sort(v)
		return v[(len(v)-1)*p/100]
	}
	for _, l := range labs {
		t.Logf("calls.keep=%v, %d direct calls recorded, %d moves: first announcement p50 %.2f ms, max %.2f; verified p50 %.2f ms, max %.2f",
			l.keep, calls, moves, pct(l.announced, 50), slices.Max(l.announced), pct(l.verified, 50), slices.Max(l.verified))
	}
}
