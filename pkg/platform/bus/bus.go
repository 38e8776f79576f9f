// Package bus connects a fan service to NATS JetStream (an external cluster,
// or the real nats-server embedded in-process for labs and tests), provisions
// the streams and buckets fan needs without ever fighting another instance,
// and publishes and consumes fan's events and commands.
package bus

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/config"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
	"github.com/prometheus/client_golang/prometheus"
)

// Config says how to reach the bus. Exactly one of URL or Embedded is set.
type Config struct {
	// URL lists servers, comma separated: nats://n1:4222,nats://n2:4222,
	// in order of preference: a connection goes to the first that answers
	// and, when lost, to the first that has not just failed (on a PBX
	// host: this host's server, then the witness's, then the other's).
	URL string `yaml:"url"`
	// Creds is a JWT credentials file (operator mode); NKeySeed a seed file.
	Creds    string    `yaml:"creds"`
	NKeySeed string    `yaml:"nkey_seed"`
	TLS      TLSConfig `yaml:"tls"`
	// Embedded runs the real nats-server inside this process (labs, tests).
	Embedded *Embedded `yaml:"embedded"`
	// EventsMaxAge bounds how long the audit stream keeps events.
	EventsMaxAge config.Duration `yaml:"events_max_age"`
	// Limits is the disk each stream and bucket may take on every NATS
	// server that holds a replica (oldest discarded first), and how long
	// the live stream keeps live state.
	Limits Limits `yaml:"limits"`
	// Replicas of every stream and bucket: 1 in a lab, 3 on a production cluster.
	Replicas int `yaml:"replicas"`
	// LeaderServers (read by the arbiter only) names, most preferred first,
	// the NATS servers that may lead fan's raft groups; empty leaves leaders
	// wherever the cluster elects them.
	LeaderServers []string `yaml:"leader_servers"`
	// System (arbiter only) reaches the system account, which the meta
	// group's step-down needs; without it the meta leader is left alone.
	System *SystemAccount `yaml:"system"`
	// PingInterval bounds how long a dead server connection goes unnoticed
	// (twice this, as two pings may be outstanding).
	PingInterval config.Duration `yaml:"ping_interval"`
	// InsecureLab lets this client speak to a server that is not on
	// loopback without TLS or without an identity. Only for a throwaway lab:
	// anyone on the path can then read and forge every event and command.
	InsecureLab bool `yaml:"insecure_lab"`
	// ConnectOnce (a command-line tool's, never in a file) returns the first
	// connect error instead of retrying until the context ends: an operator
	// whose server refuses the port learns it at once, not after --timeout.
	ConnectOnce bool `yaml:"-"`
}

// HasIdentity says whether the client presents an identity of its own (an
// nkey, a creds file or a client certificate): a bus that asks for one
// gives each its permissions, and only the admin's may create streams.
func (c Config) HasIdentity() bool {
	return c.NKeySeed != "" || c.Creds != "" || c.TLS.Cert != ""
}

// TLSConfig enables TLS (and mutual TLS when Cert and Key are set).
type TLSConfig struct {
	CA   string `yaml:"ca"`
	Cert string `yaml:"cert"`
	Key  string `yaml:"key"`
}

// Embedded configures an in-process nats-server with JetStream: alone, or
// as one member of a cluster (Cluster.Name set), which is how fan-nats runs
// the three servers of a production bus.
type Embedded struct {
	StoreDir string `yaml:"store_dir"`
	// Listen, when set (host:port), also serves other processes; empty
	// means in-process connections only.
	Listen string `yaml:"listen"`
	// ServerName must be unique in a cluster: raft groups and leader
	// placement (bus.leader_servers) name servers by it.
	ServerName string `yaml:"server_name"`
	// Tags label the server for JetStream placement (for example
	// "host:witness"); JetStream ignores them without a placement request.
	Tags    []string        `yaml:"tags"`
	Cluster EmbeddedCluster `yaml:"cluster"`
	// ServerConfig is a nats-server configuration file (its authorization,
	// accounts and tls blocks, as `fanctl nats-config` writes them) applied
	// first; the keys above win where both are set.
	ServerConfig string `yaml:"server_config"`
	// InsecureLab lets a client or route listener be on an address other
	// than loopback with no authentication or no TLS. Only for a throwaway
	// lab: anyone who reaches the port runs the cluster.
	InsecureLab bool `yaml:"insecure_lab"`
	// LogNotices logs the server's notices (routes made and lost, raft
	// leaders elected) at info instead of debug. A server of its own
	// (fan-nats) sets it: those lines are how an operator reconstructs what
	// the cluster did during an outage.
	LogNotices bool `yaml:"log_notices"`
}

// EmbeddedCluster joins the embedded server to a NATS cluster. The zero
// value means a standalone server.
type EmbeddedCluster struct {
	// Name is the cluster's name, the same on every member.
	Name string `yaml:"name"`
	// Listen is the route address (host:port) the other members dial.
	Listen string `yaml:"listen"`
	// Routes are the other members' route addresses (host:port or
	// nats-route://host:port); listing this server's own is harmless.
	Routes []string `yaml:"routes"`
}

// Validate checks an embedded server's settings, reporting every one that
// is wrong; key names are relative to prefix (bus.embedded in a service,
// the config file's top in fan-nats).
func (e *Embedded) Validate(prefix string) error {
	key := prefixed(prefix)
	var errs []error
	if e.StoreDir == "" {
		errs = append(errs, config.Errf(key("store_dir"), "required"))
	}
	if e.Listen != "" {
		errs = append(errs, config.HostPort(key("listen"), e.Listen, true))
	}
	errs = append(errs, config.CountIn(key("cluster.routes"), len(e.Cluster.Routes), 0, MaxServers))
	c := e.Cluster
	if c.Name == "" {
		if c.Listen != "" || len(c.Routes) > 0 {
			errs = append(errs, config.Errf(key("cluster.name"), "required with cluster.listen or cluster.routes"))
		}
		return config.Join(errs...)
	}
	if c.Listen == "" {
		errs = append(errs, config.Errf(key("cluster.listen"), "required in a cluster"))
	} else {
		errs = append(errs, config.HostPort(key("cluster.listen"), c.Listen, true))
	}
	if e.ServerName == "" {
		errs = append(errs, config.Errf(key("server_name"), "required in a cluster (unique per server)"))
	}
	for i, r := range c.Routes {
		if _, err := routeURL(r); err != nil {
			errs = append(errs, config.Errf(fmt.Sprintf("%s[%d]", key("cluster.routes"), i), "%v", err))
		}
	}
	return config.Join(errs...)
}

// prefixed names keys below prefix.
func prefixed(prefix string) func(string) string {
	return func(k string) string {
		if prefix == "" {
			return k
		}
		return prefix + "." + k
	}
}

// routeURL accepts host:port or a nats-route:// URL.
func routeURL(r string) (*url.URL, error) {
	if !strings.Contains(r, "://") {
		r = "nats-route://" + r
	}
	u, err := url.Parse(r)
	if err != nil {
		return nil, err
	}
	if u.Host == "" || u.Port() == "" {
		return nil, fmt.Errorf("route %q: want host:port", r)
	}
	if n, err := strconv.ParseUint(u.Port(), 10, 16); err != nil || n == 0 {
		return nil, fmt.Errorf("route %q: port must be 1..65535", r)
	}
	return u, nil
}

// Defaults fills unset fields.
func (c *Config) Defaults() {
	if c.EventsMaxAge == 0 {
		c.EventsMaxAge = config.Duration(90 * 24 * time.Hour)
	}
	c.Limits.defaults()
	if c.Replicas == 0 {
		c.Replicas = 1
	}
	if c.PingInterval == 0 {
		c.PingInterval = config.Duration(2 * time.Second)
	}
}

// Validate checks the config, reporting every key that is wrong; key names
// are relative to the bus section.
func (c *Config) Validate() error {
	var errs []error
	if (c.URL == "") == (c.Embedded == nil) {
		errs = append(errs, config.Errf("bus", "set exactly one of bus.url or bus.embedded"))
	}
	if c.Embedded != nil {
		errs = append(errs, c.Embedded.Validate("bus.embedded"))
	}
	if c.Creds != "" && c.NKeySeed != "" {
		errs = append(errs, config.Errf("bus.creds", "set bus.creds or bus.nkey_seed, not both"))
	}
	if (c.TLS.Cert == "") != (c.TLS.Key == "") {
		errs = append(errs, config.Errf("bus.tls", "cert and key go together"))
	}
	errs = append(errs, c.validateLeaders())
	if c.Replicas < 0 || c.Replicas > 5 {
		errs = append(errs, config.Errf("bus.replicas", "must be 1..5, got %d", c.Replicas))
	}
	errs = append(errs, c.validateBounds(), c.Limits.validate())
	// The URLs must parse before their hosts can be judged.
	if urlsErr := c.validateURLs(); urlsErr != nil {
		errs = append(errs, urlsErr)
	} else {
		errs = append(errs, c.checkSecure())
	}
	return config.Join(errs...)
}

// Bounds of the bus keys (README "bus" table). A negative max age made
// provisioning retry forever; a ping interval below 100 ms turns a busy
// link into a disconnect storm, above 1m a dead server goes unnoticed.
const (
	MinEventsMaxAge = time.Hour
	MaxEventsMaxAge = 10 * 365 * 24 * time.Hour
	MinPingInterval = 100 * time.Millisecond
	MaxPingInterval = time.Minute
	// MaxServers bounds bus.url's list and bus.embedded.cluster.routes.
	MaxServers = 16
)

func (c *Config) validateBounds() error {
	urls := strings.Split(c.URL, ",")
	if c.URL == "" {
		urls = nil
	}
	return config.Join(
		config.DurationOrZero("bus.events_max_age", c.EventsMaxAge.D(), MinEventsMaxAge, MaxEventsMaxAge),
		config.DurationOrZero("bus.ping_interval", c.PingInterval.D(), MinPingInterval, MaxPingInterval),
		config.CountIn("bus.url", len(urls), 0, MaxServers),
		config.CountIn("bus.leader_servers", len(c.LeaderServers), 0, MaxServers),
	)
}

// validateURLs checks each server of bus.url.
func (c *Config) validateURLs() error {
	if c.URL == "" {
		return nil
	}
	var errs []error
	for i, u := range strings.Split(c.URL, ",") {
		if _, err := serverURL(strings.TrimSpace(u)); err != nil {
			errs = append(errs, config.Errf(fmt.Sprintf("bus.url[%d]", i), "%v", err))
		}
	}
	return config.Join(errs...)
}

// serverURL accepts what nats.go dials: host:port or scheme://host[:port].
func serverURL(r string) (*url.URL, error) {
	if !strings.Contains(r, "://") {
		r = "nats://" + r
	}
	u, err := url.Parse(r)
	if err != nil {
		return nil, err
	}
	if u.Hostname() == "" {
		return nil, fmt.Errorf("server %q: no host", redact(r))
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.ParseUint(p, 10, 16); err != nil || n == 0 {
			return nil, fmt.Errorf("server %q: port must be 1..65535", redact(r))
		}
	}
	return u, nil
}

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
	srv *server.Server
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

// Connect dials the bus (starting the embedded server first if configured).
// It keeps retrying while ctx lives: a service that starts before NATS waits
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
	if cfg.Embedded != nil {
		srv, err := StartEmbedded(*cfg.Embedded, log)
		if err != nil {
			return nil, err
		}
		b.srv = srv
		opts = append(opts, nats.InProcessServer(srv))
		url = ""
	}

	var nc *nats.Conn
	backoff := 100 * time.Millisecond
	for {
		var err error
		nc, err = nats.Connect(url, opts...)
		if err == nil {
			break
		}
		if cfg.ConnectOnce {
			b.shutdownServer()
			return nil, fmt.Errorf("bus connect %s: %w", redact(url), err)
		}
		log.Warn("bus connect failed, retrying", "url", redact(url), "err", err, "retry_in", backoff)
		select {
		case <-ctx.Done():
			b.shutdownServer()
			return nil, fmt.Errorf("bus connect %s: %w (last error: %v)", redact(url), ctx.Err(), err)
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 2*time.Second)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		b.shutdownServer()
		return nil, fmt.Errorf("bus jetstream: %w", err)
	}
	b.NC, b.JS = nc, js
	if cfg.Embedded == nil && len(order.prefer) > 1 {
		b.homeStop, b.homeDone = make(chan struct{}), make(chan struct{})
		go func() {
			defer close(b.homeDone)
			b.home(order, auth, b.homeStop)
		}()
	}
	return b, nil
}

func redact(url string) string {
	if url == "" {
		return "in-process"
	}
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

// Close drains the connection (delivering what was already published) and
// stops the embedded server, if any.
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
	b.shutdownServer()
}

func (b *Bus) shutdownServer() {
	if b.srv != nil {
		b.srv.Shutdown()
		b.srv.WaitForShutdown()
		b.srv = nil
	}
}

// routePingInterval is how often a cluster member pings each route; two
// unanswered pings close it.
const routePingInterval = 2 * time.Second

// StartEmbedded starts the real nats-server with JetStream in this process.
func StartEmbedded(e Embedded, log *slog.Logger) (*server.Server, error) {
	if err := os.MkdirAll(e.StoreDir, 0o750); err != nil {
		return nil, fmt.Errorf("embedded nats store %s: %w", e.StoreDir, err)
	}
	opts, err := serverOptions(e)
	if err != nil {
		return nil, err
	}
	if err := checkListeners(opts, e.InsecureLab); err != nil {
		return nil, fmt.Errorf("embedded nats: %w", err)
	}
	srv, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("embedded nats: %w", err)
	}
	notice := slog.LevelDebug
	if e.LogNotices {
		notice = slog.LevelInfo
	}
	srv.SetLoggerV2(serverLogger{l: log.With("component", "nats-server"), notice: notice}, false, false, false)
	go srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		srv.Shutdown()
		return nil, errors.New("embedded nats: not ready after 10s")
	}
	return srv, nil
}

// serverOptions are the nats-server options e asks for: its server
// configuration file, then its own keys over it.
func serverOptions(e Embedded) (*server.Options, error) {
	// The server config file, if any, is read into empty options (it may
	// set what Embedded sets, which the parser would call a duplicate);
	// the keys of Embedded then win over it.
	opts := &server.Options{}
	if e.ServerConfig != "" {
		if err := opts.ProcessConfigFile(e.ServerConfig); err != nil {
			return nil, fmt.Errorf("embedded nats server config %s: %w", e.ServerConfig, err)
		}
	}
	if e.ServerName != "" {
		opts.ServerName = e.ServerName
	}
	opts.JetStream, opts.StoreDir, opts.NoSigs = true, e.StoreDir, true
	opts.DontListen = e.Listen == ""
	if opts.JetStreamMaxMemory == 0 {
		opts.JetStreamMaxMemory = 64 << 20
	}
	if opts.JetStreamMaxStore == 0 {
		opts.JetStreamMaxStore = 1 << 30
	}
	if opts.ServerName == "" {
		opts.ServerName = "fan-embedded"
	}
	if e.Listen != "" {
		host, port, err := splitHostPort(e.Listen)
		if err != nil {
			return nil, fmt.Errorf("embedded nats listen %q: %w", e.Listen, err)
		}
		opts.Host, opts.Port = host, port
	}
	opts.Tags = append(opts.Tags, e.Tags...)
	if c := e.Cluster; c.Name != "" {
		if err := e.Validate(""); err != nil {
			return nil, fmt.Errorf("embedded nats: %w", err)
		}
		host, port, err := splitHostPort(c.Listen)
		if err != nil {
			return nil, fmt.Errorf("embedded nats cluster listen %q: %w", c.Listen, err)
		}
		opts.Cluster.Name, opts.Cluster.Host, opts.Cluster.Port = c.Name, host, port
		for _, r := range c.Routes {
			u, err := routeURL(r)
			if err != nil {
				return nil, fmt.Errorf("embedded nats: %w", err)
			}
			opts.Routes = append(opts.Routes, u)
		}
	}
	// A dead member's route is noticed by its pings going unanswered; the
	// 2 min default would keep a cut-off server looking routed. A server
	// configuration file that sets its own timing keeps it.
	if opts.Cluster.Port != 0 && opts.Cluster.PingInterval == 0 {
		opts.Cluster.PingInterval, opts.Cluster.MaxPingsOut = routePingInterval, 2
	}
	return opts, nil
}

// serverLogger adapts nats-server's logger to slog. Fatalf must not exit the
// process: the embedding service decides how to stop.
type serverLogger struct {
	l      *slog.Logger
	notice slog.Level
}

func (s serverLogger) Noticef(f string, v ...any) {
	s.l.Log(context.Background(), s.notice, fmt.Sprintf(f, v...))
}
func (s serverLogger) Warnf(f string, v ...any)  { s.l.Warn(fmt.Sprintf(f, v...)) }
func (s serverLogger) Fatalf(f string, v ...any) { s.l.Error(fmt.Sprintf(f, v...)) }
func (s serverLogger) Errorf(f string, v ...any) { s.l.Error(fmt.Sprintf(f, v...)) }
func (s serverLogger) Debugf(f string, v ...any) {}
func (s serverLogger) Tracef(f string, v ...any) {}

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
