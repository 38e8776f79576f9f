// Command fan-nats runs the real nats-server with JetStream, embedded in a
// small fan binary: alone for a lab, or as one member of a three-server
// cluster (-cluster-name, -cluster-listen, -routes) for production. The
// stock nats-server works as well.
//
// A client or route listener off loopback needs authentication and TLS
// (-server-config, a nats-server file as `fanctl nats-config` writes it);
// without them fan-nats refuses to start unless -insecure-lab says the bus
// is a throwaway lab. -check-config checks the flags, the -config file and
// the nats-server configuration file (with nats-server's own parser, and
// the certificates and keys it names) and exits, non-zero on any error.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/fanpbx/fan/cmd/internal/natsconf"
	"github.com/fanpbx/fan/pkg/platform/daemon"
	"github.com/fanpbx/fan/pkg/platform/natsserver"
)

var version = "dev"

func main() {
	log, _ := daemon.NewLogger(os.Stderr, "info", "json")
	log = log.With("service", "fan-nats")
	// The start checks what -check-config (the unit's ExecStartPre) checks,
	// and refuses the same way.
	s, warnings, err := natsconf.Load(os.Args[1:], os.Stderr)
	if errors.Is(err, natsconf.ErrUsage) {
		os.Exit(2)
	}
	if errors.Is(err, natsconf.ErrVersion) {
		fmt.Println(daemon.VersionLine("fan-nats", version))
		return
	}
	for _, w := range warnings {
		if s.Check {
			fmt.Fprintln(os.Stderr, "warning: "+w)
		} else {
			log.Warn("configuration warning", "warning", w)
		}
	}
	what := s.ConfigPath
	if what == "" {
		what = "(flags only)"
	}
	if err != nil {
		daemon.PrintConfigError(os.Stderr, "fan-nats", what, err)
		os.Exit(2)
	}
	if s.Check {
		fmt.Printf("fan-nats: configuration %s is valid\n", what)
		return
	}
	e := s.Server
	e.LogNotices = true
	// Under systemd (Type=notify in fan-nats.service) READY=1 tells the
	// units ordered after this one that the server accepts clients.
	notify, err := daemon.NotifierFromEnv()
	if err != nil {
		log.Warn("sd_notify disabled", "err", err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	srv, err := natsserver.Start(e, log)
	if err != nil {
		fmt.Fprintln(os.Stderr, "fan-nats:", err)
		os.Exit(1)
	}
	if e.InsecureLab {
		log.Warn("insecure lab: clients may connect without TLS or authentication", "listen", e.Listen)
	}
	log.Info("ready", "url", srv.ClientURL(), "server_name", e.ServerName, "cluster", e.Cluster.Name,
		"routes", e.Cluster.Routes, "version", version)
	if err := notify.Send(daemon.NotifyReady, "STATUS=accepting clients on "+srv.ClientURL()); err != nil {
		log.Warn("sd_notify failed", "err", err)
	}
	// SIGHUP (systemctl reload fan-nats) applies what nats-server can apply
	// live: the users and permissions of a changed server configuration
	// (a person added to the site), renewed certificates. What needs a
	// restart is refused and logged; the server keeps running as it was.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	for running := true; running; {
		select {
		case <-hup:
			reload(srv, log)
		case <-ctx.Done():
			running = false
		}
	}
	_ = notify.Send(daemon.NotifyStopping)
	srv.Shutdown()
	srv.WaitForShutdown()
	log.Info("stopped")
}

// reload reads the settings again, as at start, and applies them.
func reload(srv *server.Server, log *slog.Logger) {
	s, _, err := natsconf.Load(os.Args[1:], io.Discard)
	if err != nil {
		log.Error("reload refused: the configuration is invalid; still running the previous one", "err", err)
		return
	}
	if err := natsserver.Reload(srv, s.Server); err != nil {
		log.Error("reload refused; still running the previous configuration (a restart applies it)", "err", err)
		return
	}
	log.Info("reloaded", "server_config", s.Server.ServerConfig)
}
