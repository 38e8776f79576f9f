package bus_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/bus/bustest"
	"github.com/fanpbx/fan/pkg/platform/config"
	"github.com/fanpbx/fan/pkg/platform/waittest"
)

// A command delivered while its executor's link is cut is lost with the
// connection the executor then gives up on. It must not hold back the next
// command once the executor is back: the server sends it again, and the
// next follows at once. Before, with one command in flight per node and a
// 30 s redelivery, the next waited until the lost one's deadline removed
// it: a failover to a node whose link had just come back waited up to the
// lost release's 10 s.
func TestCommandLostInACutDoesNotHoldTheNext(t *testing.T) {
	s := bustest.Server(t)
	arb := bustest.Connect(t, s, ident("arbiter", "ctl"))
	proxy := newLinkProxy(t, strings.TrimPrefix(s.ClientURL(), "nats://"))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const ping = 200 * time.Millisecond
	exec, err := bus.Connect(ctx, bus.Config{URL: proxy.url(), PingInterval: config.Duration(ping)}, ident("ipmover", "n1"), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer exec.Close()

	type receipt struct {
		id string
		at time.Time
	}
	got := make(chan receipt, 16)
	go func() {
		_ = exec.ConsumeCommands(ctx, "n1", func(_ context.Context, env events.Envelope, _ events.Command, _ uint64) {
			got <- receipt{env.ID, time.Now()}
		})
	}()
	emit := func() string {
		t.Helper()
		env, err := arb.Emit(ctx, claim("n1", time.Now().Add(10*time.Second)), events.WithEpoch(1))
		if err != nil {
			t.Fatal(err)
		}
		return env.ID
	}
	next := func(within time.Duration) receipt {
		t.Helper()
		select {
		case r := <-got:
			return r
		case <-time.After(within):
			t.Fatalf("no command within %v", within)
			return receipt{}
		}
	}
	first := emit()
	if r := next(10 * time.Second); r.id != first {
		t.Fatalf("got %s, want %s", r.id, first)
	}

	disconnected := exec.NC.Stats().Reconnects
	proxy.setCut(true)
	lost := emit() // delivered into the cut connection
	// The executor gives the connection up (two unanswered pings) and
	// dials again, held until the heal.
	waittest.Until(t, 10*time.Second, "the executor gives the cut connection up", func() bool { return !exec.NC.IsConnected() })
	proxy.setCut(false)
	waittest.Until(t, 30*time.Second, "the executor reconnects after the heal", func() bool {
		return exec.NC.Stats().Reconnects != disconnected && exec.NC.IsConnected()
	})
	sent := time.Now()
	after := emit()
	r := next(5 * time.Second)
	if r.id != lost {
		t.Fatalf("first after the heal: %s, want the lost command %s sent again", r.id, lost)
	}
	r = next(5 * time.Second)
	if r.id != after {
		t.Fatalf("second after the heal: %s, want %s", r.id, after)
	}
	// The lost one comes back within one redelivery wait of the reconnect;
	// the one sent after it right behind.
	if wait := r.at.Sub(sent); wait > 3500*time.Millisecond {
		t.Fatalf("the command sent after the heal waited %v behind the lost one", wait)
	}
	t.Logf("the command sent after the heal arrived in %v", r.at.Sub(sent).Round(time.Millisecond))
}

// A command that takes longer than the redelivery wait (a claim waiting
// for a release, probing, announcing) is not sent again while the executor
// works on it.
func TestLongCommandIsNotSentAgain(t *testing.T) {
	s := bustest.Server(t)
	arb := bustest.Connect(t, s, ident("arbiter", "ctl"))
	exec := bustest.Connect(t, s, ident("ipmover", "n1"))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	calls := make(chan string, 8)
	go func() {
		_ = exec.ConsumeCommands(ctx, "n1", func(_ context.Context, env events.Envelope, _ events.Command, _ uint64) {
			calls <- env.ID
			time.Sleep(2*bus.ExecutorAckWait + 500*time.Millisecond)
		})
	}()
	env, err := arb.Emit(ctx, claim("n1", time.Now().Add(20*time.Second)), events.WithEpoch(1))
	if err != nil {
		t.Fatal(err)
	}
	if id := <-calls; id != env.ID {
		t.Fatalf("got %s, want %s", id, env.ID)
	}
	// Once the executor has acknowledged it, the server says how often it
	// delivered it.
	cons, err := exec.ExecutorConsumer(ctx, "n1")
	if err != nil {
		t.Fatal(err)
	}
	var info *jetstream.ConsumerInfo
	waittest.Succeeds(t, 3*bus.ExecutorAckWait+5*time.Second, "the command acknowledged", func() error {
		if info, err = cons.Info(ctx); err != nil {
			return err
		}
		if info.NumAckPending != 0 || info.NumPending != 0 {
			return fmt.Errorf("%d unacknowledged, %d waiting", info.NumAckPending, info.NumPending)
		}
		return nil
	})
	if info.Delivered.Consumer != 1 {
		t.Fatalf("delivered %d times while the executor worked on it", info.Delivered.Consumer)
	}
	select {
	case id := <-calls:
		t.Fatalf("command %s handed to the executor again while it worked on it", id)
	default:
	}
}
