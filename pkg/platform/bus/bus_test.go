package bus_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/bus/bustest"
	"github.com/fanpbx/fan/pkg/platform/config"
)

func ident(svc, node string) bus.Identity {
	return bus.Identity{Cluster: "lab", Service: svc, Node: node, Version: "test"}
}

func TestProvisionIsIdempotentAndNeverFights(t *testing.T) {
	s := bustest.Server(t)
	ctx := context.Background()
	first := bustest.Connect(t, s, ident("arbiter", "ctl"))
	// Several services starting at once all provision; none may fail, and a
	// differently configured one must leave the existing streams alone.
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for i := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cfg := bus.Config{URL: s.ClientURL()}
			if i == 3 {
				cfg.EventsMaxAge = config.Duration(time.Hour)
			}
			b, err := bus.Connect(ctx, cfg, ident("svc", "n1"), slog.New(slog.DiscardHandler))
			if err != nil {
				errs <- err
				return
			}
			defer b.Close()
			errs <- b.Provision(ctx)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("concurrent provision: %v", err)
		}
	}
	st, err := first.JS.Stream(ctx, bus.EventsStream)
	if err != nil {
		t.Fatal(err)
	}
	if got := st.CachedInfo().Config.MaxAge; got != 90*24*time.Hour {
		t.Fatalf("events max age changed to %v by a later instance", got)
	}
}

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
	select {
	case c := <-seen:
		t.Fatalf("unexpected second command %+v", c)
	case <-time.After(300 * time.Millisecond):
	}
	stop()

	// The audit stream keeps a copy of both commands, consumed or not.
	deadline := time.Now().Add(5 * time.Second)
	for {
		st, _ := arb.JS.Stream(ctx, bus.EventsStream)
		info, _ := st.Info(ctx)
		if info.State.Msgs == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("audit stream holds %d commands, want 2", info.State.Msgs)
		}
		time.Sleep(50 * time.Millisecond)
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
	deadline := time.Now().Add(5 * time.Second)
	for {
		info, err := st.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.State.Msgs == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("expired command still stored for an absent executor")
		}
		time.Sleep(100 * time.Millisecond)
	}
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

func TestConfigValidation(t *testing.T) {
	cases := map[string]bus.Config{
		"neither":      {},
		"both":         {URL: "nats://127.0.0.1:4222", Embedded: &bus.Embedded{StoreDir: "/tmp/x"}},
		"no store dir": {Embedded: &bus.Embedded{}},
		"creds+nkey":   {URL: "nats://x:4222", Creds: "a", NKeySeed: "b"},
		"cert no key":  {URL: "nats://x:4222", TLS: bus.TLSConfig{Cert: "c"}},
		// Bounds: each refused naming its key (docs/bounds.md).
		"listen port 70000":   {Embedded: &bus.Embedded{StoreDir: "/tmp/x", Listen: "127.0.0.1:70000"}},
		"route port 70000":    {Embedded: &bus.Embedded{StoreDir: "/tmp/x", ServerName: "a", Cluster: bus.EmbeddedCluster{Name: "c", Listen: "127.0.0.1:6222", Routes: []string{"127.0.0.1:70000"}}}},
		"17 routes":           {Embedded: &bus.Embedded{StoreDir: "/tmp/x", ServerName: "a", Cluster: bus.EmbeddedCluster{Name: "c", Listen: "127.0.0.1:6222", Routes: make([]string, 17)}}},
		"ping -1s":            {URL: "nats://127.0.0.1:4222", PingInterval: config.Duration(-time.Second)},
		"max age -1h":         {URL: "nats://127.0.0.1:4222", EventsMaxAge: config.Duration(-time.Hour)},
		"17 servers":          {URL: strings.Repeat("nats://127.0.0.1:4222,", 16) + "nats://127.0.0.1:4222"},
		"server without host": {URL: "nats://:4222"},
		"audit too small":     {URL: "nats://127.0.0.1:4222", Limits: bus.Limits{EventsMiB: 63}},
		"live too big":        {URL: "nats://127.0.0.1:4222", Limits: bus.Limits{LiveMiB: 1<<16 + 1}},
		"negative state":      {URL: "nats://127.0.0.1:4222", Limits: bus.Limits{StateMiB: -1}},
		"commands small":      {URL: "nats://127.0.0.1:4222", Limits: bus.Limits{CommandsMiB: 15}},
		"live age short":      {URL: "nats://127.0.0.1:4222", Limits: bus.Limits{LiveMaxAge: config.Duration(9 * time.Minute)}},
		"live age long":       {URL: "nats://127.0.0.1:4222", Limits: bus.Limits{LiveMaxAge: config.Duration(169 * time.Hour)}},
	}
	for name, c := range cases {
		if err := c.Validate(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	ok := bus.Config{URL: "nats://127.0.0.1:4222", Limits: bus.Limits{EventsMiB: 64, LiveMiB: 1 << 16, LiveMaxAge: config.Duration(168 * time.Hour)}}
	if err := ok.Validate(); err != nil {
		t.Errorf("limits at their bounds refused: %v", err)
	}
	var d bus.Config
	d.Defaults()
	if d.Limits.TotalMiB() != bus.DefaultEventsMiB+bus.DefaultLiveMiB+bus.DefaultCommandsMiB+bus.DefaultStateMiB+bus.DefaultCallsMiB || d.Limits.LiveMaxAge.D() != bus.DefaultLiveMaxAge {
		t.Errorf("default limits %+v", d.Limits)
	}
}

func TestEmbeddedServerInProcess(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	b, err := bus.Connect(ctx, bus.Config{Embedded: &bus.Embedded{StoreDir: t.TempDir()}}, ident("lab", "one"), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if err := b.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Emit(ctx, events.ServiceAnnounce{Service: "lab", Node: "one", Version: "t", State: events.ServiceStarted}); err != nil {
		t.Fatal(err)
	}
}
