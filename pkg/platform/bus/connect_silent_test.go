package bus_test

import (
	"context"
	"fmt"
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
	"github.com/fanpbx/fan/pkg/platform/waittest"
	"github.com/nats-io/nats.go"
)

// linkProxy stands for the link to a NATS server. Cut, nothing crosses
// either way, not even a close, and no reset or EOF tells anyone: a frozen
// process, a host cut off behind a switch. Healed, what was sent meanwhile
// arrives (as TCP retransmits it), and a connection opened while cut is
// carried.
type linkProxy struct {
	ln      net.Listener
	backend string
	// dialledWhileCut counts connections accepted while cut.
	dialledWhileCut atomic.Int32

	mu     sync.Mutex
	healed *sync.Cond
	cut    bool
	closed bool
	conns  []net.Conn
}

func newLinkProxy(t *testing.T, backend string) *linkProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &linkProxy{ln: ln, backend: backend}
	p.healed = sync.NewCond(&p.mu)
	t.Cleanup(p.close)
	go p.serve()
	return p
}

func (p *linkProxy) url() string { return "nats://" + p.ln.Addr().String() }

func (p *linkProxy) setCut(cut bool) {
	p.mu.Lock()
	p.cut = cut
	p.mu.Unlock()
	p.healed.Broadcast()
}

// waitHealed blocks while the link is cut; false once the proxy is closed.
func (p *linkProxy) waitHealed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for p.cut && !p.closed {
		p.healed.Wait()
	}
	return !p.closed
}

func (p *linkProxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		p.conns = append(p.conns, c)
		if p.cut {
			p.dialledWhileCut.Add(1)
		}
		p.mu.Unlock()
		go func() {
			if !p.waitHealed() {
				return
			}
			b, err := net.Dial("tcp", p.backend)
			if err != nil {
				c.Close()
				return
			}
			p.mu.Lock()
			p.conns = append(p.conns, b)
			p.mu.Unlock()
			go p.pipe(b, c)
			go p.pipe(c, b)
		}()
	}
}

// pipe copies src to dst while the link is up; an end of src crosses as
// a close of dst, also only while up.
func (p *linkProxy) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if !p.waitHealed() {
			return
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				dst.Close()
				return
			}
		}
		if err != nil {
			dst.Close()
			return
		}
	}
}

func (p *linkProxy) close() {
	p.ln.Close()
	p.mu.Lock()
	p.closed = true
	for _, c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.healed.Broadcast()
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
			proxy := newLinkProxy(t, strings.TrimPrefix(first.ClientURL(), "nats://"))
			cfg := bus.Config{URL: proxy.url() + "," + second.ClientURL(), PingInterval: config.Duration(ping), ConnectOnce: true}
			nc, closeConn, err := connect(cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer closeConn()
			waittest.Until(t, 5*time.Second, "connected to the first listed "+proxy.url(), func() bool { return nc.ConnectedUrl() == proxy.url() })
			proxy.setCut(true)
			frozenAt := time.Now()
			// Two unanswered pings, then the next server: well under 5 s.
			waittest.Until(t, 5*time.Second, fmt.Sprintf("on the next server after the first went silent (ping interval %v)", ping), func() bool {
				return nc.ConnectedUrl() == second.ClientURL()
			})
			t.Logf("left the silent server after %v", time.Since(frozenAt).Round(time.Millisecond))
			if n := proxy.dialledWhileCut.Load(); n != 0 {
				t.Errorf("dialled the silent server %d times before the next one", n)
			}
		})
	}
}
