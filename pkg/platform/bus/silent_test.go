package bus_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/bus/bustest"
	"github.com/fanpbx/fan/pkg/platform/config"
	"github.com/nats-io/nats.go"
)

// silentProxy stands for a NATS server that goes silent without closing
// anything (a frozen process, a host cut off behind a switch): once frozen
// it forwards nothing either way and accepts new connections into silence,
// so no reset or EOF ever tells a client.
type silentProxy struct {
	ln      net.Listener
	backend string
	frozen  atomic.Bool
	// dialledWhileFrozen counts connections accepted into silence.
	dialledWhileFrozen atomic.Int32
	mu                 sync.Mutex
	conns              []net.Conn
}

func newSilentProxy(t *testing.T, backend string) *silentProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &silentProxy{ln: ln, backend: backend}
	t.Cleanup(p.close)
	go p.serve()
	return p
}

func (p *silentProxy) url() string { return "nats://" + p.ln.Addr().String() }

func (p *silentProxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		p.conns = append(p.conns, c)
		p.mu.Unlock()
		if p.frozen.Load() {
			p.dialledWhileFrozen.Add(1)
			continue // held open, never answered
		}
		b, err := net.Dial("tcp", p.backend)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, b)
		p.mu.Unlock()
		go p.pipe(b, c)
		go p.pipe(c, b)
	}
}

// pipe copies until frozen, then stops reading: what the peer sends stays
// unread, and nothing more arrives at the other side.
func (p *silentProxy) pipe(dst io.Writer, src io.Reader) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if err != nil || p.frozen.Load() {
			return
		}
		if _, err := dst.Write(buf[:n]); err != nil {
			return
		}
	}
}

func (p *silentProxy) close() {
	p.ln.Close()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
}

// TestEveryConnectionLeavesASilentServer: a service's own connection and
// the arbiter's system-account connection each notice a server that went
// silent within a few ping intervals and move to the next listed server
// without dialling the silent one again (a dial into silence costs the
// whole connect timeout). With nats.go's defaults (a ping every two
// minutes) the system connection stayed on a frozen server for minutes.
func TestEveryConnectionLeavesASilentServer(t *testing.T) {
	const ping = 200 * time.Millisecond
	log := slog.New(slog.DiscardHandler)
	connectors := map[string]func(cfg bus.Config) (*nats.Conn, func(), error){
		"service": func(cfg bus.Config) (*nats.Conn, func(), error) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			b, err := bus.Connect(ctx, cfg, ident("arbiter", "w"), log)
			if err != nil {
				return nil, nil, err
			}
			return b.NC, b.Close, nil
		},
		"system account": func(cfg bus.Config) (*nats.Conn, func(), error) {
			// These servers have no accounts: any user is let in.
			cfg.System = &bus.SystemAccount{User: "sys", Password: "sys"}
			nc, err := bus.ConnectSystem(cfg, "fan-arbiter-w-system", log)
			if err != nil {
				return nil, nil, err
			}
			return nc, nc.Close, nil
		},
	}
	for name, connect := range connectors {
		t.Run(name, func(t *testing.T) {
			first, second := bustest.Server(t), bustest.Server(t)
			proxy := newSilentProxy(t, strings.TrimPrefix(first.ClientURL(), "nats://"))
			cfg := bus.Config{URL: proxy.url() + "," + second.ClientURL(), PingInterval: config.Duration(ping), ConnectOnce: true}
			nc, closeConn, err := connect(cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer closeConn()
			deadline := time.Now().Add(5 * time.Second)
			for nc.ConnectedUrl() != proxy.url() {
				if time.Now().After(deadline) {
					t.Fatalf("connected to %q, want the first listed %s", nc.ConnectedUrl(), proxy.url())
				}
				time.Sleep(10 * time.Millisecond)
			}
			proxy.frozen.Store(true)
			frozenAt := time.Now()
			// Two unanswered pings, then the next server: well under 5 s.
			for nc.ConnectedUrl() != second.ClientURL() {
				if time.Since(frozenAt) > 5*time.Second {
					t.Fatalf("still on %q 5s after its server went silent (ping interval %v)", nc.ConnectedUrl(), ping)
				}
				time.Sleep(10 * time.Millisecond)
			}
			t.Logf("left the silent server after %v", time.Since(frozenAt).Round(time.Millisecond))
			if n := proxy.dialledWhileFrozen.Load(); n != 0 {
				t.Errorf("dialled the silent server %d times before the next one", n)
			}
		})
	}
}
