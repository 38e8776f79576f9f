// Package e2e runs fan's real binaries as separate processes in network
// namespaces and proves one failover end to end.
package e2e

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fanpbx/fan/lab/netlab"
	"github.com/fanpbx/fan/lab/stack"
	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/waittest"
)

func TestFailoverEndToEnd(t *testing.T) {
	ctx, l, st, p := startLab(t, 2*time.Minute, stack.Options{})
	vip := l.FloatingIP().Addr()

	// Placement: the preferred node n1 takes the address and answers on it.
	if _, err := st.WaitAnswer(ctx, p, "n1", 30*time.Second); err != nil {
		t.Fatalf("initial placement: %v", err)
	}
	if mac, _, _ := l.Neigh(netlab.ClientHost, vip); mac != l.MAC("n1") {
		t.Fatalf("client's ARP entry for %s is %q, want n1's %s", vip, mac, l.MAC("n1"))
	}

	// The fault: n1's Asterisk deadlocks (AMI accepts TCP and never
	// answers) and its SIP stack stops answering.
	fault := time.Now()
	if err := st.KillPBX(ctx, "n1"); err != nil {
		t.Fatal(err)
	}
	ans, err := st.WaitAnswer(ctx, p, "n2", 20*time.Second)
	if err != nil {
		t.Fatalf("failover: %v", err)
	}
	t.Logf("fault to first SIP answer from n2 through %s: %v", vip, ans.At.Sub(fault).Round(time.Millisecond))

	// (a) The client's ARP entry names the standby's MAC.
	if mac, state, err := l.Neigh(netlab.ClientHost, vip); err != nil || mac != l.MAC("n2") {
		t.Fatalf("client's ARP entry for %s is %q (%s, %v), want n2's %s", vip, mac, state, err, l.MAC("n2"))
	}
	// The old holder was told to release and did: one holder.
	waittest.Succeeds(t, 10*time.Second, "n1 releasing "+vip.String()+" after the failover", func() error {
		out, err := l.Exec(ctx, "n1", "ip", "-o", "addr", "show", "dev", "eth0")
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(out), " "+vip.String()+"/") {
			return fmt.Errorf("n1 still holds it:\n%s", out)
		}
		return nil
	})

	// (c) The trail explains the move: health-down -> decision -> claim ->
	// result, linked by causation ids, read back through fanctl.
	var chain stack.FailoverChain
	var evs []stack.Event
	found := false
	defer func() {
		if !found {
			for _, e := range evs {
				if _, hb := e.Payload.(*events.NodeHeartbeat); !hb {
					t.Logf("%s %s id=%s cause=%s %+v", e.Env.Type, e.Env.Source.Node, e.Env.ID, e.Env.CausationID, e.Payload)
				}
			}
		}
	}()
	waittest.Succeeds(t, 10*time.Second, "the failover's chain in the trail", func() error {
		var err error
		if evs, err = st.Events(ctx); err != nil {
			t.Fatal(err)
		}
		if chain, err = stack.FindFailoverChain(evs, "n1", "n2"); err != nil {
			return fmt.Errorf("%w (%d events in the trail)", err, len(evs))
		}
		return nil
	})
	found = true
	// The group "pbx" (AMI and SIP both up) went down; its evidence is each
	// member's latest result, and at least one of them failed.
	ht := chain.Health.Payload.(*events.HealthTransition)
	failed := 0
	for _, e := range ht.Evidence {
		if !e.OK {
			failed++
		}
	}
	if ht.Check != "asterisk" || len(ht.Evidence) != 2 || failed == 0 {
		t.Fatalf("health transition %+v: want group pbx with its 2 members' results, at least one failed", ht)
	}
	if chain.Claim.Env.Epoch == 0 || chain.Result.Env.CausationID != chain.Claim.Env.ID {
		t.Fatalf("claim and result not fenced and linked: %+v / %+v", chain.Claim.Env, chain.Result.Env)
	}
	t.Logf("chain: %s -> %s -> %s -> %s", chain.Health.Env.ID, chain.Decision.Env.ID, chain.Claim.Env.ID, chain.Result.Env.ID)

	// fanctl status agrees once the arbiter has taken the claim's result.
	waittest.Succeeds(t, 5*time.Second, "fanctl status showing n2 holding", func() error {
		gs, err := st.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(gs) != 1 || gs[0].Holder != "n2" {
			return fmt.Errorf("fanctl status: %+v", gs)
		}
		return nil
	})

	// (d) fanctl replay reads the real binaries' trail and compares every
	// decision with the core's. Whether they agree is not asserted here:
	// the arbiter waits for presence beacons (before placing, before
	// calling a holder silent) and beacons are not stored, so the replay
	// places as soon as the health allows and everything after differs by
	// that much; the arbiter's own tests replay a trail with controlled
	// inputs and assert agreement.
	out, _ := st.Fanctl(ctx, "replay", "--arbiter-config", st.ConfigPath(netlab.ControlHost, "arbiter"), "--since", "all")
	compared := 0
	if m := regexp.MustCompile(`(?m)^\s*(\d+) decision\(s\):`).FindSubmatch(out); m != nil {
		compared, _ = strconv.Atoi(string(m[1]))
	}
	if compared < 2 {
		t.Fatalf("fanctl replay did not compare the placement and the failover:\n%s", out)
	}
	t.Logf("fanctl replay:\n%s", out)
}
