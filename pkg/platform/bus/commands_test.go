package bus_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/bus/bustest"
	"github.com/fanpbx/fan/pkg/platform/waittest"
)

func claim(node string, notAfter time.Time) events.ClaimIP {
	return events.ClaimIP{Group: "pbx", Node: node, Addresses: []string{"198.51.100.10/24"}, NotAfter: notAfter}
}

func TestCommandsReachOnlyTheirNodeAndAreAudited(t *testing.T) {
	s := bustest.Server(t)
	arb := bustest.Connect(t, s, ident("arbiter", "ctl"))
	n2 := bustest.Connect(t, s, ident("ipmover", "n2"))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	for _, node := range []string{"n1", "n2"} {
		if _, err := arb.Emit(ctx, claim(node, time.Now().Add(10*time.Second)), events.WithEpoch(1)); err != nil {
			t.Fatal(err)
		}
	}
	seen := make(chan events.ClaimIP, 4)
	cctx, stop := context.WithCancel(ctx)
	go func() {
		_ = n2.ConsumeCommands(cctx, "n2", func(_ context.Context, env events.Envelope, c events.Command, _ uint64) {
			seen <- *c.(*events.ClaimIP)
		})
	}()
	select {
	case c := <-seen:
		if c.Node != "n2" {
			t.Fatalf("n2's executor got a command for %s", c.Node)
		}
	case <-ctx.Done():
		t.Fatal("command not delivered")
	}
	// Another command for n1, then one for n2: whatever n2's executor gets
	// before the second of its own would be n1's.
	for _, node := range []string{"n1", "n2"} {
		if _, err := arb.Emit(ctx, claim(node, time.Now().Add(10*time.Second)), events.WithEpoch(1)); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case c := <-seen:
		if c.Node != "n2" {
			t.Fatalf("n2's executor got a command for %s", c.Node)
		}
	case <-ctx.Done():
		t.Fatal("second command not delivered")
	}
	stop()

	// The audit stream keeps a copy of every command, consumed or not.
	waittest.Succeeds(t, 5*time.Second, "all four commands in the audit stream", func() error {
		st, err := arb.JS.Stream(ctx, bus.EventsStream)
		if err != nil {
			return err
		}
		info, err := st.Info(ctx)
		if err != nil {
			return err
		}
		if info.State.Msgs != 4 {
			return fmt.Errorf("it holds %d", info.State.Msgs)
		}
		return nil
	})
}
