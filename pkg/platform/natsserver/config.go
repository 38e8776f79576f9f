package natsserver

import (
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"

	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/config"
)

// Config configures an in-process nats-server with JetStream: alone, or as
// one member of a cluster (Cluster.Name set), which is how fan-nats runs
// the three servers of a production bus. They are the keys of fan-nats's
// -config file.
type Config struct {
	StoreDir string `yaml:"store_dir"`
	// Listen, when set (host:port), also serves other processes; empty
	// means in-process connections only.
	Listen string `yaml:"listen"`
	// ServerName must be unique in a cluster: raft groups and leader
	// placement (bus.leader_servers) name servers by it.
	ServerName string `yaml:"server_name"`
	// Tags label the server for JetStream placement (for example
	// "host:witness"); JetStream ignores them without a placement request.
	Tags    []string `yaml:"tags"`
	Cluster Cluster  `yaml:"cluster"`
	// ServerConfig is a nats-server configuration file (its authorization,
	// accounts and tls blocks, as `fanctl nats-config` writes them) applied
	// first; the keys above win where both are set.
	ServerConfig string `yaml:"server_config"`
	// InsecureLab lets a client or route listener be on an address other
	// than loopback with no authentication or no TLS. Only for a throwaway
	// lab: anyone who reaches the port runs the cluster.
	InsecureLab bool `yaml:"insecure_lab"`
	// LogNotices logs the server's notices (routes made and lost, raft
	// leaders elected) at info instead of debug. A server of its own
	// (fan-nats) sets it: those lines are how an operator reconstructs what
	// the cluster did during an outage.
	LogNotices bool `yaml:"log_notices"`
}

// Cluster joins the server to a NATS cluster. The zero value means a
// standalone server.
type Cluster struct {
	// Name is the cluster's name, the same on every member.
	Name string `yaml:"name"`
	// Listen is the route address (host:port) the other members dial.
	Listen string `yaml:"listen"`
	// Routes are the other members' route addresses (host:port or
	// nats-route://host:port); listing this server's own is harmless.
	Routes []string `yaml:"routes"`
}

// MaxRoutes bounds cluster.routes, as bus.MaxServers bounds a client's
// bus.url: one list names the same servers as the other.
const MaxRoutes = bus.MaxServers

// Validate checks the settings, reporting every one that is wrong; key
// names are relative to prefix (the config file's top in fan-nats).
func (c *Config) Validate(prefix string) error {
	key := prefixed(prefix)
	var errs []error
	if c.StoreDir == "" {
		errs = append(errs, config.Errf(key("store_dir"), "required"))
	}
	if c.Listen != "" {
		errs = append(errs, config.HostPort(key("listen"), c.Listen, true))
	}
	errs = append(errs, config.CountIn(key("cluster.routes"), len(c.Cluster.Routes), 0, MaxRoutes))
	cl := c.Cluster
	if cl.Name == "" {
		if cl.Listen != "" || len(cl.Routes) > 0 {
			errs = append(errs, config.Errf(key("cluster.name"), "required with cluster.listen or cluster.routes"))
		}
		return config.Join(errs...)
	}
	if cl.Listen == "" {
		errs = append(errs, config.Errf(key("cluster.listen"), "required in a cluster"))
	} else {
		errs = append(errs, config.HostPort(key("cluster.listen"), cl.Listen, true))
	}
	if c.ServerName == "" {
		errs = append(errs, config.Errf(key("server_name"), "required in a cluster (unique per server)"))
	}
	for i, r := range cl.Routes {
		if _, err := routeURL(r); err != nil {
			errs = append(errs, config.Errf(fmt.Sprintf("%s[%d]", key("cluster.routes"), i), "%v", err))
		}
	}
	return config.Join(errs...)
}

// prefixed names keys below prefix.
func prefixed(prefix string) func(string) string {
	return func(k string) string {
		if prefix == "" {
			return k
		}
		return prefix + "." + k
	}
}

// routeURL accepts host:port or a nats-route:// URL.
func routeURL(r string) (*url.URL, error) {
	if !strings.Contains(r, "://") {
		r = "nats-route://" + r
	}
	u, err := url.Parse(r)
	if err != nil {
		return nil, err
	}
	if u.Host == "" || u.Port() == "" {
		return nil, fmt.Errorf("route %q: want host:port", r)
	}
	if n, err := strconv.ParseUint(u.Port(), 10, 16); err != nil || n == 0 {
		return nil, fmt.Errorf("route %q: port must be 1..65535", r)
	}
	return u, nil
}

func splitHostPort(hp string) (string, int, error) {
	host, p, err := net.SplitHostPort(hp)
	if err != nil {
		return "", 0, err
	}
	port, err := strconv.Atoi(p)
	if err != nil {
		return "", 0, fmt.Errorf("port %q: %w", p, err)
	}
	return host, port, nil
}
