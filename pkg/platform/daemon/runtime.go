package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/config"
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

// Validate checks the common keys.
func (c *Common) Validate() error {
	if err := events.ValidToken("cluster", c.Cluster); err != nil {
		return &config.FieldError{Key: "cluster", Err: err}
	}
	if err := events.ValidToken("node", c.Node); err != nil {
		return &config.FieldError{Key: "node", Err: err}
	}
	c.Bus.Defaults()
	if err := c.Bus.Validate(); err != nil {
		return err
	}
	if c.ShutdownTimeout == 0 {
		c.ShutdownTimeout = config.Duration(10 * time.Second)
	}
	return nil
}

// Runtime is what a running service shares with its components.
type Runtime struct {
	Bus     *bus.Bus
	Log     *slog.Logger
	Metrics *prometheus.Registry
	common  Common
	service string
	version string
	ready   atomic.Bool
	http    *http.Server
}

// Start connects to the bus, provisions fan's streams, serves /metrics and
// /healthz, and announces the service. Close undoes it in reverse.
func Start(ctx context.Context, c Common, service, version string, log *slog.Logger) (*Runtime, error) {
	rt := &Runtime{Log: log, common: c, service: service, version: version, Metrics: prometheus.NewRegistry()}
	rt.Metrics.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
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
	if err := b.Provision(ctx); err != nil {
		b.Close()
		rt.stopHTTP()
		return nil, err
	}
	rt.announce(ctx, events.ServiceStarted)
	rt.ready.Store(true)
	return rt, nil
}

// ShutdownContext is for clean-up after ctx was cancelled by a stop signal.
func (rt *Runtime) ShutdownContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), rt.common.ShutdownTimeout.D())
}

// Close announces the stop, drains the bus and stops serving HTTP.
func (rt *Runtime) Close(ctx context.Context) {
	rt.ready.Store(false)
	rt.announce(ctx, events.ServiceStopping)
	rt.Bus.Close()
	rt.stopHTTP()
}

func (rt *Runtime) announce(ctx context.Context, state events.ServiceState) {
	a := events.ServiceAnnounce{Service: rt.service, Node: rt.common.Node, Version: rt.version, State: state}
	actx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if _, err := rt.Bus.Emit(actx, a); err != nil {
		rt.Log.Warn("announce failed", "state", state, "err", err)
	}
}

func (rt *Runtime) serveHTTP(addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("http_listen %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(rt.Metrics, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		if !rt.ready.Load() || rt.Bus == nil || !rt.Bus.NC.IsConnected() {
			http.Error(w, "not ready", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
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
