package steward

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/bus/bustest"
	"github.com/fanpbx/fan/pkg/platform/waittest"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func testLog() *slog.Logger {
	if os.Getenv("FAN_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	return slog.New(slog.DiscardHandler)
}

func TestTarget(t *testing.T) {
	peer := func(name string, current bool, active time.Duration) *jetstream.PeerInfo {
		return &jetstream.PeerInfo{Name: name, Current: current, Active: active}
	}
	pref := []string{"w1", "w2"}
	cases := []struct {
		name string
		ci   *jetstream.ClusterInfo
		want string
	}{
		{"no info", nil, ""},
		{"no leader: an election is under way", &jetstream.ClusterInfo{Replicas: []*jetstream.PeerInfo{peer("w1", true, 0)}}, ""},
		{"led from a chosen server", &jetstream.ClusterInfo{Leader: "w2", Replicas: []*jetstream.PeerInfo{peer("w1", true, 0)}}, ""},
		{"first choice current", &jetstream.ClusterInfo{Leader: "p1", Replicas: []*jetstream.PeerInfo{peer("w2", true, 0), peer("w1", true, 0)}}, "w1"},
		{"first choice behind", &jetstream.ClusterInfo{Leader: "p1", Replicas: []*jetstream.PeerInfo{peer("w2", true, 0), peer("w1", false, 0)}}, "w2"},
		{"first choice silent", &jetstream.ClusterInfo{Leader: "p1", Replicas: []*jetstream.PeerInfo{peer("w1", true, 5*time.Second)}}, ""},
		{"no chosen peer", &jetstream.ClusterInfo{Leader: "p1", Replicas: []*jetstream.PeerInfo{peer("p2", true, 0)}}, ""},
		{"offline", &jetstream.ClusterInfo{Leader: "p1", Replicas: []*jetstream.PeerInfo{{Name: "w1", Current: true, Offline: true}}}, ""},
	}
	for _, c := range cases {
		if got := Target(pref, c.ci); got != c.want {
			t.Errorf("%s: Target = %q, want %q", c.name, got, c.want)
		}
	}
}

// leaders names every stewarded group's leader: "stream", "stream/consumer", "$meta".
func leaders(t *testing.T, s *Steward) map[string]string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	out := map[string]string{}
	for _, name := range s.cfg.Streams {
		st, err := s.js.Stream(ctx, name)
		if err != nil {
			out[name] = "?"
			continue
		}
		out[name] = leaderOf(st.CachedInfo().Cluster)
		for ci := range st.ListConsumers(ctx).Info() {
			if len(ci.Cluster.Replicas) > 0 {
				out[name+"/"+ci.Name] = leaderOf(ci.Cluster)
			}
		}
	}
	if s.sys != nil {
		if ci, err := s.metaCluster(ctx); err == nil {
			out[metaGroup] = ci.Leader
		} else {
			out[metaGroup] = "?"
		}
	}
	return out
}

func leaderOf(ci *jetstream.ClusterInfo) string {
	if ci == nil || ci.Leader == "" {
		return "?"
	}
	return ci.Leader
}

func allOn(m map[string]string, server string) bool {
	for _, l := range m {
		if l != server {
			return false
		}
	}
	return true
}

func show(m map[string]string) string {
	var ks []string
	for k, v := range m {
		ks = append(ks, k+"="+v)
	}
	sort.Strings(ks)
	return strings.Join(ks, " ")
}

// TestStewardKeepsLeadersOnChosenServer runs a real three-server cluster:
// leaders forced onto n3 come back to n1; with n1 stopped they stay where
// the cluster put them (no step-down among servers that are not chosen);
// after n1 restarts they return to it.
func TestStewardKeepsLeadersOnChosenServer(t *testing.T) {
	if testing.Short() {
		t.Skip("three-server cluster")
	}
	c := bustest.SystemCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	b, err := bus.Connect(ctx, bus.Config{URL: c.URL(), Replicas: 3}, bus.Identity{Cluster: "lab", Service: "arbiter", Node: "a1"}, testLog())
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if err := b.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.ProvisionObjectStores(ctx); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"pbx1", "pbx2"} {
		if _, err := b.ExecutorConsumer(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	sys, err := nats.Connect(c.URL(), nats.UserInfo(bustest.SystemUser, bustest.SystemPassword))
	if err != nil {
		t.Fatal(err)
	}
	defer sys.Close()

	// Leaders on n3 first, as after a crash of n1 and an election.
	force := New(Config{LeaderServers: []string{"n3"}, Streams: bus.Streams(), MinGap: time.Millisecond}, b.NC, b.JS, sys, testLog())
	waittest.Until(t, 60*time.Second, "leaders forced onto n3", func() bool {
		force.Sweep(ctx)
		return allOn(leaders(t, force), "n3")
	})
	t.Logf("forced: %s", show(leaders(t, force)))

	s := New(Config{LeaderServers: []string{"n1"}, Streams: bus.Streams()}, b.NC, b.JS, sys, testLog())
	sctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- s.Run(sctx) }()
	defer func() { stop(); <-done }()

	took := waittest.Until(t, 30*time.Second, "leaders back on n1", func() bool { return allOn(leaders(t, s), "n1") })
	groups := len(leaders(t, s))
	fmt.Printf("steward: %d raft groups moved from n3 to n1 in %v\n", groups, took.Round(10*time.Millisecond))
	if got := testutil.ToFloat64(s.moves.WithLabelValues("meta", "moved")); got < 1 {
		t.Errorf("meta moves = %v, want at least 1", got)
	}

	// n1 leaves cleanly: its groups hand over to n2 or n3, and the steward
	// must not move them between those two.
	c.Stop("n1")
	waittest.Until(t, 30*time.Second, "leaders elected without n1", func() bool {
		for _, l := range leaders(t, s) {
			if l == "n1" || l == "?" {
				return false
			}
		}
		return true
	})
	before := leaders(t, s)
	moves := totalMoves(s)
	checks := testutil.ToFloat64(s.checks)
	waittest.Until(t, 30*time.Second, "two sweeps without n1", func() bool { return testutil.ToFloat64(s.checks) >= checks+2 })
	if got := totalMoves(s); got != moves {
		t.Errorf("steward asked for %v step-downs while no chosen server was up", got-moves)
	}
	if after := leaders(t, s); show(after) != show(before) {
		t.Errorf("leaders moved without n1: before %s, after %s", show(before), show(after))
	}

	restarted := time.Now()
	c.Restart("n1")
	waittest.Until(t, 60*time.Second, "leaders back on n1 after its restart", func() bool { return allOn(leaders(t, s), "n1") })
	fmt.Printf("steward: %d raft groups back on n1 %v after its restart\n", groups, time.Since(restarted).Round(10*time.Millisecond))
}

func totalMoves(s *Steward) float64 {
	var n float64
	for _, k := range []string{"stream", "consumer", "meta"} {
		n += testutil.ToFloat64(s.moves.WithLabelValues(k, "moved"))
	}
	return n
}

// holdBox is a settable leaders hold and a record of the breaks.
type holdBox struct {
	mu     sync.Mutex
	hold   Hold
	breaks []string
	reads  int // the steward reads the hold once a poll
}

func (h *holdBox) get() Hold {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.reads++
	return h.hold
}

// polls is how many times the steward has read the hold.
func (h *holdBox) polls() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.reads
}

func (h *holdBox) set(x Hold) {
	h.mu.Lock()
	h.hold = x
	h.mu.Unlock()
}

func (h *holdBox) broke(id, why string) {
	h.mu.Lock()
	h.breaks = append(h.breaks, id+": "+why)
	h.mu.Unlock()
}

func (h *holdBox) broken() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.breaks...)
}

// TestStewardObeysALeadersHold runs a real three-server cluster: a hold
// with a server moves every leader there and keeps them; a hold without one
// leaves them where an election put them; its end brings them back to the
// chosen server; and a hold during which the streams lose their majority
// (no election can happen) is broken, saying which group has no leader.
func TestStewardObeysALeadersHold(t *testing.T) {
	if testing.Short() {
		t.Skip("three-server cluster")
	}
	c := bustest.SystemCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	b, err := bus.Connect(ctx, bus.Config{URL: c.URL(), Replicas: 3}, bus.Identity{Cluster: "lab", Service: "arbiter", Node: "a1"}, testLog())
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if err := b.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.ProvisionObjectStores(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := b.ExecutorConsumer(ctx, "pbx1"); err != nil {
		t.Fatal(err)
	}
	sys, err := nats.Connect(c.URL(), nats.UserInfo(bustest.SystemUser, bustest.SystemPassword))
	if err != nil {
		t.Fatal(err)
	}
	defer sys.Close()
	box := &holdBox{}
	s := New(Config{LeaderServers: []string{"n1"}, Streams: bus.Streams(), MinGap: time.Millisecond, Hold: box.get, Break: box.broke,
		BreakAfter: 2 * time.Second}, b.NC, b.JS, sys, testLog())
	sweepUntil := func(what string, cond func(map[string]string) bool) {
		t.Helper()
		waittest.Until(t, 60*time.Second, what, func() bool {
			s.Sweep(ctx)
			return cond(leaders(t, s))
		})
	}
	on := func(server string) func(map[string]string) bool {
		return func(m map[string]string) bool { return allOn(m, server) }
	}
	sweepUntil("leaders on n1", on("n1"))

	// Held onto n3: the operator's server, not the chosen one.
	box.set(Hold{ID: "h1", Server: "n3"})
	sweepUntil("leaders on the hold's server n3", on("n3"))
	t.Logf("held on n3: %s", show(leaders(t, s)))

	// Held where they are: leaders an election (here: another steward)
	// put on n2 stay there.
	box.set(Hold{ID: "h2"})
	force := New(Config{LeaderServers: []string{"n2"}, Streams: bus.Streams(), MinGap: time.Millisecond}, b.NC, b.JS, sys, testLog())
	waittest.Until(t, 60*time.Second, "leaders forced onto n2", func() bool {
		force.Sweep(ctx)
		return allOn(leaders(t, force), "n2")
	})
	moves := totalMoves(s)
	for range 3 {
		s.Sweep(ctx)
	}
	if got := totalMoves(s); got != moves {
		t.Errorf("the steward asked for %v step-downs during a hold without a server", got-moves)
	}
	if m := leaders(t, s); !allOn(m, "n2") {
		t.Errorf("leaders moved during the hold: %s", show(m))
	}

	// The hold ends: back to the chosen server.
	box.set(Hold{})
	sweepUntil("leaders back on n1 after the hold", on("n1"))
	if got := box.broken(); len(got) != 0 {
		t.Fatalf("holds broken while nothing was wrong: %v", got)
	}

	// A hold while two servers are gone: no majority, no election, no
	// leader for longer than BreakAfter. The steward breaks the hold.
	box.set(Hold{ID: "h3"})
	c.Stop("n2")
	c.Stop("n3")
	began := time.Now()
	waittest.Until(t, 90*time.Second, "the hold broken", func() bool {
		s.Sweep(ctx)
		return len(box.broken()) > 0
	})
	got := box.broken()
	// The groups on n1 notice one by one that they lost their majority:
	// whichever is first without a leader for BreakAfter ends the hold,
	// and is named.
	if len(got) != 1 || !strings.HasPrefix(got[0], "h3: ") || !strings.Contains(got[0], " has had no leader for ") ||
		!strings.Contains(got[0], "longer than an election takes") || !namesAGroup(got[0], s.cfg.Streams) {
		t.Fatalf("breaks %v", got)
	}
	if took := time.Since(began); took < 2*time.Second {
		t.Errorf("broken %v after the majority went, before BreakAfter (2s)", took)
	}
	t.Logf("broken after %v: %s", time.Since(began).Round(100*time.Millisecond), got[0])
	s.Sweep(ctx)
	if got := box.broken(); len(got) != 1 {
		t.Errorf("a broken hold was broken again: %v", got)
	}
	c.Restart("n2")
	c.Restart("n3")
}

// TestStewardBreaksAHoldWhenCommandsCannotBeStored: while the arbiter
// leader reports that it cannot store its state or commands, the hold in
// force ends at the next poll, saying so; without a hold nothing is broken.
func TestStewardBreaksAHoldWhenCommandsCannotBeStored(t *testing.T) {
	srv := bustest.Server(t)
	b := bustest.Connect(t, srv, bus.Identity{Cluster: "lab", Service: "arbiter", Node: "a1"})
	var mu sync.Mutex
	trouble := ""
	box := &holdBox{}
	s := New(Config{LeaderServers: []string{"elsewhere"}, Streams: bus.Streams(), Hold: box.get, Break: box.broke,
		Trouble: func() string { mu.Lock(); defer mu.Unlock(); return trouble }}, b.NC, b.JS, nil, testLog())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	defer func() { cancel(); <-done }()

	mu.Lock()
	trouble = "cannot persist decisions since 02:10: context deadline exceeded"
	mu.Unlock()
	// Several polls, each of which would break a hold: none to break.
	seen := box.polls()
	waittest.Until(t, 5*time.Second, "three polls with the trouble and no hold", func() bool { return box.polls() >= seen+3 })
	if got := box.broken(); len(got) != 0 {
		t.Fatalf("broke %v without a hold", got)
	}
	box.set(Hold{ID: "h1"})
	waittest.Until(t, 5*time.Second, "the hold broken", func() bool { return len(box.broken()) > 0 })
	if got := box.broken(); len(got) != 1 || got[0] != "h1: the arbiter leader cannot store its state or its commands (cannot persist decisions since 02:10: context deadline exceeded)" {
		t.Fatalf("breaks %v", got)
	}
	if got := testutil.ToFloat64(s.breaks); got != 1 {
		t.Errorf("fan_arbiter_leaders_hold_breaks_total = %v", got)
	}
}

// namesAGroup reports whether a break's reason names one of the raft
// groups the steward keeps: a stream, a consumer on one, the meta group.
func namesAGroup(why string, streams []string) bool {
	if strings.HasPrefix(why, "h3: the meta group ") {
		return true
	}
	for _, st := range streams {
		if strings.HasPrefix(why, "h3: stream "+st+" ") || strings.HasPrefix(why, "h3: consumer "+st+"/") {
			return true
		}
	}
	return false
}
