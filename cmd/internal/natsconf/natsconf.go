// Package natsconf reads fan-nats's settings: a YAML file (-config) with
// the keys of bus.embedded, and command-line flags that override the keys
// they name. A flag not given leaves the file's value alone, so a unit file
// can pass -config and still change one setting for a run.
package natsconf

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/config"
)

// Defaults of the keys neither the file nor a flag sets.
const (
	DefaultListen = "127.0.0.1:4222"
	DefaultStore  = "/var/lib/fan/nats"
	DefaultName   = "fan-nats"
)

// ErrUsage is returned for bad flags (the flag package has printed why).
var ErrUsage = errors.New("usage")

// ErrVersion is returned for -version: the caller prints its version and exits.
var ErrVersion = errors.New("version requested")

// Parse reads args (without the program name) and the -config file they
// name, if any, into the server's settings, validated.
func Parse(args []string, stderr io.Writer) (bus.Embedded, error) {
	fs := flag.NewFlagSet("fan-nats", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfgPath := fs.String("config", "", "YAML file with the keys of bus.embedded (store_dir, listen, server_name, tags, cluster: {name, listen, routes}, server_config, insecure_lab); flags given override it")
	listen := fs.String("listen", DefaultListen, "client address (host:port)")
	store := fs.String("store", DefaultStore, "JetStream store directory")
	name := fs.String("name", DefaultName, "server name (unique in a cluster)")
	tags := fs.String("tags", "", "server tags, comma separated")
	clusterName := fs.String("cluster-name", "", "cluster name; set to join a cluster")
	clusterListen := fs.String("cluster-listen", "", "route address the other members dial (host:port)")
	routes := fs.String("routes", "", "the members' route addresses, comma separated (host:port or nats-route://host:port)")
	serverConf := fs.String("server-config", "", "nats-server configuration file: authorization, accounts, tls (fanctl nats-config writes it)")
	insecure := fs.Bool("insecure-lab", false, "allow a listener off loopback without authentication or TLS (throwaway labs only)")
	showVersion := fs.Bool("version", false, "print the version and exit")
	if err := fs.Parse(args); err != nil {
		return bus.Embedded{}, ErrUsage
	}
	if *showVersion {
		return bus.Embedded{}, ErrVersion
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "fan-nats: unexpected arguments %q\n", fs.Args())
		return bus.Embedded{}, ErrUsage
	}
	e := bus.Embedded{StoreDir: DefaultStore, Listen: DefaultListen, ServerName: DefaultName}
	if *cfgPath != "" {
		// The file's keys replace the defaults; its validation waits until
		// the flags are applied, since they may complete it.
		var f file
		f.Embedded = e
		if err := config.Load(*cfgPath, &f); err != nil {
			return bus.Embedded{}, err
		}
		e = f.Embedded
	}
	fs.Visit(func(fl *flag.Flag) {
		switch fl.Name {
		case "listen":
			e.Listen = *listen
		case "store":
			e.StoreDir = *store
		case "name":
			e.ServerName = *name
		case "tags":
			e.Tags = split(*tags)
		case "cluster-name":
			e.Cluster.Name = *clusterName
		case "cluster-listen":
			e.Cluster.Listen = *clusterListen
		case "routes":
			e.Cluster.Routes = split(*routes)
		case "server-config":
			e.ServerConfig = *serverConf
		case "insecure-lab":
			e.InsecureLab = *insecure
		}
	})
	if err := e.Validate(""); err != nil {
		if *cfgPath != "" {
			return bus.Embedded{}, fmt.Errorf("config %s (with flags): %w", *cfgPath, err)
		}
		return bus.Embedded{}, err
	}
	return e, nil
}

// file is the config file's shape: bus.embedded's keys at the top.
type file struct {
	bus.Embedded `yaml:",inline"`
}

func split(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}
