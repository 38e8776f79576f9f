package bus_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/bus/bustest"
	"github.com/fanpbx/fan/pkg/platform/waittest"
)

// TestReconnectFollowsURLOrder: with three servers, the client connects to
// bus.url's first and, when that one dies, to its second, never to the
// third while the second is up (nats.go alone shuffles them: half the
// time the other PBX host's server, which dies with that host). Eight
// rounds, each with fresh servers on random ports.
func TestReconnectFollowsURLOrder(t *testing.T) {
	for round := range 8 {
		own, witness, other := bustest.Server(t), bustest.Server(t), bustest.Server(t)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		urls := strings.Join([]string{own.ClientURL(), witness.ClientURL(), other.ClientURL()}, ",")
		b, err := bus.Connect(ctx, bus.Config{URL: urls, ConnectOnce: true}, ident("prober", "n2"), slog.New(slog.DiscardHandler))
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		if got := b.NC.ConnectedUrl(); got != own.ClientURL() {
			t.Fatalf("round %d: connected to %s, want the first listed %s", round, got, own.ClientURL())
		}
		own.Shutdown()
		// One read of the URL per look: it is "" while not connected, and
		// the client may notice the loss between two reads.
		var got string
		waittest.Until(t, 10*time.Second, fmt.Sprintf("round %d: reconnected", round), func() bool {
			got = b.NC.ConnectedUrl()
			return got != "" && got != own.ClientURL()
		})
		if got != witness.ClientURL() {
			t.Fatalf("round %d: reconnected to %s, want the second listed %s (the third is %s)", round, got, witness.ClientURL(), other.ClientURL())
		}
		b.Close()
		witness.Shutdown()
		other.Shutdown()
	}
}
