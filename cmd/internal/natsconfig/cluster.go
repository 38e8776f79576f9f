// Package natsconfig writes what a fan cluster's bus needs to run with
// authentication, TLS and per-identity permissions: a CA, server and client
// certificates, one nkey per service per host, per operator, per auditor,
// per status page (viewer) and for the admin, each nats-server's
// configuration (permissions derived from pkg/events), and one bundle
// directory per host holding what goes there.
package natsconfig

import (
	"fmt"
	"net"
	"slices"
	"strconv"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/config"
)

// Cluster is the small file an installer writes by hand.
type Cluster struct {
	// Cluster is fan's cluster name (the subject token).
	Cluster string `yaml:"cluster"`
	// NATS lists the nats-servers; three for production.
	NATS []Server `yaml:"nats"`
	// LeaderServers names, most preferred first, the servers that should
	// lead every raft group (the witness's in the co-located shape). It goes
	// into every arbiter's bus.leader_servers; an arbiter on a host that shares
	// a server not listed here is written as a standby.
	LeaderServers []string `yaml:"leader_servers"`
	// Nodes are the PBX nodes (prober, ipmover and replicator run on each).
	Nodes []Host `yaml:"nodes"`
	// Control are the control hosts (arbiter and scheduler run on each).
	Control []Host `yaml:"control"`
	// HTTPHeartbeatNodes are nodes without a prober whose heartbeats the
	// arbiter receives over HTTP and publishes for them.
	HTTPHeartbeatNodes []string `yaml:"http_heartbeat_nodes"`
	// Operators may run fanctl's actions; auditors only read.
	Operators []string `yaml:"operators"`
	Auditors  []string `yaml:"auditors"`
	// Viewers are status pages (fanctl serve), named for where they run:
	// each may read the trail, the live state and the state bucket, and
	// nothing else (events.RoleViewer).
	Viewers []string `yaml:"viewers"`
	// Paths on the hosts where the bundles are installed.
	NATSDir  string `yaml:"nats_dir"`  // on nats servers (default /etc/nats)
	StoreDir string `yaml:"store_dir"` // JetStream storage (default /var/lib/nats)
	FanDir   string `yaml:"fan_dir"`   // on fan hosts (default /etc/fan/bus)
	// CertDays is the validity of issued certificates (default 825).
	CertDays int `yaml:"cert_days"`
}

// Server is one nats-server.
type Server struct {
	Name string `yaml:"name"`
	// Host is the name clients and routes use; it goes in the certificate.
	Host string `yaml:"host"`
	// IPs are further addresses in the certificate.
	IPs         []string `yaml:"ips"`
	ClientPort  int      `yaml:"client_port"`  // default 4222
	ClusterPort int      `yaml:"cluster_port"` // default 6222
	// Monitor is the monitoring listener (default 127.0.0.1:8222; "-" for none).
	Monitor string `yaml:"monitor"`
	// FanHost is the node or control host this server shares a machine with
	// (empty: a NATS host of its own). Services on that host dial it first.
	FanHost string `yaml:"fan_host"`
}

// Host is a machine that runs fan services.
type Host struct {
	Name string `yaml:"name"`
	// Services run on it (default: prober, ipmover, replicator on a node;
	// arbiter, scheduler on a control host).
	Services []events.BusRole `yaml:"services"`
	// DNSSites are the sites a DNS executor (an ipmover) on this host
	// carries out commands for.
	DNSSites []string `yaml:"dns_sites"`
}

// LoadCluster reads and checks a cluster file.
func LoadCluster(path string) (Cluster, error) {
	var c Cluster
	if err := config.Load(path, &c); err != nil {
		return c, err
	}
	c.defaults()
	return c, c.validate()
}

func (c *Cluster) defaults() {
	if c.NATSDir == "" {
		c.NATSDir = "/etc/nats"
	}
	if c.StoreDir == "" {
		c.StoreDir = "/var/lib/nats"
	}
	if c.FanDir == "" {
		c.FanDir = "/etc/fan/bus"
	}
	if c.CertDays == 0 {
		c.CertDays = 825
	}
	for i := range c.NATS {
		s := &c.NATS[i]
		if s.ClientPort == 0 {
			s.ClientPort = 4222
		}
		if s.ClusterPort == 0 {
			s.ClusterPort = 6222
		}
		if s.Monitor == "" {
			s.Monitor = "127.0.0.1:8222"
		}
		if s.Host == "" {
			s.Host = s.Name
		}
	}
	for i := range c.Nodes {
		if len(c.Nodes[i].Services) == 0 {
			c.Nodes[i].Services = []events.BusRole{events.RoleProber, events.RoleIPMover, events.RoleReplicator}
		}
	}
	for i := range c.Control {
		h := &c.Control[i]
		if len(h.Services) == 0 {
			h.Services = []events.BusRole{events.RoleArbiter, events.RoleScheduler}
		}
		if len(h.DNSSites) > 0 && !slices.Contains(h.Services, events.RoleIPMover) {
			h.Services = append(h.Services, events.RoleIPMover)
		}
	}
}

func (c *Cluster) validate() error {
	if err := events.ValidToken("cluster", c.Cluster); err != nil {
		return config.Errf("cluster", "%v", err)
	}
	if len(c.NATS) == 0 {
		return config.Errf("nats", "at least one server")
	}
	names := map[string]string{}
	unique := func(key, kind, name string) error {
		if err := events.ValidToken(kind, name); err != nil {
			return config.Errf(key, "%v", err)
		}
		if prev, dup := names[name]; dup {
			return config.Errf(key, "%q is already a %s (every name is a directory of the output)", name, prev)
		}
		names[name] = kind
		return nil
	}
	for i, s := range c.NATS {
		if err := unique(fmt.Sprintf("nats[%d].name", i), "nats server", s.Name); err != nil {
			return err
		}
	}
	for _, hs := range []struct {
		key   string
		hosts []Host
	}{{"nodes", c.Nodes}, {"control", c.Control}} {
		for i, h := range hs.hosts {
			key := fmt.Sprintf("%s[%d]", hs.key, i)
			if err := unique(key+".name", hs.key, h.Name); err != nil {
				return err
			}
			for _, r := range h.Services {
				if !slices.Contains(events.Services, r) {
					return config.Errf(key+".services", "%q is not a fan service (one of %v)", r, events.Services)
				}
			}
			for _, s := range h.DNSSites {
				if err := events.ValidToken("site", s); err != nil {
					return config.Errf(key+".dns_sites", "%v", err)
				}
			}
		}
	}
	servers := map[string]bool{}
	for _, s := range c.NATS {
		servers[s.Name] = true
	}
	for i, l := range c.LeaderServers {
		if !servers[l] {
			return config.Errf(fmt.Sprintf("leader_servers[%d]", i), "%q is not one of the nats servers", l)
		}
	}
	sharing := map[string]string{}
	for i, s := range c.NATS {
		if s.FanHost == "" {
			continue
		}
		key := fmt.Sprintf("nats[%d].fan_host", i)
		if kind := names[s.FanHost]; kind != "nodes" && kind != "control" {
			return config.Errf(key, "%q is not a node or control host", s.FanHost)
		}
		if prev, dup := sharing[s.FanHost]; dup {
			return config.Errf(key, "%q already shares a machine with %s", s.FanHost, prev)
		}
		sharing[s.FanHost] = s.Name
	}
	for _, n := range c.HTTPHeartbeatNodes {
		if err := events.ValidToken("node", n); err != nil {
			return config.Errf("http_heartbeat_nodes", "%v", err)
		}
	}
	for _, p := range []struct {
		key   string
		names []string
	}{{"operators", c.Operators}, {"auditors", c.Auditors}, {"viewers", c.Viewers}} {
		for i, n := range p.names {
			if n == "admin" {
				return config.Errf(fmt.Sprintf("%s[%d]", p.key, i), "admin is reserved")
			}
			if err := unique(fmt.Sprintf("%s[%d]", p.key, i), p.key, n); err != nil {
				return err
			}
		}
	}
	if _, dup := names["admin"]; dup {
		return config.Errf("nodes", "admin is reserved")
	}
	return nil
}

// identity is one credential the generator issues.
type identity struct {
	events.Identity
	// Dir is the bundle (host, operator or auditor) it is installed with.
	Dir string
	// System marks the system-account user (leader step-downs).
	System bool
}

// file is the base name of the identity's files in its bundle.
func (i identity) file() string {
	if i.System {
		return "arbiter-system"
	}
	return string(i.Role)
}

// identities lists every credential of the cluster, in a stable order.
func (c Cluster) identities() []identity {
	var out []identity
	for _, h := range c.Nodes {
		for _, r := range h.Services {
			out = append(out, identity{Identity: events.Identity{Cluster: c.Cluster, Role: r, Name: h.Name}, Dir: h.Name})
			// A standby replica on a PBX host runs the steward whenever it
			// holds the lease, meta leader step-downs included.
			if r == events.RoleArbiter {
				out = append(out, identity{Identity: events.Identity{Cluster: c.Cluster, Role: r, Name: h.Name}, Dir: h.Name, System: true})
			}
		}
	}
	for _, h := range c.Control {
		for _, r := range h.Services {
			id := identity{Identity: events.Identity{Cluster: c.Cluster, Role: r, Name: h.Name}, Dir: h.Name}
			switch r {
			case events.RoleIPMover:
				id.Executes = h.DNSSites
			case events.RoleArbiter:
				id.Relays = c.HTTPHeartbeatNodes
			}
			out = append(out, id)
			if r == events.RoleArbiter {
				out = append(out, identity{Identity: events.Identity{Cluster: c.Cluster, Role: r, Name: h.Name}, Dir: h.Name, System: true})
			}
		}
	}
	for _, n := range c.Operators {
		out = append(out, identity{Identity: events.Identity{Cluster: c.Cluster, Role: events.RoleOperator, Name: n}, Dir: n})
	}
	for _, n := range c.Auditors {
		out = append(out, identity{Identity: events.Identity{Cluster: c.Cluster, Role: events.RoleAuditor, Name: n}, Dir: n})
	}
	for _, n := range c.Viewers {
		out = append(out, identity{Identity: events.Identity{Cluster: c.Cluster, Role: events.RoleViewer, Name: n}, Dir: n})
	}
	out = append(out, identity{Identity: events.Identity{Cluster: c.Cluster, Role: events.RoleAdmin, Name: "admin"}, Dir: "admin"})
	return out
}

// ClientURLs lists the servers for a client on host, in the order it must
// dial them: the server sharing its machine first (a PBX host's own server
// answers even when the LAN is cut), then the leader servers in order (where
// every write goes anyway, and the witness in the co-located shape), then
// the rest. An empty host (a person's machine) starts with the leaders.
func (c Cluster) ClientURLs(host string) []string {
	var order []Server
	has := func(name string) bool {
		return slices.ContainsFunc(order, func(o Server) bool { return o.Name == name })
	}
	for _, s := range c.NATS {
		if host != "" && s.FanHost == host {
			order = append(order, s)
		}
	}
	for _, l := range c.LeaderServers {
		for _, s := range c.NATS {
			if s.Name == l && !has(s.Name) {
				order = append(order, s)
			}
		}
	}
	for _, s := range c.NATS {
		if !has(s.Name) {
			order = append(order, s)
		}
	}
	u := make([]string, 0, len(order))
	for _, s := range order {
		u = append(u, "tls://"+net.JoinHostPort(s.Host, strconv.Itoa(s.ClientPort)))
	}
	return u
}

// Standby says whether the arbiter on host shares its machine with a server
// that should not lead: it must not hold the lease while one on the witness
// can (deploy/systemd/README.md, section 0).
func (c Cluster) Standby(host string) bool {
	if len(c.LeaderServers) == 0 {
		return false
	}
	for _, s := range c.NATS {
		if s.FanHost == host && !slices.Contains(c.LeaderServers, s.Name) {
			return true
		}
	}
	return false
}

// Defaults fills what the cluster file may leave out (ports, directories,
// the certificates' lifetime, each host's services), as LoadCluster does.
func (c *Cluster) Defaults() { c.defaults() }

// Validate checks a cluster built in code, as LoadCluster checks a file.
func (c Cluster) Validate() error { return c.validate() }
