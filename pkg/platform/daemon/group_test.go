package daemon_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"

	"github.com/fanpbx/fan/pkg/platform/daemon"
)

// TestGroupStopsInOrder: the actors are interrupted in the order they were
// added, each only after the previous one returned (a command consumer
// finishes the command in hand before the release runs), whether the
// service is asked to stop or an actor fails.
func TestGroupStopsInOrder(t *testing.T) {
	for _, tc := range []struct {
		name    string
		failing bool
	}{{"stop requested", false}, {"an actor failed", true}} {
		t.Run(tc.name, func(t *testing.T) {
			parent, cancel := context.WithCancel(context.Background())
			defer cancel()
			g, _ := daemon.NewGroup(parent)
			var (
				mu     sync.Mutex
				events []string
			)
			note := func(s string) { mu.Lock(); events = append(events, s); mu.Unlock() }
			for _, name := range []string{"commands", "loops", "release"} {
				stop := make(chan struct{})
				g.Add(name, func() error {
					<-stop
					note(name + " returned")
					return nil
				}, func(error) {
					note(name + " interrupted")
					close(stop)
				})
			}
			boom := errors.New("watch ended")
			if tc.failing {
				g.Go("watch", func(context.Context) error { return boom })
			} else {
				g.Go("watch", func(ctx context.Context) error { <-ctx.Done(); note("watch returned"); return nil })
				cancel()
			}
			err := g.Wait()
			if tc.failing != errors.Is(err, boom) || (!tc.failing && err != nil) {
				t.Fatalf("Wait = %v", err)
			}
			want := []string{"commands interrupted", "commands returned", "loops interrupted", "loops returned",
				"release interrupted", "release returned"}
			if !tc.failing {
				want = append(want, "watch returned")
			}
			if !slices.Equal(events, want) {
				t.Fatalf("stop order\n got %q\nwant %q", events, want)
			}
		})
	}
}

// An actor added after the group stopped is interrupted at once.
func TestGroupAddAfterStop(t *testing.T) {
	parent, cancel := context.WithCancel(context.Background())
	g, _ := daemon.NewGroup(parent)
	cancel()
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	returned := make(chan struct{})
	g.Go("late", func(ctx context.Context) error { <-ctx.Done(); close(returned); return nil })
	<-returned
}
