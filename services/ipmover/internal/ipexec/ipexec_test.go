package ipexec

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/vishvananda/netlink"

	"github.com/fanpbx/fan/lab/netlab/netlabtest"
	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/config"
	"github.com/fanpbx/fan/pkg/platform/daemon"
	"github.com/fanpbx/fan/pkg/platform/waittest"
	"github.com/fanpbx/fan/services/ipmover/internal/busloss"
	"github.com/fanpbx/fan/services/ipmover/internal/execute"
	"github.com/fanpbx/fan/services/ipmover/internal/execute/executetest"
)

var (
	vip4 = netip.MustParsePrefix("192.0.2.10/24")
	vip6 = netip.MustParsePrefix("2001:db8::10/64")
)

const staleMAC = "02:00:5e:00:00:99"

// harness is a LAN (n1, n2, client), a JetStream server, and a test bus
// client that plays the arbiter: it writes the state bucket and publishes
// fenced commands, and it records every event.
type harness struct {
	*executetest.Arbiter
	t     *testing.T
	lan   *netlabtest.LAN
	svcs  map[string]*Service
	stops map[string]func()
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	lan := netlabtest.NewLAN(t, "fanapp", "n1", "n2", "cl")
	for i, h := range []string{"n1", "n2", "cl"} {
		ns := lan.Hosts[h]
		ns.IP(t, "addr", "add", "192.0.2."+string(rune('1'+i))+"/24", "dev", netlabtest.LANInterface)
		ns.IP(t, "addr", "add", "2001:db8::"+string(rune('1'+i))+"/64", "dev", netlabtest.LANInterface, "nodad")
	}
	h := &harness{Arbiter: executetest.NewArbiter(t), t: t, lan: lan, svcs: map[string]*Service{}, stops: map[string]func(){}}
	// A SIP stack on each node, bound to the floating address before it
	// exists (ip_nonlocal_bind): the hot-standby PBX.
	for _, n := range []string{"n1", "n2"} {
		ns := lan.Hosts[n]
		ns.Sysctl(t, "net.ipv4.ip_nonlocal_bind", "1")
		var (
			c   net.PacketConn
			err error
		)
		ns.Do(t, func() { c, err = net.ListenPacket("udp", netip.AddrPortFrom(vip4.Addr(), 5060).String()) })
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		go netlabtest.ServeOPTIONS(c, 0)
	}
	return h
}

func (h *harness) config(node string) Config {
	cfg := Config{
		Common:          daemon.Common{Cluster: "lab", Node: node, Bus: bus.Config{URL: h.URL()}, ShutdownTimeout: config.Duration(5 * time.Second)},
		Interface:       netlabtest.LANInterface,
		Groups:          []GroupConfig{{Name: "pbx", Prefixes: []string{vip4.String(), vip6.String()}}},
		StateFile:       h.StateFile(node),
		ReconcilePeriod: config.Duration(500 * time.Millisecond),
		Conflict:        ConflictConfig{MinInterval: config.Duration(200 * time.Millisecond)},
	}
	return cfg
}

// start runs an ipmover for node inside its namespace until the test ends.
func (h *harness) start(cfg Config) *Service {
	t := h.t
	t.Helper()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	return h.run(cfg)
}

// run is start without the validation, for a test that must set a value
// the configuration refuses.
func (h *harness) run(cfg Config) *Service {
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	s := New(cfg, log, "test")
	if h.lan != nil {
		s.ns = h.lan.Hosts[cfg.Node].Handle
	}
	h.svcs[cfg.Node] = s
	// Ready once its service announcement is on the bus.
	h.stops[cfg.Node] = h.Start("ipmover", cfg.Node, s.Run)
	return s
}

func (h *harness) holds(node string, p netip.Prefix) bool {
	h.t.Helper()
	out := h.lan.Hosts[node].IP(h.t, "-o", "addr", "show", "dev", netlabtest.LANInterface)
	return strings.Contains(out, " "+p.String()+" ")
}

func (h *harness) neigh(ip netip.Addr) string {
	h.t.Helper()
	fam := netlink.FAMILY_V4
	if ip.Is6() {
		fam = netlink.FAMILY_V6
	}
	list, err := h.lan.Hosts["cl"].Netlink(h.t).NeighList(h.lan.Index["cl"], fam)
	if err != nil {
		h.t.Fatal(err)
	}
	for _, e := range list {
		if a, ok := netip.AddrFromSlice(e.IP); ok && a.Unmap() == ip {
			return e.HardwareAddr.String()
		}
	}
	return ""
}

func claimCmd(node string, fenced bool, prev string) *events.ClaimIP {
	return &events.ClaimIP{Group: "pbx", Node: node, Addresses: []string{vip4.String(), vip6.String()},
		NotAfter: time.Now().Add(30 * time.Second), PreviousHolder: prev, PreviousHolderFenced: fenced}
}

func releaseCmd(node string) *events.ReleaseIP {
	return &events.ReleaseIP{Group: "pbx", Node: node, Addresses: []string{vip4.String(), vip6.String()},
		NotAfter: time.Now().Add(30 * time.Second), Reason: "test"}
}

func pendingState(epoch int, node, cmdID string) string {
	return `{"epoch":` + itoa(epoch) + `,"groups":[{"name":"pbx","claim":{"command_id":"` + cmdID + `","node":"` + node + `"}}]}`
}

func itoa(i int) string { b, _ := json.Marshal(i); return string(b) }

// A placement then a failover, both addresses, real binaries' code paths:
// the claim's result carries every step in order; the client's ARP and
// neighbour entries follow the address within the first burst; the old
// holder is left with nothing; the PBX answered SIP before "applied".
func TestClaimMoveAndTimings(t *testing.T) {
	h := newHarness(t)
	h.lan.Hosts["cl"].IP(t, "neigh", "replace", vip4.Addr().String(), "lladdr", staleMAC, "dev", netlabtest.LANInterface, "nud", "stale")
	h.lan.Hosts["cl"].IP(t, "neigh", "replace", vip6.Addr().String(), "lladdr", staleMAC, "dev", netlabtest.LANInterface, "nud", "stale")
	s1 := h.start(h.config("n1"))
	h.start(h.config("n2"))

	// Placement: no previous holder, so the claim probes first.
	h.PutStatus(events.GroupStatus{Group: "pbx", Addresses: []string{vip4.String(), vip6.String()}, Epoch: 1}, pendingState(1, "n1", "x"))
	c1 := h.Send(1, claimCmd("n1", false, ""))
	r1 := h.Result(c1)
	want := []string{StepReceived, execute.StepTermChecked, execute.StepRecorded, StepProbed, StepAddressAdded, StepAnnounced, StepPBXAnswering, StepPBXVerified}
	if r1.Outcome != events.OutcomeApplied || !slices.Equal(executetest.StepNames(r1), want) {
		t.Fatalf("placement result %s %q steps %v; want applied with %v", r1.Outcome, r1.Error, executetest.StepNames(r1), want)
	}
	for i := 1; i < len(r1.Steps); i++ {
		if r1.Steps[i].At.Before(r1.Steps[i-1].At) {
			t.Fatalf("steps out of time order: %+v", r1.Steps)
		}
	}
	t.Logf("placement steps (ms): %s", executetest.FormatSteps(r1))
	waittest.Until(t, time.Second, "client follows n1", func() bool {
		return h.neigh(vip4.Addr()) == h.lan.MACs["n1"].String() && h.neigh(vip6.Addr()) == h.lan.MACs["n1"].String()
	})

	// Failover to n2: release and claim at once, the claim naming n1
	// fenced and waiting for n1's release, as the arbiter sends them when
	// n1 is still on the bus.
	h.PutStatus(events.GroupStatus{Group: "pbx", Addresses: []string{vip4.String(), vip6.String()}, Epoch: 2}, pendingState(2, "n2", "y"))
	claim2 := claimCmd("n2", true, "n1")
	relEnv, err := events.New(h.Ctl.Source(), "lab", releaseCmd("n1"), events.WithEpoch(2))
	if err != nil {
		t.Fatal(err)
	}
	claim2.AfterReleases = []string{relEnv.ID}
	c2 := h.Send(2, claim2) // the claim first: the wait must hold it back
	if err := h.Ctl.Publish(t.Context(), relEnv, releaseCmd("n1")); err != nil {
		t.Fatal(err)
	}
	r2 := h.Result(c2)
	want = []string{StepReceived, execute.StepTermChecked, execute.StepRecorded, StepReleased, StepAddressAdded, StepAnnounced, StepPBXAnswering, StepPBXVerified}
	if r2.Outcome != events.OutcomeApplied || !slices.Equal(executetest.StepNames(r2), want) {
		t.Fatalf("failover result %s %q steps %v; want applied with %v (no probe: previous holder fenced)", r2.Outcome, r2.Error, executetest.StepNames(r2), want)
	}
	t.Logf("failover steps (ms): %s", executetest.FormatSteps(r2))
	rr := h.Result(relEnv)
	if rr.Outcome != events.OutcomeApplied {
		t.Fatalf("release: %s %s", rr.Outcome, rr.Error)
	}
	// n1 had let go before n2 took the address: never two at once.
	if removed, added := rr.Steps[len(rr.Steps)-1].At, executetest.StepAt(t, r2, StepAddressAdded); !removed.Before(added) {
		t.Fatalf("n2 added the address at %s, before n1 removed it at %s", added.Format("15:04:05.000000"), removed.Format("15:04:05.000000"))
	}
	// Within the first burst (5 × 200 ms) of the first announcement.
	burstEnd := executetest.StepAt(t, r2, StepAnnounced).Add(time.Second)
	for _, ip := range []netip.Addr{vip4.Addr(), vip6.Addr()} {
		waittest.Succeeds(t, time.Until(burstEnd), "the client maps "+ip.String()+" to n2 within the first burst", func() error {
			if got := h.neigh(ip); got != h.lan.MACs["n2"].String() {
				return fmt.Errorf("the client maps it to %s; n2 is %s", got, h.lan.MACs["n2"])
			}
			return nil
		})
	}
	if h.holds("n1", vip4) || h.holds("n1", vip6) || !h.holds("n2", vip4) || !h.holds("n2", vip6) {
		t.Fatal("after the move n1 must hold nothing and n2 both addresses")
	}

	// Back to n1, naming a release that is never answered (its executor
	// dead, say): the claim waits claim.release_wait, then goes ahead.
	h.PutStatus(events.GroupStatus{Group: "pbx", Addresses: []string{vip4.String(), vip6.String()}, Epoch: 3}, pendingState(3, "n1", "z"))
	h.Result(h.Send(3, releaseCmd("n2")))
	claim3 := claimCmd("n1", true, "n2")
	claim3.AfterReleases = []string{"0193a1b2-0000-7000-8000-00000000dead"}
	r3 := h.Result(h.Send(3, claim3))
	// The wait is the executor's first step, right after the contract's.
	if names := executetest.StepNames(r3); r3.Outcome != events.OutcomeApplied || len(names) < 4 || names[3] != StepNotReleased {
		t.Fatalf("claim after an unanswered release: %s %q steps %v", r3.Outcome, r3.Error, executetest.StepNames(r3))
	}
	if waited := executetest.StepAt(t, r3, StepNotReleased).Sub(executetest.StepAt(t, r3, StepReceived)); waited < DefaultReleaseWait {
		t.Fatalf("gave up on the release after %s, before claim.release_wait %s", waited, DefaultReleaseWait)
	}
	// The claim-step histogram saw both of n1's claims.
	if n := histogramCount(t, s1, StepAddressAdded); n != 2 {
		t.Fatalf("n1's %s histogram count %d, want 2", StepAddressAdded, n)
	}
}

// Two ipmovers told to hold one address (a stale claim racing a current
// one): each sees the other's announcements, checks the arbiter's state,
// and exactly one keeps it; the other yields and says so.
func TestRacingHoldersEndWithOne(t *testing.T) {
	h := newHarness(t)
	h.lan.Hosts["cl"].IP(t, "neigh", "replace", vip4.Addr().String(), "lladdr", staleMAC, "dev", netlabtest.LANInterface, "nud", "stale")
	h.start(h.config("n1"))
	h.start(h.config("n2"))
	h.PutStatus(events.GroupStatus{Group: "pbx", Addresses: []string{vip4.String(), vip6.String()}, Holder: "n2", Epoch: 3}, "")
	a := h.Send(3, claimCmd("n1", true, "n2"))
	b := h.Send(3, claimCmd("n2", true, "n1"))
	h.Result(a)
	h.Result(b)
	_, p := h.WaitEvent("n1 yields", func(_ events.Envelope, p events.Payload) bool {
		c, ok := p.(*events.AddressConflict)
		return ok && c.Node == "n1" && c.Action == events.ConflictYielded
	})
	c := p.(*events.AddressConflict)
	if c.OtherMAC != h.lan.MACs["n2"].String() || c.Holder != "n2" {
		t.Fatalf("conflict %+v: want n2's MAC and holder n2", c)
	}
	waittest.Until(t, 5*time.Second, "one holder", func() bool {
		return !h.holds("n1", vip4) && !h.holds("n1", vip6) && h.holds("n2", vip4) && h.holds("n2", vip6)
	})
	waittest.Until(t, 5*time.Second, "client follows n2", func() bool {
		return h.neigh(vip4.Addr()) == h.lan.MACs["n2"].String()
	})
	// n2 never yields: it confirmed.
	_, pays := h.Events()
	for _, p := range pays {
		if c, ok := p.(*events.AddressConflict); ok && c.Node == "n2" && c.Action != events.ConflictKept {
			t.Fatalf("n2 reported %+v", c)
		}
	}
}

// A claim whose previous holder is not fenced is refused while another MAC
// still answers ARP for the address, and nothing is added.
func TestUnfencedClaimRefusedWhileAnswered(t *testing.T) {
	h := newHarness(t)
	h.start(h.config("n2"))
	// n1 holds the address without an ipmover (say it was SIGKILLed).
	h.lan.Hosts["n1"].IP(t, "addr", "add", vip4.String(), "dev", netlabtest.LANInterface)
	c := h.Send(4, claimCmd("n2", false, "n1"))
	r := h.Result(c)
	if r.Outcome != events.OutcomeFailed || !strings.Contains(r.Error, "answered by another host") {
		t.Fatalf("result %s %q, want refused", r.Outcome, r.Error)
	}
	if h.holds("n2", vip4) {
		t.Fatal("refused claim added the address")
	}
	h.WaitEvent("refused conflict", func(_ events.Envelope, p events.Payload) bool {
		c, ok := p.(*events.AddressConflict)
		return ok && c.Action == events.ConflictRefused && c.OtherMAC == h.lan.MACs["n1"].String()
	})
}

// A held address deleted behind the ipmover's back is back within one
// reconcile period, announced again and reported as a correction.
func TestVanishedAddressBack(t *testing.T) {
	h := newHarness(t)
	cfg := h.config("n1")
	h.start(cfg)
	h.PutStatus(events.GroupStatus{Group: "pbx", Addresses: []string{vip4.String(), vip6.String()}, Holder: "n1", Epoch: 1}, "")
	if r := h.Result(h.Send(1, claimCmd("n1", true, ""))); r.Outcome != events.OutcomeApplied {
		t.Fatalf("claim: %s %s", r.Outcome, r.Error)
	}
	h.lan.Hosts["n1"].IP(t, "addr", "del", vip4.String(), "dev", netlabtest.LANInterface)
	gone := time.Now()
	waittest.Until(t, cfg.ReconcilePeriod.D(), "address back", func() bool { return h.holds("n1", vip4) })
	t.Logf("re-added after %v", time.Since(gone))
	h.WaitEvent("readded correction", func(_ events.Envelope, p events.Payload) bool {
		c, ok := p.(*events.AddressCorrection)
		return ok && c.Kind == events.CorrectionReadded && c.Address == vip4.String()
	})
}

// recorder stands in for the bus when a test drives handle directly.
type recorder struct {
	mu  sync.Mutex
	got []events.Payload
}

func (r *recorder) Emit(_ context.Context, p events.Payload, _ ...events.Option) (events.Envelope, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got = append(r.got, p)
	return events.Envelope{}, nil
}

// A restarted ipmover with its state file acknowledges a redelivered claim
// as a duplicate without acting, and refuses an older epoch.
func TestRestartDoesNotReapply(t *testing.T) {
	h := newHarness(t)
	cfg := h.config("n1")
	h.start(cfg)
	h.PutStatus(events.GroupStatus{Group: "pbx", Addresses: []string{vip4.String()}, Holder: "n1", Epoch: 5}, "")
	claim := claimCmd("n1", true, "")
	env := h.Send(5, claim)
	if r := h.Result(env); r.Outcome != events.OutcomeApplied {
		t.Fatalf("claim: %s %s", r.Outcome, r.Error)
	}
	// A clean stop releases.
	h.stop("n1")
	if h.holds("n1", vip4) {
		t.Fatal("clean stop left the address behind")
	}

	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	s2 := New(cfg, slog.New(slog.DiscardHandler), "test")
	s2.ns = h.lan.Hosts["n1"].Handle
	closeAll, err := s2.open()
	if err != nil {
		t.Fatal(err)
	}
	defer closeAll()
	rec := &recorder{}
	s2.pub = rec
	leases, err := h.Ctl.LeaseRecords(t.Context(), events.ArbiterLease)
	if err != nil {
		t.Fatal(err)
	}
	cc := s2.contractConfig()
	cc.Terms, cc.Publisher = execute.NewLeaseTerms(leases), rec
	s2.contract = execute.New(cc)
	seq := h.LastSeq() + 1 // as if redelivered from the stream
	s2.contract.Handle(t.Context(), env, claim, seq)
	old, err := events.New(h.Ctl.Source(), "lab", claimCmd("n1", true, ""), events.WithEpoch(4))
	if err != nil {
		t.Fatal(err)
	}
	s2.contract.Handle(t.Context(), old, claimCmd("n1", true, ""), seq)
	s2.bg.Wait()
	if len(rec.got) != 2 {
		t.Fatalf("%d results, want 2", len(rec.got))
	}
	if r := rec.got[0].(events.CommandResult); r.Outcome != events.OutcomeDuplicate {
		t.Fatalf("redelivered claim after restart: %s %s", r.Outcome, r.Error)
	}
	if r := rec.got[1].(events.CommandResult); r.Outcome != events.OutcomeStaleEpoch {
		t.Fatalf("older epoch after restart: %s %s", r.Outcome, r.Error)
	}
	if h.holds("n1", vip4) {
		t.Fatal("a duplicate re-applied the claim")
	}
}

// stop stops node's ipmover as SIGTERM would, and waits for it.
func (h *harness) stop(node string) { h.stops[node]() }

func histogramCount(t *testing.T, s *Service, step string) uint64 {
	t.Helper()
	var m dto.Metric
	if err := s.m.steps.WithLabelValues(step).(prometheus.Metric).Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetHistogram().GetSampleCount()
}

// Bus-loss policy, both ways: with release the address is gone within the
// lease (and no sooner), with hold it stays however long the bus is gone.
func TestBusLossPolicies(t *testing.T) {
	for _, policy := range []busloss.Policy{busloss.Release, busloss.Hold} {
		t.Run(string(policy), func(t *testing.T) {
			h := newHarness(t)
			cfg := h.config("n1")
			cfg.BusLoss = BusLossConfig{Policy: policy, ReleaseAfter: config.Duration(300 * time.Millisecond),
				CheckEvery: config.Duration(50 * time.Millisecond), HeartbeatInterval: config.Duration(100 * time.Millisecond),
				ArbiterSilentAfter: config.Duration(time.Second)}
			h.start(cfg)
			h.PutStatus(events.GroupStatus{Group: "pbx", Addresses: []string{vip4.String()}, Holder: "n1", Epoch: 1}, "")
			if r := h.Result(h.Send(1, claimCmd("n1", true, ""))); r.Outcome != events.OutcomeApplied {
				t.Fatalf("claim: %s %s", r.Outcome, r.Error)
			}
			cut := time.Now()
			h.Srv.Shutdown()
			if policy == busloss.Release {
				waittest.Until(t, 5*time.Second, "released", func() bool { return !h.holds("n1", vip4) })
				if d := time.Since(cut); d < 300*time.Millisecond {
					t.Fatalf("released %v after the bus went, before the 300ms lease", d)
				}
				t.Logf("released %v after the bus went", time.Since(cut))
				return
			}
			// Thirty failed checks at 50 ms are five leases' worth of
			// silence: still held.
			s := h.svcs["n1"]
			n := s.busChecksFailed.Load()
			waittest.Until(t, 30*time.Second, "thirty failed bus checks", func() bool { return s.busChecksFailed.Load() >= n+30 })
			if !h.holds("n1", vip4) {
				t.Fatalf("hold policy dropped the address %v after the bus went", time.Since(cut))
			}
		})
	}
}
