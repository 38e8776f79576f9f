package bus_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/bus/bustest"
	"github.com/fanpbx/fan/pkg/platform/waittest"
)

func TestEventsAreDedupedAndWatched(t *testing.T) {
	s := bustest.Server(t)
	b := bustest.Connect(t, s, ident("prober", "n1"))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	got := make(chan events.Envelope, 10)
	watchCtx, stopWatch := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- b.Watch(watchCtx, bus.WatchOptions{Subjects: []string{events.ClusterEvents("lab")}, All: true},
			func(env events.Envelope, p events.Decoded, seq uint64) { got <- env })
	}()
	p := events.ServiceAnnounce{Service: "prober", Node: "n1", Version: "test", State: events.ServiceStarted}
	env, err := b.Emit(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	// A retry of the same envelope is stored once (Nats-Msg-Id).
	if err := b.Publish(ctx, env, p); err != nil {
		t.Fatal(err)
	}
	select {
	case e := <-got:
		if e.ID != env.ID {
			t.Fatalf("got %s want %s", e.ID, env.ID)
		}
	case <-ctx.Done():
		t.Fatal("event not delivered")
	}
	st, _ := b.JS.Stream(ctx, bus.EventsStream)
	info, _ := st.Info(ctx)
	if info.State.Msgs != 1 {
		t.Fatalf("stream holds %d messages, want 1 (dedupe)", info.State.Msgs)
	}
	stopWatch()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestExpiredCommandsAreNotPublishedOrDelivered(t *testing.T) {
	s := bustest.Server(t)
	arb := bustest.Connect(t, s, ident("arbiter", "ctl"))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := arb.Emit(ctx, claim("n1", time.Now().Add(-time.Second)), events.WithEpoch(1)); !errors.Is(err, bus.ErrExpired) {
		t.Fatalf("publishing an expired command: %v, want ErrExpired", err)
	}
	// A command whose executor is away is deleted by the server at its deadline.
	if _, err := arb.Emit(ctx, claim("n1", time.Now().Add(500*time.Millisecond)), events.WithEpoch(1)); err != nil {
		t.Fatal(err)
	}
	st, _ := arb.JS.Stream(ctx, bus.CommandsStream)
	waittest.Succeeds(t, 5*time.Second, "the expired command deleted for an absent executor", func() error {
		info, err := st.Info(ctx)
		if err != nil {
			return err
		}
		if info.State.Msgs != 0 {
			return fmt.Errorf("%d stored", info.State.Msgs)
		}
		return nil
	})
}

func TestPublishFailsFastWhileDisconnected(t *testing.T) {
	s := bustest.Server(t)
	b := bustest.Connect(t, s, ident("arbiter", "ctl"))
	s.Shutdown()
	s.WaitForShutdown()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	_, err := b.Emit(ctx, claim("n1", time.Now().Add(10*time.Second)), events.WithEpoch(1))
	if err == nil {
		t.Fatal("publish while the server is down must fail, not be buffered for later")
	}
}
