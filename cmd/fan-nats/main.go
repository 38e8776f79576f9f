// Command fan-nats runs the real nats-server with JetStream, embedded in a
// small fan binary, for labs and images that cannot pull a NATS image.
// Production uses a regular three-node NATS cluster instead.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/daemon"
)

var version = "dev"

func main() {
	fs := flag.NewFlagSet("fan-nats", flag.ContinueOnError)
	listen := fs.String("listen", "127.0.0.1:4222", "client address (host:port)")
	store := fs.String("store", "/var/lib/fan/nats", "JetStream store directory")
	name := fs.String("name", "fan-nats", "server name")
	if err := fs.Parse(os.Args[1:]); err != nil {
		os.Exit(2)
	}
	log, _ := daemon.NewLogger(os.Stderr, "info", "json")
	log = log.With("service", "fan-nats")
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	srv, err := bus.StartEmbedded(bus.Embedded{StoreDir: *store, Listen: *listen, ServerName: *name}, log)
	if err != nil {
		fmt.Fprintln(os.Stderr, "fan-nats:", err)
		os.Exit(1)
	}
	log.Info("ready", "url", srv.ClientURL(), "version", version)
	<-ctx.Done()
	srv.Shutdown()
	srv.WaitForShutdown()
	log.Info("stopped")
}
