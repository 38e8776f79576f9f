package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/services/arbiter/internal/httphb"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
)

// serveHeartbeats starts the HTTP heartbeat endpoint. Every replica serves
// it: a heartbeat only becomes an event on the bus, which the leader's
// registry and core consume like a prober's.
func (a *arbiter) serveHeartbeats(hh HTTPHeartbeatConfig, emit httphb.Emitter, metrics prometheus.Registerer) (func(), error) {
	h := httphb.New(httphb.Config{Token: hh.Token, NodeTokens: hh.NodeTokens, Nodes: hh.Nodes, MaxBody: hh.MaxBody, Interval: hh.Interval.D(),
		Rate: hh.RateLimit.PerSecond, Burst: hh.RateLimit.Burst, MaxSources: hh.RateLimit.MaxSources, Metrics: metrics},
		emit, a.listRegistry, a.log)
	var certs *httphb.CertFiles
	if hh.TLS.Cert != "" {
		c, err := httphb.LoadCertFiles(hh.TLS.Cert, hh.TLS.Key, a.log)
		if err != nil {
			return nil, err
		}
		certs = c
	}
	ln, err := net.Listen("tcp", hh.Listen)
	if err != nil {
		return nil, fmt.Errorf("http_heartbeat.listen: %w", err)
	}
	ln = h.LimitConns(ln, hh.ConnsPerSource, hh.MaxConns)
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second,
		IdleTimeout: time.Minute, MaxHeaderBytes: 8 << 10, ErrorLog: h.TLSErrorLog()}
	serve := func() error { return srv.Serve(ln) }
	if certs != nil {
		srv.TLSConfig = certs.TLSConfig()
		serve = func() error { return srv.ServeTLS(h.GuardTLS(ln), "", "") }
	}
	go func() {
		if err := serve(); err != nil && !errors.Is(err, http.ErrServerClosed) {
			a.log.Error("http heartbeat endpoint stopped", "err", err)
		}
	}()
	a.log.Info("http heartbeat endpoint listening", "addr", ln.Addr().String(), "nodes", hh.Nodes, "tls", certs != nil)
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	}, nil
}

// listRegistry reads every registry record of the cluster.
func (a *arbiter) listRegistry(ctx context.Context) ([]events.NodeRecord, error) {
	l, err := a.kv.ListKeysFiltered(ctx, events.AllRegistryKeys(a.cfg.Cluster))
	if err != nil {
		return nil, err
	}
	var out []events.NodeRecord
	for k := range l.Keys() {
		e, err := a.kv.Get(ctx, k)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		var rec events.NodeRecord
		if err := json.Unmarshal(e.Value(), &rec); err != nil {
			return nil, fmt.Errorf("registry %s: %w", k, err)
		}
		out = append(out, rec)
	}
	return out, nil
}
