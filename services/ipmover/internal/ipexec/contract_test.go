package ipexec

import (
	"log/slog"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/fanpbx/fan/lab/netlab/netlabtest"
	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/config"
	"github.com/fanpbx/fan/pkg/platform/daemon"
	"github.com/fanpbx/fan/services/ipmover/internal/execute/executetest"
)

// The IP executor keeps the executor contract, on a real interface in a
// namespace.
func TestIPExecutorContract(t *testing.T) {
	netlabtest.RequireRoot(t)
	executetest.Run(t, func(t *testing.T) executetest.Subject {
		lan := netlabtest.NewLAN(t, "fanctr", "n1")
		lan.Hosts["n1"].IP(t, "addr", "add", "192.0.2.1/24", "dev", netlabtest.LANInterface)
		claim := func(group, addr string) func(time.Time) events.Command {
			return func(notAfter time.Time) events.Command {
				return &events.ClaimIP{Group: group, Node: "n1", Addresses: []string{addr}, NotAfter: notAfter, PreviousHolderFenced: true}
			}
		}
		return executetest.Subject{
			Node:         "n1",
			Admitted:     claim("pbx", vip4.String()),
			NotAllowed:   claim("pbx", "192.0.2.99/24"),
			UnknownGroup: claim("billing", "198.51.100.50/24"),
			Start: func(t *testing.T, url, stateFile string) func() {
				off := false
				cfg := Config{
					Common:    daemon.Common{Cluster: executetest.Cluster, Node: "n1", Bus: bus.Config{URL: url}, ShutdownTimeout: config.Duration(5 * time.Second)},
					Interface: netlabtest.LANInterface, StateFile: stateFile,
					Groups: []GroupConfig{{Name: "pbx", Prefixes: []string{vip4.String()}}},
					Verify: VerifyConfig{Enabled: &off},
				}
				if err := cfg.Validate(); err != nil {
					t.Fatal(err)
				}
				s := New(cfg, slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})), "test")
				s.ns = lan.Hosts["n1"].Handle
				return executetest.Serve(t, s.Run)
			},
			// The admitted claim's address on the interface, read with ip(8).
			// (No Undo: the executor's reconcile puts back a claimed address
			// removed by hand, as it must.)
			Effect: func(t *testing.T) bool {
				out := lan.Hosts["n1"].IP(t, "-o", "addr", "show", "dev", netlabtest.LANInterface)
				return strings.Contains(out, " "+vip4.String()+" ")
			},
		}
	})
}

// The node's own configuration bounds what the bus can make it do: a claim
// for a group or an address outside groups: is refused and adds nothing,
// and a release never removes an address this node did not claim, not even
// one in the group's range that someone else configured.
func TestGroupsBoundCommands(t *testing.T) {
	h := newHarness(t)
	cfg := h.config("n1")
	h.start(cfg)
	ns := h.lan.Hosts["n1"]

	other := &events.ClaimIP{Group: "billing", Node: "n1", Addresses: []string{"198.51.100.50/24"}, NotAfter: time.Now().Add(30 * time.Second), PreviousHolderFenced: true}
	if r := h.Result(h.Send(1, other)); r.Outcome != events.OutcomeFailed || r.Error == "" {
		t.Fatalf("claim for a group not in groups: %s %q", r.Outcome, r.Error)
	}
	outside := &events.ClaimIP{Group: "pbx", Node: "n1", Addresses: []string{"192.0.2.1/24"}, NotAfter: time.Now().Add(30 * time.Second), PreviousHolderFenced: true}
	if r := h.Result(h.Send(1, outside)); r.Outcome != events.OutcomeFailed {
		t.Fatalf("claim of an address outside the group's prefixes: %s %q", r.Outcome, r.Error)
	}
	if h.holds("n1", netip.MustParsePrefix("198.51.100.50/24")) {
		t.Fatal("a refused claim added its address")
	}

	// The node's own address, and a floating address an operator put on
	// by hand: neither was claimed here.
	ns.IP(t, "addr", "add", vip4.String(), "dev", netlabtest.LANInterface)
	rel := &events.ReleaseIP{Group: "pbx", Node: "n1", Addresses: []string{vip4.String()}, NotAfter: time.Now().Add(30 * time.Second)}
	if r := h.Result(h.Send(1, rel)); r.Outcome != events.OutcomeApplied {
		t.Fatalf("release: %s %q", r.Outcome, r.Error)
	}
	own := &events.ReleaseIP{Group: "pbx", Node: "n1", Addresses: []string{"192.0.2.1/24"}, NotAfter: time.Now().Add(30 * time.Second)}
	if r := h.Result(h.Send(1, own)); r.Outcome != events.OutcomeFailed {
		t.Fatalf("release of the node's own address: %s %q", r.Outcome, r.Error)
	}
	if !h.holds("n1", vip4) {
		t.Fatal("a release removed an address this node never claimed")
	}
	if !h.holds("n1", netip.MustParsePrefix("192.0.2.1/24")) {
		t.Fatal("a release removed the node's own address")
	}
	if got := h.svcs["n1"].fence.Snapshot().Managed; len(got) != 0 {
		t.Fatalf("refused commands recorded addresses %v", got)
	}
}

// A forged claim with an epoch no lease ever had is refused, records
// nothing, and leaves the lease holder's claim to work, also after a restart.
func TestForgedEpochDoesNotPoison(t *testing.T) {
	h := newHarness(t)
	cfg := h.config("n1")
	h.start(cfg)
	h.Term(1)
	forged := h.SendRaw(^uint64(0), claimCmd("n1", true, ""))
	if r := h.Result(forged); r.Outcome != events.OutcomeStaleEpoch {
		t.Fatalf("forged epoch 2^64-1: %s %q", r.Outcome, r.Error)
	}
	if h.holds("n1", vip4) {
		t.Fatal("the forged claim added the address")
	}
	if got := h.svcs["n1"].fence.Snapshot().MaxEpoch; got != 0 {
		t.Fatalf("the forged epoch was recorded: %d", got)
	}
	if r := h.Result(h.Send(2, releaseCmd("n1"))); r.Outcome != events.OutcomeApplied {
		t.Fatalf("the lease holder's command after the forgery: %s %q", r.Outcome, r.Error)
	}
	h.stop("n1")
	h.start(cfg)
	if r := h.Result(h.Send(2, claimCmd("n1", true, ""))); r.Outcome != events.OutcomeApplied {
		t.Fatalf("the lease holder's claim after a restart: %s %q", r.Outcome, r.Error)
	}
	if !h.holds("n1", vip4) {
		t.Fatal("the lease holder's claim did not add the address")
	}
}
