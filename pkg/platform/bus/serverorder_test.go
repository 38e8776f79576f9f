package bus

import (
	"net/url"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

func poolOf(hosts ...string) []nats.Server {
	out := make([]nats.Server, len(hosts))
	for i, h := range hosts {
		out[i] = nats.Server{URL: &url.URL{Scheme: "nats", Host: h}}
	}
	return out
}

// TestServerOrderPick: a reconnect dials bus.url's servers in its order,
// whatever order nats.go's pool holds them in, passes over one that just
// failed (a dial that failed, or the connection just lost), and falls back
// to the least recently failed (after the wait) when all did.
func TestServerOrderPick(t *testing.T) {
	now := time.Unix(1000, 0)
	o := newServerOrder("nats://own:4222, witness ,nats://other:4222", 250*time.Millisecond)
	o.now = func() time.Time { return now }
	pool := poolOf("other:4222", "advertised:4222", "witness:4222", "own:4222")
	step := func(want string, wantDelay time.Duration) {
		t.Helper()
		s, d := o.pick(pool, nats.ServerInfo{})
		if s == nil || s.URL.Host != want || d != wantDelay {
			got := "<nil>"
			if s != nil {
				got = s.URL.Host
			}
			t.Fatalf("picked %s after %v, want %s after %v", got, d, want, wantDelay)
		}
		now = now.Add(100 * time.Millisecond)
	}
	step("own:4222", 0)
	step("witness:4222", 0) // own's dial failed
	o.connected("nats://witness:4222")
	// The witness's connection is lost: own failed a moment ago, and the
	// witness, silent perhaps, is not dialled again first.
	step("other:4222", 0)
	step("advertised:4222", 0)             // learnt from the cluster: after every configured one
	step("own:4222", 250*time.Millisecond) // all failed: the least recent, after the wait
	o.connected("nats://own:4222")
	now = now.Add(serverFailedFor)
	// Own's connection is lost; the others' failures have aged out.
	step("witness:4222", 0)
	o.connected("nats://witness:4222")
	now = now.Add(serverFailedFor)
	step("own:4222", 0)
}

// TestServerOrderSingleServer: one server, or none parsed, changes
// nothing nats.go would do.
func TestServerOrderSingleServer(t *testing.T) {
	o := newServerOrder("127.0.0.1:4222", 250*time.Millisecond)
	pool := poolOf("127.0.0.1:4222")
	for range 3 {
		if s, _ := o.pick(pool, nats.ServerInfo{}); s == nil || s.URL.Host != "127.0.0.1:4222" {
			t.Fatalf("picked %v", s)
		}
	}
	if got := serverHost("tls://user:pw@h.example:7422"); got != "h.example:7422" {
		t.Fatalf("serverHost = %q", got)
	}
}

// TestServerOrderMove: a move home (home's probe saw the server answer)
// dials that server although it failed a moment ago, and does not count the
// server left behind as failed, so a move whose dial fails returns there
// rather than to the other PBX host's server. Before, such a move within
// serverFailedFor of the home server's failure passed over both and went
// to the third.
func TestServerOrderMove(t *testing.T) {
	now := time.Unix(1000, 0)
	o := newServerOrder("nats://own:4222,nats://witness:4222,nats://other:4222", 250*time.Millisecond)
	o.now = func() time.Time { return now }
	pool := poolOf("own:4222", "witness:4222", "other:4222")
	pick := func() string {
		t.Helper()
		s, d := o.pick(pool, nats.ServerInfo{})
		if s == nil || d != 0 {
			t.Fatalf("picked %v after %v", s, d)
		}
		now = now.Add(100 * time.Millisecond)
		return s.URL.Host
	}
	o.connected("nats://own:4222")
	if got := pick(); got != "witness:4222" { // own's connection lost
		t.Fatalf("after losing own: %s", got)
	}
	o.connected("nats://witness:4222")
	now = now.Add(2 * time.Second) // own is back, well within serverFailedFor

	o.move("own:4222")
	if got := pick(); got != "own:4222" {
		t.Fatalf("the move home dialled %s", got)
	}
	// Own's dial fails after all: back to the witness, not the other host.
	if got := pick(); got != "witness:4222" {
		t.Fatalf("after the move's dial failed: %s, want the witness it left", got)
	}
	o.connected("nats://witness:4222")

	// A move that never started leaves the order as it was.
	cancel := o.move("own:4222")
	cancel()
	if got := pick(); got != "own:4222" { // own's failure mark was cleared by the probe's answer
		t.Fatalf("after a cancelled move and a lost connection: %s", got)
	}
	if o.failed["witness:4222"] != now.Add(-100*time.Millisecond) {
		t.Fatalf("a connection lost for real was not counted as failed: %v", o.failed)
	}
}
