package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/config"
	"github.com/nats-io/nats.go/micro"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Common is the configuration section every fan service shares. Service
// configs embed it with `yaml:",inline"`.
type Common struct {
	Cluster string     `yaml:"cluster"`
	Node    string     `yaml:"node"`
	Bus     bus.Config `yaml:"bus"`
	// HTTPListen serves /metrics and /healthz (host:port); empty disables it.
	HTTPListen string `yaml:"http_listen"`
	// ShutdownTimeout bounds the clean-up after a stop signal.
	ShutdownTimeout config.Duration `yaml:"shutdown_timeout"`
}

// Bounds of shutdown_timeout.
const (
	MinShutdownTimeout = 100 * time.Millisecond
	MaxShutdownTimeout = 5 * time.Minute
)

// Validate checks the common keys, reporting every one that is wrong.
func (c *Common) Validate() error {
	var errs []error
	if err := events.ValidToken("cluster", c.Cluster); err != nil {
		errs = append(errs, &config.FieldError{Key: "cluster", Err: err})
	}
	if err := events.ValidToken("node", c.Node); err != nil {
		errs = append(errs, &config.FieldError{Key: "node", Err: err})
	}
	c.Bus.Defaults()
	errs = append(errs, c.Bus.Validate())
	if c.ShutdownTimeout == 0 {
		c.ShutdownTimeout = config.Duration(10 * time.Second)
	}
	// Half of it bounds the outbox drain: below 100ms nothing drains, and
	// systemd's own stop timeout (90 s by default) should stay the longer.
	errs = append(errs, config.DurationIn("shutdown_timeout", c.ShutdownTimeout.D(), MinShutdownTimeout, MaxShutdownTimeout))
	if c.HTTPListen != "" {
		errs = append(errs, config.HostPort("http_listen", c.HTTPListen, true))
	}
	return config.Join(errs...)
}

// CheckHost checks what the common keys name on this host (config.HostChecker,
// which every service's Config has through Common): the bus's credential and
// certificate files (CheckFiles) and the address http_listen listens on.
func (c *Common) CheckHost() error {
	errs := []error{c.CheckFiles()}
	if c.HTTPListen != "" {
		errs = append(errs, config.ListenLocal("http_listen", c.HTTPListen))
	}
	return config.Join(errs...)
}

// CheckFiles requires every credential and certificate the bus section
// names to be there and to be what its key says: an nkey seed a user's
// seed, a creds file a user's JWT and seed, certificates PEM and valid now
// (expiring within 30 days is a warning), the key the certificate's. So
// -check-config refuses a missing or broken one by its key instead of the
// service failing to connect after it started. It is not part of Validate:
// a configuration is also validated where its paths are not this host's
// (tests, fanctl replay).
func (c *Common) CheckFiles() error {
	b := c.Bus
	errs := []error{
		config.CredsFile("bus.creds", b.Creds),
		config.NKeySeedFile("bus.nkey_seed", b.NKeySeed),
		config.CAFile("bus.tls.ca", b.TLS.CA),
		config.KeyPairFiles("bus.tls.cert", b.TLS.Cert, "bus.tls.key", b.TLS.Key),
	}
	if b.System != nil {
		errs = append(errs,
			config.CredsFile("bus.system.creds", b.System.Creds),
			config.NKeySeedFile("bus.system.nkey_seed", b.System.NKeySeed))
	}
	return config.Join(errs...)
}

// ConditionOutboxFull is raised while the runtime's outbox is at its cap
// and drops its oldest waiting events.
const ConditionOutboxFull = "outbox_full"

// Runtime is what a running service shares with its components.
type Runtime struct {
	Bus *bus.Bus
	// Outbox publishes what must not be lost while a stream has no leader
	// (health transitions, decisions, command results): Post returns at once
	// and the event is retried until stored or superseded. Close drains it.
	Outbox  *bus.Outbox
	Log     *slog.Logger
	Metrics *prometheus.Registry
	// Conditions are raised by any part of the service that cannot do its
	// whole job; /healthz fails while one is raised.
	Conditions *Conditions
	// Certs exports the expiry of the certificates the service depends on:
	// the bus's CA and client certificate from the start; a service adds
	// its own (the arbiter's HTTP heartbeat certificate).
	Certs     *CertExpiry
	common    Common
	service   string
	version   string
	ready     atomic.Bool
	http      *http.Server
	sup       *supervisor
	micro     micro.Service
	started   time.Time
	announced time.Time
}

// Start connects to the bus, provisions fan's streams, serves /metrics and
// /healthz, registers with NATS service discovery, announces the service and
// tells systemd it is ready. Close undoes it in reverse.
func Start(ctx context.Context, c Common, service, version string, log *slog.Logger) (*Runtime, error) {
	rt := &Runtime{Log: log, common: c, service: service, version: version, Metrics: prometheus.NewRegistry(),
		sup: supervisorFrom(ctx, log), started: time.Now(), Conditions: NewConditions(log)}
	build := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "fan_build_info", Help: "Always 1; labels name the service, node and version.",
		ConstLabels: prometheus.Labels{"service": service, "node": c.Node, "cluster": c.Cluster, "version": version},
	})
	build.Set(1)
	rt.Certs = NewCertExpiry(BusCertFiles(c.Bus)...)
	rt.Metrics.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		build, rt.sup.reloads, rt.sup.pings, newLoopCollector(rt.sup), newConditionCollector(rt.Conditions), rt.Certs)
	rt.sup.send("STATUS=connecting to the bus")
	if c.HTTPListen != "" {
		if err := rt.serveHTTP(c.HTTPListen); err != nil {
			return nil, err
		}
	}
	b, err := bus.Connect(ctx, c.Bus, bus.Identity{Cluster: c.Cluster, Service: service, Node: c.Node, Version: version}, log)
	if err != nil {
		rt.stopHTTP()
		return nil, err
	}
	rt.Bus = b
	rt.Metrics.MustRegister(b.Refusals())
	// A service with an identity is on a bus with permissions, where only
	// the admin creates the streams: it waits for them. Without one (a lab,
	// a test's server) it creates what is missing.
	provision := b.Provision
	if c.Bus.HasIdentity() {
		provision = b.AwaitProvisioned
	}
	if err := provision(ctx); err != nil {
		b.Close()
		rt.stopHTTP()
		return nil, err
	}
	rt.Conditions.Declare(ConditionOutboxFull)
	rt.Outbox = bus.NewOutbox(b, bus.OutboxConfig{OnFull: func(full bool) {
		rt.Conditions.Set(ConditionOutboxFull, full, "events that must not be lost are being dropped: the bus has not stored anything for long")
	}}, log)
	rt.Metrics.MustRegister(rt.Outbox)
	// Discovery is for operators: a server that refuses it (permissions)
	// must not stop a failover service from running.
	if err := rt.startDiscovery(); err != nil {
		log.Warn("not discoverable with nats micro", "err", err)
	}
	rt.announced = rt.announce(ctx, events.ServiceStarted)
	rt.ready.Store(true)
	rt.sup.send(NotifyReady, "STATUS=running")
	return rt, nil
}

// Loop registers one of the service's main loops with the watchdog: the loop
// calls Alive on every turn and promises never to stay silent longer than
// bound (pick a few of its periods: a check loop with a 200 ms interval and
// a 150 ms timeout might promise 5 s). While any registered loop is silent
// past its bound, the process stops pinging systemd's watchdog (so systemd
// restarts it), /healthz fails and the status endpoint names the loop.
// Registering a name again replaces the earlier loop.
func (rt *Runtime) Loop(name string, bound time.Duration) *Loop { return rt.sup.loop(name, bound) }

// ShutdownContext is for clean-up after ctx was cancelled by a stop signal.
func (rt *Runtime) ShutdownContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), rt.common.ShutdownTimeout.D())
}

// Close announces the stop, drains the bus and stops serving HTTP.
func (rt *Runtime) Close(ctx context.Context) {
	rt.ready.Store(false)
	rt.sup.send(NotifyStopping, "STATUS=stopping")
	rt.stopDiscovery()
	// Half the shutdown budget goes to what is still waiting to be stored;
	// the rest to the announcement and draining the connection.
	octx, cancel := context.WithTimeout(ctx, rt.common.ShutdownTimeout.D()/2)
	if err := rt.Outbox.Close(octx); err != nil {
		rt.Log.Warn("outbox not drained", "err", err)
	}
	cancel()
	rt.announce(ctx, events.ServiceStopping)
	rt.Bus.Close()
	rt.stopHTTP()
}

// Announced is the time its start announcement carries, zero if it was not
// stored. A service that must read everything published since it said it
// started (and no more: a replay of its decisions begins there) watches
// from it (bus.WatchOptions.Since).
func (rt *Runtime) Announced() time.Time { return rt.announced }

// announce publishes the service's state and returns the announcement's
// time, zero when it was not stored.
func (rt *Runtime) announce(ctx context.Context, state events.ServiceState) time.Time {
	a := events.ServiceAnnounce{Service: rt.service, Node: rt.common.Node, Version: rt.version, State: state}
	actx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	env, err := rt.Bus.Emit(actx, a)
	if err != nil {
		rt.Log.Warn("announce failed", "state", state, "err", err)
		return time.Time{}
	}
	return env.Time
}

func (rt *Runtime) serveHTTP(addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("http_listen %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(rt.Metrics, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		switch {
		case !rt.ready.Load():
			http.Error(w, "not ready", http.StatusServiceUnavailable)
		case rt.Bus == nil || !rt.Bus.NC.IsConnected():
			http.Error(w, "not connected to the bus", http.StatusServiceUnavailable)
		default:
			if stale := staleNames(rt.sup.loopStatus()); len(stale) > 0 {
				http.Error(w, "silent loops: "+strings.Join(stale, ", "), http.StatusServiceUnavailable)
				return
			}
			if cs := rt.Conditions.Raised(); len(cs) > 0 {
				http.Error(w, describeConditions(cs), http.StatusServiceUnavailable)
				return
			}
			_, _ = w.Write([]byte("ok\n"))
		}
	})
	rt.http = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := rt.http.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			rt.Log.Error("http server", "err", err)
		}
	}()
	return nil
}

func (rt *Runtime) stopHTTP() {
	if rt.http != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = rt.http.Shutdown(ctx)
	}
}

// Serve starts the runtime, runs body until it returns, then closes the
// runtime with a fresh deadline (ctx is usually cancelled by then). body
// should return when ctx ends; its clean-up that still needs the bus (a
// final event) belongs before it returns.
func Serve(ctx context.Context, c Common, service, version string, log *slog.Logger, body func(ctx context.Context, rt *Runtime) error) error {
	rt, err := Start(ctx, c, service, version, log)
	if err != nil {
		return fmt.Errorf("%s start: %w", service, err)
	}
	err = body(ctx, rt)
	sctx, cancel := rt.ShutdownContext(ctx)
	defer cancel()
	rt.Close(sctx)
	return err
}
