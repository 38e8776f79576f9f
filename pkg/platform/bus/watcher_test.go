package bus_test

import (
	"context"
	"fmt"
	"github.com/fanpbx/fan/pkg/platform/logtest"
	"log/slog"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/bus/bustest"
	"github.com/fanpbx/fan/pkg/platform/waittest"
)

func TestMain(m *testing.M) {
	bustest.RunMemberIfAsked()
	os.Exit(m.Run())
}

// TestWatchSurvivesTheLossOfItsServer stops the server that holds a
// Watch's ordered consumer while events keep coming: the watch resumes on
// another server with every event exactly once, in order.
func TestWatchSurvivesTheLossOfItsServer(t *testing.T) {
	if testing.Short() {
		t.Skip("three-server cluster")
	}
	c := bustest.Cluster(t, "n1", "n2", "n3")
	testWatchSurvives(t, c.URL(), "stopped", c.Stop)
}

// TestWatchSurvivesTheCrashOfItsServer is the same with the server killed
// (SIGKILL), as when its host dies: no shutdown announcement reaches the
// other servers, which keep counting the dead one as a place for new
// consumers until they notice.
func TestWatchSurvivesTheCrashOfItsServer(t *testing.T) {
	if testing.Short() {
		t.Skip("three-server cluster")
	}
	c := bustest.NewCrashCluster(t, "n1", "n2", "n3")
	testWatchSurvives(t, c.URL(), "killed", c.Kill)
}

func testWatchSurvives(t *testing.T, url, how string, lose func(server string)) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var logs logtest.Buffer
	t.Cleanup(func() { t.Logf("clients' log:\n%s", logs.String()) })
	connect := func(svc, node string, log *slog.Logger) *bus.Bus {
		b, err := bus.Connect(ctx, bus.Config{URL: url, Replicas: 3}, ident(svc, node), log)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(b.Close)
		if err := b.Provision(ctx); err != nil {
			t.Fatal(err)
		}
		return b
	}
	pub := connect("prober", "n1", slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})).With("client", "publisher"))
	watcher := connect("arbiter", "a1", slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})))

	type got struct {
		seq uint64
		at  time.Time
	}
	delivered := make(chan got, 1024)
	wctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- watcher.Watch(wctx, bus.WatchOptions{Subjects: []string{events.AllHeartbeats("lab")}, All: true},
			func(_ events.Envelope, p events.Decoded, _ uint64) {
				if hb, ok := p.(*events.NodeHeartbeat); ok {
					delivered <- got{hb.Seq, time.Now()}
				}
			})
	}()
	defer func() { stop(); <-done }()

	// emit publishes heartbeat seq, retrying the same envelope (stored once)
	// while the cluster elects.
	emit := func(seq uint64) error {
		p := &events.NodeHeartbeat{Node: "n1", Seq: seq, IntervalMS: 1000, Version: "test"}
		env, err := events.New(pub.Source(), "lab", p)
		if err != nil {
			return err
		}
		for err := pub.Publish(ctx, env, p); err != nil; err = pub.Publish(ctx, env, p) {
			if ctx.Err() != nil {
				return fmt.Errorf("publish of heartbeat %d never succeeded: %w", seq, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
		return nil
	}
	var stored11 atomic.Int64
	var emitErr atomic.Pointer[error]
	emitted := make(chan struct{})
	next := uint64(1)
	expect := func(upTo uint64) time.Time {
		var last time.Time
		for next <= upTo {
			select {
			case g := <-delivered:
				if g.seq != next {
					t.Fatalf("delivered heartbeat %d, want %d (lost or duplicated)", g.seq, next)
				}
				next++
				last = g.at
			case <-ctx.Done():
				var err error
				if p := emitErr.Load(); p != nil {
					err = *p
				}
				t.Fatalf("heartbeat %d never delivered (heartbeat 11 stored: %v; publisher: %v)", next, stored11.Load() != 0, err)
			}
		}
		return last
	}
	for i := uint64(1); i <= 10; i++ {
		if err := emit(i); err != nil {
			t.Fatal(err)
		}
	}
	expect(10)

	// The ordered consumer lives on one server (replicas 1), on the
	// stream that keeps heartbeats.
	st, err := watcher.JS.Stream(ctx, bus.LiveStream)
	if err != nil {
		t.Fatal(err)
	}
	host := ""
	for ci := range st.ListConsumers(ctx).Info() {
		host = ci.Cluster.Leader
	}
	if host == "" {
		t.Fatal("no consumer found on the live stream")
	}
	lose(host)
	stopped := time.Now()
	// A publish whose acknowledgement was lost in the election is retried
	// (stored once) and may still be in flight after its delivery.
	go func() {
		defer close(emitted)
		for i := uint64(11); i <= 40; i++ {
			if err := emit(i); err != nil {
				emitErr.Store(&err)
				return
			}
			if i == 11 {
				stored11.Store(time.Now().UnixNano())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	defer func() { cancel(); <-emitted }()
	first := expect(11)
	expect(40)
	stored := time.Unix(0, stored11.Load())
	// Storing waits for a new stream leader if the lost server led the
	// stream, and making a new consumer for a new meta leader if it led the
	// meta group: an election each (4 to 9 s).
	fmt.Printf("watch: its server (%s) %s; heartbeat 11 stored %v later, delivered %v after that; 40 of 40, none twice\n",
		host, how, stored.Sub(stopped).Round(10*time.Millisecond), first.Sub(stored).Round(10*time.Millisecond))
	select {
	case g := <-delivered:
		t.Fatalf("extra delivery of heartbeat %d", g.seq)
	default:
	}
}

// TestWatchLivesOnTheLeaderServers: with bus.leader_servers set (the
// arbiter's), a watch's consumer is made on a listed server, where a PBX
// host's crash cannot take it, and made there again when it is replaced.
func TestWatchLivesOnTheLeaderServers(t *testing.T) {
	if testing.Short() {
		t.Skip("three-server cluster")
	}
	c := bustest.Cluster(t, "n1", "n2", "n3")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	b, err := bus.Connect(ctx, bus.Config{URL: c.URL(), Replicas: 3, LeaderServers: []string{"n2"}}, ident("arbiter", "a1"), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	if err := b.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	st, err := b.JS.Stream(ctx, bus.LiveStream)
	if err != nil {
		t.Fatal(err)
	}
	// pulled lists the consumers being pulled from (the watch's live one;
	// those it made and dropped are never pulled) and where they live.
	pulled := func() map[string]string {
		out := map[string]string{}
		for ci := range st.ListConsumers(ctx).Info() {
			if ci.Cluster != nil && ci.NumWaiting > 0 {
				out[ci.Name] = ci.Cluster.Leader
			}
		}
		return out
	}
	wctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- b.Watch(wctx, bus.WatchOptions{Subjects: []string{events.AllHeartbeats("lab")}}, func(events.Envelope, events.Decoded, uint64) {})
	}()
	defer func() { stop(); <-done }()
	settle := func(t *testing.T, skip string) string {
		t.Helper()
		var hs map[string]string
		waittest.Succeeds(t, 30*time.Second, "one consumer pulled from on the live stream", func() error {
			hs = pulled()
			delete(hs, skip)
			if len(hs) != 1 {
				return fmt.Errorf("pulled from: %v", hs)
			}
			return nil
		})
		for name, host := range hs {
			if host != "n2" {
				t.Fatalf("the watch's consumer %s lives on %s, want n2 (bus.leader_servers)", name, host)
			}
			return name
		}
		return ""
	}
	first := settle(t, "")
	// Deleting it makes the watch make another, again on n2.
	if err := b.JS.DeleteConsumer(ctx, bus.LiveStream, first); err != nil {
		t.Fatal(err)
	}
	second := settle(t, first)
	if second == first {
		t.Fatalf("the consumer was not replaced")
	}
}
