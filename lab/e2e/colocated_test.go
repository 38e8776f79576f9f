package e2e

import (
	"context"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/fanpbx/fan/lab/bench"
	"github.com/fanpbx/fan/lab/leaders"
	"github.com/fanpbx/fan/lab/netlab"
	"github.com/fanpbx/fan/lab/stack"
)

// TestColocatedTopology runs the small production shape: a NATS server and
// an arbiter replica on each PBX node and on the witness (ctl), streams at
// replicas 3, and loses one server at a time.
//
// Not run by default: under CI's load (the other packages' -race tests on
// 2 cores) a PBX host's crash twice left the two surviving NATS servers
// without a meta leader for more than 45 s, so the failover did not
// complete. That is an open defect of the production bus; run the test
// with FAN_E2E_COLOCATED=1 (and FAN_E2E_FORCED_LEADERS=1 for the forced
// variant) while working on it.
func TestColocatedTopology(t *testing.T) {
	if os.Getenv("FAN_E2E_COLOCATED") != "1" {
		t.Skip("open defect under load: set FAN_E2E_COLOCATED=1 to run")
	}
	stack.RequireLab(t)
	bin := stack.BinDirForTest(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	topo := stack.TopologyColocated
	l, err := netlab.Build(ctx, topo.LabSpec(netlab.Spec{Logger: log}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := l.Close(); err != nil {
			t.Errorf("lab close: %v", err)
		}
	})
	// bus.leader_servers names the witness's server: the arbiter's steward
	// keeps every raft leader there while it is up.
	st, err := stack.Start(ctx, l, stack.Options{BinDir: bin, Log: log, Topology: topo, LeaderPlacement: true, StandbyArbiters: true})
	if st != nil {
		t.Cleanup(func() {
			if t.Failed() {
				t.Log(st.Logs(400))
			}
			st.Stop()
		})
	}
	if err != nil {
		t.Fatal(err)
	}
	p, err := st.Pinger()
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	nc, js, err := st.Connect(netlab.ControlHost)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	// Three servers electing their first leaders on a loaded machine. The
	// first holder is whichever node's prober reported healthy first: a
	// prober whose server has no stream leader yet reports later, and the
	// arbiter does not wait for the preferred node to place the address.
	c, err := bench.NewClient(l)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	crash, err := c.Holder(ctx, 60*time.Second)
	if err != nil {
		t.Fatalf("initial placement: %v", err)
	}
	survivor := "n1"
	if crash == "n1" {
		survivor = "n2"
	}
	settled := func(t *testing.T) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			gs, err := leaders.List(ctx, js)
			if err == nil && leaders.Settled(gs) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("raft groups not settled: %s (%v)", leaders.Describe(gs), err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	settled(t)
	witness := st.ServerName(stack.WitnessHost)
	onWitness := func(t *testing.T, after string) {
		t.Helper()
		wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
		defer wcancel()
		start := time.Now()
		if _, err := leaders.WaitAllOn(wctx, js, witness); err != nil {
			t.Fatalf("%s: %v", after, err)
		}
		t.Logf("%s: every raft leader on %s after %v", after, witness, time.Since(start).Round(time.Millisecond))
	}
	onWitness(t, "start")

	// (a) The holder's host dies whole (PBX, fan's services, its NATS
	// server and its standby arbiter), with the raft leaders and the lease
	// where fan keeps them: on the witness. With FAN_E2E_FORCED_LEADERS=1
	// every raft leader and the lease are forced onto the holder's host
	// first. That variant is not run by default: on a loaded 2-core CI
	// machine the two surviving servers once failed to elect a meta leader
	// within 45 s (an open defect; fan-bench -leaders forced measures it).
	forced := os.Getenv("FAN_E2E_FORCED_LEADERS") == "1"
	name := "node crash with leaders on the witness"
	if forced {
		name = "node crash with everything led from it"
	}
	t.Run(name, func(t *testing.T) {
		if forced {
			fctx, fcancel := context.WithTimeout(ctx, 30*time.Second)
			defer fcancel()
			if err := st.ForceOnto(fctx, nc, js, crash); err != nil {
				t.Fatal(err)
			}
		}
		fault := time.Now()
		if _, err := l.KillAll(crash); err != nil {
			t.Fatal(err)
		}
		// Bounded by raft's election of new stream and consumer leaders
		// (up to 9 s) and then the arbiter's lease TTL.
		ans, err := st.WaitAnswer(ctx, p, survivor, 45*time.Second)
		if err != nil {
			t.Fatalf("failover after %s crashed (leaders forced onto it: %v): %v", crash, forced, err)
		}
		t.Logf("fault to first SIP answer from %s: %v", survivor, ans.At.Sub(fault).Round(time.Millisecond))
		if err := st.StartNode(ctx, crash); err != nil {
			t.Fatal(err)
		}
		settled(t)
		onWitness(t, crash+" returned")
		// The returning node lets go of the address its crash left behind.
		deadline := time.Now().Add(30 * time.Second)
		for {
			hs, err := bench.AddressHolders(ctx, l)
			if err == nil && equal(hs, []string{survivor}) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("holders after %s returned: %v (%v), want [%s]", crash, hs, err, survivor)
			}
			time.Sleep(100 * time.Millisecond)
		}
	})

	// (b) The witness's NATS server dies: the PBX nodes' servers keep a
	// quorum, and the address stays where it is.
	t.Run("witness NATS server killed", func(t *testing.T) {
		before, err := bench.AddressHolders(ctx, l)
		if err != nil || len(before) != 1 {
			t.Fatalf("holders before: %v (%v)", before, err)
		}
		watch := watchHolders(ctx, l)
		if err := st.KillNATS(stack.WitnessHost); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Second) // a window in which nothing may move
		if err := st.StartNATSOn(ctx, stack.WitnessHost); err != nil {
			t.Fatal(err)
		}
		settled(t)
		onWitness(t, "the witness's server returned")
		seen := watch()
		for _, hs := range seen {
			if len(hs) != 1 || hs[0] != before[0] {
				t.Fatalf("the address moved while the witness's server was down: %v (was %v)", seen, before)
			}
		}
	})

	// (c) The holder's NATS server is cut off from the other two (routes
	// only; its clients stay connected to it): one holder throughout.
	t.Run("holder's NATS server partitioned", func(t *testing.T) {
		before, err := bench.AddressHolders(ctx, l)
		if err != nil || len(before) != 1 {
			t.Fatalf("holders before: %v (%v)", before, err)
		}
		holder := before[0]
		watch := watchHolders(ctx, l)
		if err := st.CutRoutes(ctx, holder); err != nil {
			t.Fatal(err)
		}
		time.Sleep(8 * time.Second) // longer than raft's election timeout
		if err := st.HealRoutes(ctx, holder); err != nil {
			t.Fatal(err)
		}
		settled(t)
		seen := watch()
		for _, hs := range seen {
			if len(hs) != 1 {
				t.Fatalf("not exactly one holder while %s's server was cut off: %v", holder, seen)
			}
		}
		t.Logf("holders seen: %v", seen)
	})
}

// watchHolders samples the address's holders every 50 ms until the
// returned function is called, which returns each distinct sample in order.
func watchHolders(ctx context.Context, l *netlab.Lab) func() [][]string {
	ctx, cancel := context.WithCancel(ctx)
	var mu sync.Mutex
	var seen [][]string
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			hs, err := bench.AddressHolders(ctx, l)
			if err == nil {
				mu.Lock()
				if len(seen) == 0 || !equal(seen[len(seen)-1], hs) {
					seen = append(seen, hs)
				}
				mu.Unlock()
			}
			select {
			case <-ctx.Done():
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
	return func() [][]string {
		cancel()
		<-done
		mu.Lock()
		defer mu.Unlock()
		return seen
	}
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
