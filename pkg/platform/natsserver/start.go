package natsserver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// routePingInterval is how often a cluster member pings each route; two
// unanswered pings close it.
const routePingInterval = 2 * time.Second

// Start starts the real nats-server with JetStream in this process and
// returns it once it accepts clients.
func Start(c Config, log *slog.Logger) (*server.Server, error) {
	if err := os.MkdirAll(c.StoreDir, 0o750); err != nil {
		return nil, fmt.Errorf("embedded nats store %s: %w", c.StoreDir, err)
	}
	opts, err := options(c)
	if err != nil {
		return nil, err
	}
	if err := checkListeners(opts, c.InsecureLab); err != nil {
		return nil, fmt.Errorf("embedded nats: %w", err)
	}
	srv, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("embedded nats: %w", err)
	}
	notice := slog.LevelDebug
	if c.LogNotices {
		notice = slog.LevelInfo
	}
	srv.SetLoggerV2(serverLogger{l: log.With("component", "nats-server"), notice: notice}, false, false, false)
	go srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		srv.Shutdown()
		return nil, errors.New("natsserver: not ready after 10s")
	}
	return srv, nil
}

// options are the nats-server options c asks for: its server configuration
// file, then its own keys over it.
func options(c Config) (*server.Options, error) {
	// The server config file, if any, is read into empty options (it may
	// set what Config sets, which the parser would call a duplicate); the
	// keys of Config then win over it.
	opts := &server.Options{}
	if c.ServerConfig != "" {
		if err := opts.ProcessConfigFile(c.ServerConfig); err != nil {
			return nil, fmt.Errorf("embedded nats server config %s: %w", c.ServerConfig, err)
		}
	}
	if c.ServerName != "" {
		opts.ServerName = c.ServerName
	}
	opts.JetStream, opts.StoreDir, opts.NoSigs = true, c.StoreDir, true
	opts.DontListen = c.Listen == ""
	if opts.JetStreamMaxMemory == 0 {
		opts.JetStreamMaxMemory = 64 << 20
	}
	if opts.JetStreamMaxStore == 0 {
		opts.JetStreamMaxStore = 1 << 30
	}
	if opts.ServerName == "" {
		opts.ServerName = "fan-embedded"
	}
	if c.Listen != "" {
		host, port, err := splitHostPort(c.Listen)
		if err != nil {
			return nil, fmt.Errorf("embedded nats listen %q: %w", c.Listen, err)
		}
		opts.Host, opts.Port = host, port
	}
	opts.Tags = append(opts.Tags, c.Tags...)
	if cl := c.Cluster; cl.Name != "" {
		if err := c.Validate(""); err != nil {
			return nil, fmt.Errorf("embedded nats: %w", err)
		}
		host, port, err := splitHostPort(cl.Listen)
		if err != nil {
			return nil, fmt.Errorf("embedded nats cluster listen %q: %w", cl.Listen, err)
		}
		opts.Cluster.Name, opts.Cluster.Host, opts.Cluster.Port = cl.Name, host, port
		for _, r := range cl.Routes {
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
// process: the embedding program decides how to stop.
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
