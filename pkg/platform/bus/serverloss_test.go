package bus_test

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/bus/bustest"
)

// TestWatchSurvivesTheLossOfItsServer stops the server that holds a
// Watch's ordered consumer while events keep coming: the watch resumes on
// another server with every event exactly once, in order.
func TestWatchSurvivesTheLossOfItsServer(t *testing.T) {
	if testing.Short() {
		t.Skip("three-server cluster")
	}
	c := bustest.Cluster(t, "n1", "n2", "n3")
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	connect := func(svc, node string) *bus.Bus {
		b, err := bus.Connect(ctx, bus.Config{URL: c.URL(), Replicas: 3}, ident(svc, node), slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(b.Close)
		if err := b.Provision(ctx); err != nil {
			t.Fatal(err)
		}
		return b
	}
	pub, watcher := connect("prober", "n1"), connect("arbiter", "a1")

	type got struct {
		seq uint64
		at  time.Time
	}
	delivered := make(chan got, 1024)
	wctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- watcher.Watch(wctx, bus.WatchOptions{Subjects: []string{events.AllHeartbeats("lab")}, All: true},
			func(_ events.Envelope, p events.Payload, _ uint64) {
				if hb, ok := p.(*events.NodeHeartbeat); ok {
					delivered <- got{hb.Seq, time.Now()}
				}
			})
	}()
	defer func() { stop(); <-done }()

	// emit publishes heartbeat seq, retrying the same envelope (stored once)
	// while the cluster elects.
	emit := func(seq uint64) {
		p := &events.NodeHeartbeat{Node: "n1", Seq: seq, IntervalMS: 1000, Version: "test"}
		env, err := events.New(pub.Source(), "lab", p)
		if err != nil {
			t.Fatal(err)
		}
		for err := pub.Publish(ctx, env, p); err != nil; err = pub.Publish(ctx, env, p) {
			if ctx.Err() != nil {
				t.Errorf("publish never succeeded: %v", err)
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
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
				t.Fatalf("heartbeat %d never delivered", next)
			}
		}
		return last
	}
	for i := uint64(1); i <= 10; i++ {
		emit(i)
	}
	expect(10)

	// The ordered consumer lives on one server (replicas 1).
	st, err := watcher.JS.Stream(ctx, bus.EventsStream)
	if err != nil {
		t.Fatal(err)
	}
	host := ""
	for ci := range st.ListConsumers(ctx).Info() {
		host = ci.Cluster.Leader
	}
	if host == "" {
		t.Fatal("no consumer found on the audit stream")
	}
	c.Stop(host)
	stopped := time.Now()
	go func() {
		for i := uint64(11); i <= 40; i++ {
			emit(i)
			time.Sleep(20 * time.Millisecond)
		}
	}()
	first := expect(11)
	expect(40)
	fmt.Printf("watch: delivery resumed %v after its server (%s) stopped; 40 of 40 heartbeats, none twice\n",
		first.Sub(stopped).Round(10*time.Millisecond), host)
	select {
	case g := <-delivered:
		t.Fatalf("extra delivery of heartbeat %d", g.seq)
	default:
	}
}
