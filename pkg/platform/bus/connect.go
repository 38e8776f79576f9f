package bus

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
	"github.com/prometheus/client_golang/prometheus"
)

// Identity names the service instance on the bus.
type Identity struct {
	Cluster string
	Service string
	Node    string
	Version string
}

// Bus is a live connection. NC and JS are exposed for the few services that
// need more than this package offers (the arbiter's lease).
type Bus struct {
	NC  *nats.Conn
	JS  jetstream.JetStream
	cfg Config
	id  Identity
	log *slog.Logger
	// refused counts messages its consumers dropped (fan_events_refused_total).
	refused *prometheus.CounterVec
	// refusals rations the refusal log lines.
	refusals refusalLog

	reconnectMu sync.Mutex
	reconnectID int
	reconnected map[int]func()

	// homeStop ends home (the way back to the preferred server); homeDone
	// is closed once it has.
	homeStop, homeDone chan struct{}
	// homeWake wakes home after each reconnect: a connection that moved
	// off its preferred server looks for it soon.
	homeWake chan struct{}
	// homeLooks counts home's looks at the servers preferred to the one
	// connected to: a test waits for some to have failed rather than for
	// a time it guesses they take.
	homeLooks atomic.Int64
}

// onReconnect calls f after every reconnect until the returned function is
// called. f runs on the connection's callback goroutine and must not block.
func (b *Bus) onReconnect(f func()) (remove func()) {
	b.reconnectMu.Lock()
	defer b.reconnectMu.Unlock()
	if b.reconnected == nil {
		b.reconnected = map[int]func(){}
	}
	b.reconnectID++
	id := b.reconnectID
	b.reconnected[id] = f
	return func() {
		b.reconnectMu.Lock()
		delete(b.reconnected, id)
		b.reconnectMu.Unlock()
	}
}

// reconnectWait is how long a connection waits before dialling again once
// every server has failed (plus jitter).
const reconnectWait = 250 * time.Millisecond

// liveness is how every connection fan opens (a service's own, the
// arbiter's to the system account) notices a server that went silent and
// gets back to one that answers. A connection without it keeps nats.go's
// defaults: a frozen or cut-off server, which sends no reset, goes unnoticed
// for up to six minutes.
func liveness(cfg Config) []nats.Option {
	return []nats.Option{
		nats.MaxReconnects(-1),
		nats.ReconnectWait(reconnectWait),
		nats.ReconnectJitter(100*time.Millisecond, time.Second),
		// No reconnect buffer: a command or event published while
		// disconnected must fail now, not be delivered late and stale
		// after the reconnect (the client would otherwise hold up to 8 MB
		// of them and send them all once it is back, whatever their age).
		nats.ReconnectBufSize(-1),
		nats.PingInterval(cfg.PingInterval.D()),
		nats.MaxPingsOutstanding(2),
	}
}

// tlsOptions are cfg's TLS settings as client options.
func tlsOptions(cfg Config) []nats.Option {
	var opts []nats.Option
	if cfg.TLS.CA != "" {
		opts = append(opts, nats.RootCAs(cfg.TLS.CA))
	}
	if cfg.TLS.Cert != "" {
		opts = append(opts, nats.ClientCert(cfg.TLS.Cert, cfg.TLS.Key))
	}
	return opts
}

// Connect dials the bus. It keeps retrying while ctx lives: a service that starts before NATS waits
// for it instead of exiting.
func Connect(ctx context.Context, cfg Config, id Identity, log *slog.Logger) (*Bus, error) {
	cfg.Defaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	b := &Bus{cfg: cfg, id: id, log: log, refused: newRefusedCounter(), homeWake: make(chan struct{}, 1)}
	// bus.url is an order of preference (serverOrder).
	order := newServerOrder(cfg.URL, reconnectWait)
	opts := append(order.options(), liveness(cfg)...)
	opts = append(opts,
		nats.Name("fan-"+id.Service+"-"+id.Node),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			log.Warn("bus disconnected", "err", err)
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			order.connected(nc.ConnectedUrl())
			log.Info("bus reconnected", "server", nc.ConnectedUrlRedacted())
			select {
			case b.homeWake <- struct{}{}:
			default:
			}
			b.reconnectMu.Lock()
			defer b.reconnectMu.Unlock()
			for _, f := range b.reconnected {
				f()
			}
		}),
		nats.ClosedHandler(func(*nats.Conn) { log.Info("bus connection closed") }),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			log.Warn("bus async error", "err", err)
		}),
	)
	// Who this connection is, also for home's probes of a preferred server.
	var auth []nats.Option
	if cfg.Creds != "" {
		auth = append(auth, nats.UserCredentials(cfg.Creds))
	}
	if cfg.NKeySeed != "" {
		o, err := nats.NkeyOptionFromSeed(cfg.NKeySeed)
		if err != nil {
			return nil, fmt.Errorf("bus nkey seed %s: %w", cfg.NKeySeed, err)
		}
		pub, err := seedPublicKey(cfg.NKeySeed)
		if err != nil {
			return nil, fmt.Errorf("bus nkey seed %s: %w", cfg.NKeySeed, err)
		}
		// Replies come to this identity's own inbox, the only one its
		// permissions let it read (events.InboxPrefix).
		auth = append(auth, o, nats.CustomInboxPrefix(events.InboxPrefix(pub)))
	}
	auth = append(auth, tlsOptions(cfg)...)
	opts = append(opts, auth...)

	url := cfg.URL
	var nc *nats.Conn
	backoff := 100 * time.Millisecond
	for {
		var err error
		nc, err = nats.Connect(url, opts...)
		if err == nil {
			break
		}
		if cfg.ConnectOnce {
			return nil, fmt.Errorf("bus connect %s: %w", redact(url), err)
		}
		log.Warn("bus connect failed, retrying", "url", redact(url), "err", err, "retry_in", backoff)
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("bus connect %s: %w (last error: %v)", redact(url), ctx.Err(), err)
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 2*time.Second)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("bus jetstream: %w", err)
	}
	b.NC, b.JS = nc, js
	if len(order.prefer) > 1 {
		b.homeStop, b.homeDone = make(chan struct{}), make(chan struct{})
		go func() {
			defer close(b.homeDone)
			b.home(order, auth, b.homeStop)
		}()
	}
	return b, nil
}

// redact hides the user and password a server URL may carry, so the URL
// can be logged.
func redact(url string) string {
	parts := strings.Split(url, ",")
	for i, p := range parts {
		if at := strings.LastIndex(p, "@"); at >= 0 {
			if s := strings.Index(p, "://"); s >= 0 && s < at {
				parts[i] = p[:s+3] + "***" + p[at:]
			}
		}
	}
	return strings.Join(parts, ",")
}

// Identity returns who this connection speaks for.
func (b *Bus) Identity() Identity { return b.id }

// Source is the events.Source this service stamps on what it publishes.
func (b *Bus) Source() events.Source { return events.Source{Service: b.id.Service, Node: b.id.Node} }

// Close drains the connection (delivering what was already published).
func (b *Bus) Close() {
	if b.homeStop != nil {
		close(b.homeStop)
		<-b.homeDone
		b.homeStop = nil
	}
	if b.NC != nil {
		done := make(chan struct{})
		b.NC.SetClosedHandler(func(*nats.Conn) { close(done) })
		if err := b.NC.Drain(); err != nil {
			b.NC.Close()
		} else {
			select {
			case <-done:
			case <-time.After(5 * time.Second):
				b.NC.Close()
			}
		}
	}
}

// seedPublicKey reads an nkey seed file and returns its public key.
func seedPublicKey(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	kp, err := nkeys.ParseDecoratedNKey(b)
	if err != nil {
		return "", err
	}
	defer kp.Wipe()
	return kp.PublicKey()
}
