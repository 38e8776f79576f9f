package e2e

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/fanpbx/fan/lab/bench"
	"github.com/fanpbx/fan/lab/leaders"
	"github.com/fanpbx/fan/lab/netlab"
	"github.com/fanpbx/fan/lab/stack"
	"github.com/fanpbx/fan/pkg/platform/waittest"
)

// TestColocatedTopology runs the small production shape: a NATS server and
// an arbiter replica on each PBX node and on the witness (ctl), streams at
// replicas 3, and loses one server at a time. Set FAN_LAB_KEEP=dir to keep
// every process's log (the NATS servers' elections among them) under dir.
func TestColocatedTopology(t *testing.T) {
	// bus.leader_servers names the witness's server: the arbiter's steward
	// keeps every raft leader there while it is up.
	ctx, l, st, p := startLab(t, 3*time.Minute, stack.Options{Topology: stack.TopologyColocated,
		LeaderPlacement: true, StandbyArbiters: true})
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
	first, err := c.Holder(ctx, 60*time.Second)
	if err != nil {
		t.Fatalf("initial placement: %v", err)
	}
	other := map[string]string{"n1": "n2", "n2": "n1"}
	settled := func(t *testing.T) {
		t.Helper()
		waittest.Succeeds(t, 30*time.Second, "raft groups settled", func() error {
			gs, err := leaders.List(ctx, js)
			if err == nil && !leaders.Settled(gs) {
				err = fmt.Errorf("not settled: %s", leaders.Describe(gs))
			}
			return err
		})
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

	// The holder's host dies whole (PBX, fan's services, its NATS server
	// and its standby arbiter) and comes back; the survivor must take over
	// and the returning node let go of the address its crash left behind.
	// Bounded by raft's election of new leaders (4 to 9 s, nats-server's
	// constants) when they were on the dead host, then the arbiter's lease.
	crashHolder := func(t *testing.T, crash string, force bool) {
		survivor := other[crash]
		if force {
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
		// A failed wait must not leave the host down: the next subtest
		// needs all three servers, and two failures from one cause would
		// hide which fault it was.
		restarted := false
		defer func() {
			if !restarted {
				if err := st.StartNode(ctx, crash); err != nil {
					t.Errorf("restart %s after the failure: %v", crash, err)
				}
			}
		}()
		ans, err := st.WaitAnswer(ctx, p, survivor, 45*time.Second)
		if err != nil {
			gs, lerr := leaders.List(ctx, js)
			lease, _ := leaders.ArbiterLease(ctx, js, st.Cluster())
			t.Fatalf("failover after %s crashed (leaders forced onto it: %v): %v; raft leaders now: %s (%v); arbiter lease: %+v",
				crash, force, err, leaders.Describe(gs), lerr, lease)
		}
		t.Logf("fault to first SIP answer from %s: %v", survivor, ans.At.Sub(fault).Round(time.Millisecond))
		restarted = true
		if err := st.StartNode(ctx, crash); err != nil {
			t.Fatal(err)
		}
		settled(t)
		onWitness(t, crash+" returned")
		waittest.Succeeds(t, 30*time.Second, fmt.Sprintf("%s the only holder after %s returned", survivor, crash), func() error {
			hs, err := bench.AddressHolders(ctx, l)
			if err == nil && !equal(hs, []string{survivor}) {
				err = fmt.Errorf("holders %v", hs)
			}
			return err
		})
	}
	// (a) Every raft leader, the meta leader and the arbiter's lease forced
	// onto the holder's host first: the worst place for them.
	t.Run("node crash with everything led from it", func(t *testing.T) {
		crashHolder(t, first, true)
	})
	// (b) The new holder's host dies with the leaders where fan keeps them,
	// on the witness: no election stands between the crash and the move.
	t.Run("node crash with leaders on the witness", func(t *testing.T) {
		crashHolder(t, other[first], false)
	})

	// (c) The witness's NATS server dies: the PBX nodes' servers keep a
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

	// (d) The holder's NATS server is cut off from the other two (routes
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
