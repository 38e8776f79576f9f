package bus_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/bus/bustest"
	"github.com/fanpbx/fan/pkg/platform/waittest"
)

// A connection that moved to bus.url's second server because its first
// was lost goes back to the first once that one is part of the cluster
// again, and says so; before, it stayed on the second for good. It looks
// every second after the move, not only every homeEvery: with homeEvery at
// a minute here, it is back well within it.
func TestConnectionReturnsToItsPreferredServer(t *testing.T) {
	if testing.Short() {
		t.Skip("three-server cluster")
	}
	defer bus.SetHomeEvery(bus.SetHomeEvery(time.Minute))
	c := bustest.Cluster(t, "n1", "n2", "n3")
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	b, logs := provisioned(ctx, t, c.URL("n1", "n2", "n3"), ident("prober", "n1"))
	first, second := c.URL("n1"), c.URL("n2")
	on := func(want string, within time.Duration) {
		t.Helper()
		waittest.Succeeds(t, within, "connected to "+want, func() error {
			if got := b.NC.ConnectedUrl(); got != want {
				return fmt.Errorf("connected to %q\n%s", got, logs.String())
			}
			return nil
		})
	}
	on(first, 5*time.Second)
	c.Stop("n1")
	on(second, 15*time.Second)
	// While n1 is down the probes fail and the connection stays put.
	looks := bus.HomeLooks(b)
	waittest.Until(t, 15*time.Second, "two looks at n1 while it is down", func() bool { return bus.HomeLooks(b) >= looks+2 })
	on(second, 0)
	c.Restart("n1")
	on(first, 30*time.Second)
	if !strings.Contains(logs.String(), "a preferred server answers again") {
		t.Errorf("the move back was not logged:\n%s", logs.String())
	}
	// The move went straight home: never to the third server, which in
	// the witness topology is the other PBX host's (a move soon after the
	// home server's restart once went there, the home server having
	// failed a moment before and the second being left).
	if third := "server=" + c.URL("n3"); strings.Contains(logs.String(), third) {
		t.Errorf("the connection went to n3 on its way home:\n%s", logs.String())
	}
	// And it works there: a write through the state bucket.
	kv, err := b.WaitStateKV(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "test.home", []byte("back")); err != nil {
		t.Fatalf("put after the move back: %v", err)
	}
}
