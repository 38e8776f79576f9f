package ipexec

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/fanpbx/fan/lab/netlab/netlabtest"
	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/config"
	"github.com/fanpbx/fan/pkg/platform/waittest"
	"github.com/fanpbx/fan/services/ipmover/internal/announce"
)

// A holder that yields to another MAC because it cannot read the arbiter's
// state takes the address back once a re-sync reads that the arbiter still
// names it holder. Before, nothing did: the arbiter saw its holder healthy
// and sent nothing, and a colocated chaos run left the address on no node
// for two minutes after a server's rejoin made one confirmation fail.
func TestYieldWithoutConfirmationIsUndoneWhileTheArbiterNamesThisNode(t *testing.T) {
	h := newHarness(t)
	cfg := h.config("n1")
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	// Every confirmation gives up before its first read: the state is
	// "unreadable" to the conflict watch, and to it alone.
	cfg.Conflict.ConfirmTimeout = config.Duration(time.Nanosecond)
	h.run(cfg)
	h.placeOnN1()
	h.staleAnnouncementFromN2()
	_, p := h.WaitEvent("n1 yields, unconfirmed", func(_ events.Envelope, p events.Payload) bool {
		c, ok := p.(*events.AddressConflict)
		return ok && c.Node == "n1" && c.Action == events.ConflictYielded
	})
	if c := p.(*events.AddressConflict); c.OtherMAC != h.lan.MACs["n2"].String() || !strings.Contains(c.Reason, "cannot read") {
		t.Fatalf("conflict %+v: want n2's MAC and a state that could not be read", c)
	}
	// The yield has removed the addresses before it is reported; the
	// re-sync after it puts them back under an announcement schedule: with
	// the client's entry pointed elsewhere, the schedule's second burst (5 s
	// after the first) brings it back to n1.
	waittest.Until(t, 10*time.Second, "n1 holds both addresses again", func() bool {
		return h.holds("n1", vip4) && h.holds("n1", vip6)
	})
	h.lan.Hosts["cl"].IP(t, "neigh", "replace", vip4.Addr().String(), "lladdr", staleMAC, "dev", netlabtest.LANInterface, "nud", "stale")
	waittest.Until(t, 8*time.Second, "the client follows n1 again", func() bool {
		return h.neigh(vip4.Addr()) == h.lan.MACs["n1"].String()
	})
}

// When the arbiter names another node, the re-sync after a yield leaves
// the group released.
func TestYieldStandsWhenTheArbiterNamesAnotherNode(t *testing.T) {
	h := newHarness(t)
	h.start(h.config("n1"))
	h.placeOnN1()
	// The arbiter has moved the group to n2 (its release to n1 lost).
	h.PutStatus(events.GroupStatus{Group: "pbx", Addresses: []string{vip4.String(), vip6.String()}, Holder: "n2", Epoch: 2}, "")
	h.staleAnnouncementFromN2()
	h.WaitEvent("n1 yields to the holder the arbiter names", func(_ events.Envelope, p events.Payload) bool {
		c, ok := p.(*events.AddressConflict)
		return ok && c.Node == "n1" && c.Action == events.ConflictYielded && c.Holder == "n2"
	})
	// The yield left a re-sync due; once one has completed, nothing else
	// would take the address back.
	waittest.Until(t, 10*time.Second, "the re-sync after the yield completes", func() bool {
		return !h.svcs["n1"].conds.Is(condResyncIncomplete)
	})
	if h.holds("n1", vip4) || h.holds("n1", vip6) {
		t.Fatal("n1 took the address back although the arbiter names n2")
	}
}

// placeOnN1 names n1 holder in the state bucket (epoch 1) and has its
// ipmover apply the claim.
func (h *harness) placeOnN1() {
	h.t.Helper()
	h.PutStatus(events.GroupStatus{Group: "pbx", Addresses: []string{vip4.String(), vip6.String()}, Holder: "n1", Epoch: 1}, "")
	if r := h.Result(h.Send(1, claimCmd("n1", true, ""))); r.Outcome != events.OutcomeApplied {
		h.t.Fatalf("claim: %s %s", r.Outcome, r.Error)
	}
}

// staleAnnouncementFromN2 sends one gratuitous ARP for the address from
// n2's MAC, as a holder that missed its release would.
func (h *harness) staleAnnouncementFromN2() {
	h.t.Helper()
	link, err := announce.Open(netlabtest.LANInterface, slog.New(slog.DiscardHandler), announce.WithNamespace(h.lan.Hosts["n2"].Handle))
	if err != nil {
		h.t.Fatal(err)
	}
	defer link.Close()
	if err := link.SendGARP(vip4.Addr(), false); err != nil {
		h.t.Fatal(err)
	}
}
