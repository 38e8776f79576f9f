// Package natsconf reads fan-nats's settings: a YAML file (-config) with
// the keys of natsserver.Config, and command-line flags that override the keys
// they name. A flag not given leaves the file's value alone, so a unit file
// can pass -config and still change one setting for a run. -check-config
// checks all of it, and the nats-server configuration file it names, as
// the start would, and reports every error.
package natsconf

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/fanpbx/fan/pkg/platform/config"
	"github.com/fanpbx/fan/pkg/platform/daemon"
	"github.com/fanpbx/fan/pkg/platform/natsserver"
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

// Settings are what fan-nats's command line asks for.
type Settings struct {
	Server natsserver.Config
	// Check is -check-config: check everything, start nothing.
	Check bool
	// ConfigPath is the -config file ("" when there is none).
	ConfigPath string
}

// Parse reads args (without the program name) and the -config file they
// name, if any, into the server's settings, validated.
func Parse(args []string, stderr io.Writer) (natsserver.Config, error) {
	s, _, err := load(args, stderr, false)
	return s.Server, err
}

// Load is Parse, then the checks of what the settings name on this host
// (natsserver.Config.CheckHost: the addresses to listen on, the store, the
// nats-server configuration file read by nats-server's own parser, and
// the certificates and keys its tls blocks name). It is what -check-config
// reports and what fan-nats starts with. err lists every error, each placed
// on its line of the file or on the flag that set it (a *config.Errors),
// or is ErrUsage or ErrVersion; warnings refuse nothing.
func Load(args []string, stderr io.Writer) (s Settings, warnings []string, err error) {
	return load(args, stderr, true)
}

// flagKeys are the file's keys each flag sets.
var flagKeys = map[string]string{
	"listen": "listen", "store": "store_dir", "name": "server_name", "tags": "tags",
	"cluster-name": "cluster.name", "cluster-listen": "cluster.listen", "routes": "cluster.routes",
	"server-config": "server_config", "insecure-lab": "insecure_lab",
}

func load(args []string, stderr io.Writer, host bool) (Settings, []string, error) {
	fs := flag.NewFlagSet("fan-nats", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfgPath := fs.String("config", "", "YAML file with the server's keys (store_dir, listen, server_name, tags, cluster: {name, listen, routes}, server_config, insecure_lab); flags given override it")
	listen := fs.String("listen", DefaultListen, "client address (host:port)")
	store := fs.String("store", DefaultStore, "JetStream store directory")
	name := fs.String("name", DefaultName, "server name (unique in a cluster)")
	tags := fs.String("tags", "", "server tags, comma separated")
	clusterName := fs.String("cluster-name", "", "cluster name; set to join a cluster")
	clusterListen := fs.String("cluster-listen", "", "route address the other members dial (host:port)")
	routes := fs.String("routes", "", "the members' route addresses, comma separated (host:port or nats-route://host:port)")
	serverConf := fs.String("server-config", "", "nats-server configuration file: authorization, accounts, tls (fanctl nats-config writes it)")
	insecure := fs.Bool("insecure-lab", false, "allow a listener off loopback without authentication or TLS (throwaway labs only)")
	check := fs.Bool("check-config", false, "check the flags, the -config file (or the one path given) and the nats-server configuration they name, and exit (non-zero on any error)")
	showVersion := fs.Bool("version", false, "print the version and exit")
	rest, err := daemon.ParseFlags(fs, args)
	if err != nil {
		return Settings{}, nil, ErrUsage
	}
	if *showVersion {
		return Settings{}, nil, ErrVersion
	}
	path, err := daemon.ConfigPath(fs, *cfgPath, *check, rest)
	if err != nil {
		fmt.Fprintf(stderr, "fan-nats: %v\n", err)
		return Settings{}, nil, ErrUsage
	}
	s := Settings{Check: *check, ConfigPath: path}
	e := natsserver.Config{StoreDir: DefaultStore, Listen: DefaultListen, ServerName: DefaultName}
	doc := config.NewDoc("")
	if path != "" {
		b, err := os.ReadFile(path)
		if err != nil {
			return s, nil, fmt.Errorf("config %s: %w", path, err)
		}
		// The file's keys replace the defaults; its validation waits until
		// the flags are applied, since they may complete it.
		f := file{Config: e}
		d, ok := config.Decode(path, b, &f)
		if !ok {
			_, err := d.Report()
			return s, nil, err
		}
		doc, e = d, f.Config
	}
	fs.Visit(func(fl *flag.Flag) {
		if k, ok := flagKeys[fl.Name]; ok {
			doc.SetFrom(k, "-"+fl.Name)
		}
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
	s.Server = e
	errs := []error{e.Validate("")}
	if host {
		errs = append(errs, e.CheckHost(""))
	}
	warnings, err := doc.Report(errs...)
	return s, warnings, err
}

// file is the config file's shape: natsserver.Config's keys at the top.
type file struct {
	natsserver.Config `yaml:",inline"`
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
