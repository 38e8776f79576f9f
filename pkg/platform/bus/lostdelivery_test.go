package bus_test

import (
	"context"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/bus/bustest"
	"github.com/fanpbx/fan/pkg/platform/config"
)

// cutProxy stands for a link that is cut and comes back: while cut nothing
// crosses either way, and what was sent meanwhile arrives after the heal
// (as TCP retransmits it); a connection opened while cut is carried once
// healed.
type cutProxy struct {
	ln      net.Listener
	backend string
	mu      sync.Mutex
	healed  *sync.Cond
	cut     bool
	conns   []net.Conn
}

func newCutProxy(t *testing.T, backend string) *cutProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{ln: ln, backend: backend}
	p.healed = sync.NewCond(&p.mu)
	t.Cleanup(p.close)
	go p.serve()
	return p
}

func (p *cutProxy) url() string { return "nats://" + p.ln.Addr().String() }

func (p *cutProxy) setCut(cut bool) {
	p.mu.Lock()
	p.cut = cut
	p.mu.Unlock()
	p.healed.Broadcast()
}

func (p *cutProxy) waitHealed() {
	p.mu.Lock()
	for p.cut {
		p.healed.Wait()
	}
	p.mu.Unlock()
}

func (p *cutProxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		go func() {
			p.waitHealed()
			b, err := net.Dial("tcp", p.backend)
			if err != nil {
				c.Close()
				return
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, b)
			p.mu.Unlock()
			go p.pipe(b, c)
			go p.pipe(c, b)
		}()
	}
}

func (p *cutProxy) pipe(dst, src net.Conn) {
	defer dst.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.waitHealed()
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *cutProxy) close() {
	p.ln.Close()
	p.setCut(false)
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
}

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
	proxy := newCutProxy(t, strings.TrimPrefix(s.ClientURL(), "nats://"))
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
	time.Sleep(6 * ping)
	proxy.setCut(false)
	for exec.NC.Stats().Reconnects == disconnected || !exec.NC.IsConnected() {
		select {
		case <-ctx.Done():
			t.Fatal("the executor did not reconnect after the heal")
		case <-time.After(10 * time.Millisecond):
		}
	}
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
	select {
	case id := <-calls:
		t.Fatalf("command %s handed to the executor again while it worked on it", id)
	case <-time.After(3*bus.ExecutorAckWait + time.Second):
	}
}
