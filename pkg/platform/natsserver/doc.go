// Package natsserver runs the real nats-server with JetStream inside a fan
// process: alone, or as one member of a cluster, as fan-nats runs the three
// servers of a production bus. It is the only fan package that links
// nats-server, and only fan-nats and the lab import it (the test helpers
// too, in tests): a service reaches the bus as a client (package bus, with
// bus.url) and carries no server of its own.
//
// It starts a server (Start), applies a changed configuration to a running
// one (Reload), and checks a configuration before a start as -check-config
// does (Config.Validate, Config.CheckHost), refusing, as Start does, a
// listener off loopback without authentication and TLS (bus.ErrInsecure).
package natsserver
