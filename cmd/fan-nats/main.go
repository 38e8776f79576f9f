// Command fan-nats runs the real nats-server with JetStream, embedded in a
// small fan binary: alone for a lab, or as one member of a three-server
// cluster (-cluster-name, -cluster-listen, -routes) for production. The
// stock nats-server works as well.
//
// A client or route listener off loopback needs authentication and TLS
// (-server-config, a nats-server file as `fanctl nats-config` writes it);
// without them fan-nats refuses to start unless -insecure-lab says the bus
// is a throwaway lab.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/fanpbx/fan/cmd/internal/natsconf"
	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/daemon"
)

var version = "dev"

func main() {
	e, err := natsconf.Parse(os.Args[1:], os.Stderr)
	if errors.Is(err, natsconf.ErrUsage) {
		os.Exit(2)
	}
	if errors.Is(err, natsconf.ErrVersion) {
		fmt.Println(daemon.VersionLine("fan-nats", version))
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "fan-nats:", err)
		os.Exit(2)
	}
	e.LogNotices = true
	log, _ := daemon.NewLogger(os.Stderr, "info", "json")
	log = log.With("service", "fan-nats")
	// Under systemd (Type=notify in fan-nats.service) READY=1 tells the
	// units ordered after this one that the server accepts clients.
	notify, err := daemon.NotifierFromEnv()
	if err != nil {
		log.Warn("sd_notify disabled", "err", err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	srv, err := bus.StartEmbedded(e, log)
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
	<-ctx.Done()
	_ = notify.Send(daemon.NotifyStopping)
	srv.Shutdown()
	srv.WaitForShutdown()
	log.Info("stopped")
}
