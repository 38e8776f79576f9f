package bus

import (
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/fanpbx/fan/pkg/platform/config"
)

// Config says how to reach the bus: a NATS cluster (fan-nats, or the stock
// nats-server) at URL. No service runs a server of its own.
type Config struct {
	// URL lists servers, comma separated: nats://n1:4222,nats://n2:4222,
	// in order of preference: a connection goes to the first that answers
	// and, when lost, to the first that has not just failed (on a PBX
	// host: this host's server, then the witness's, then the other's).
	URL string `yaml:"url"`
	// Creds is a JWT credentials file (operator mode); NKeySeed a seed file.
	Creds    string    `yaml:"creds"`
	NKeySeed string    `yaml:"nkey_seed"`
	TLS      TLSConfig `yaml:"tls"`
	// EventsMaxAge bounds how long the audit stream keeps events.
	EventsMaxAge config.Duration `yaml:"events_max_age"`
	// Limits is the disk each stream and bucket may take on every NATS
	// server that holds a replica (oldest discarded first), and how long
	// the live stream keeps live state.
	Limits Limits `yaml:"limits"`
	// Replicas of every stream and bucket: 1 in a lab, 3 on a production cluster.
	Replicas int `yaml:"replicas"`
	// LeaderServers (read by the arbiter only) names, most preferred first,
	// the NATS servers that may lead fan's raft groups; empty leaves leaders
	// wherever the cluster elects them.
	LeaderServers []string `yaml:"leader_servers"`
	// System (arbiter only) reaches the system account, which the meta
	// group's step-down needs; without it the meta leader is left alone.
	System *SystemAccount `yaml:"system"`
	// PingInterval bounds how long a dead server connection goes unnoticed
	// (twice this, as two pings may be outstanding).
	PingInterval config.Duration `yaml:"ping_interval"`
	// InsecureLab lets this client speak to a server that is not on
	// loopback without TLS or without an identity. Only for a throwaway lab:
	// anyone on the path can then read and forge every event and command.
	InsecureLab bool `yaml:"insecure_lab"`
	// ConnectOnce (a command-line tool's, never in a file) returns the first
	// connect error instead of retrying until the context ends: an operator
	// whose server refuses the port learns it at once, not after --timeout.
	ConnectOnce bool `yaml:"-"`
}

// HasIdentity says whether the client presents an identity of its own (an
// nkey, a creds file or a client certificate): a bus that asks for one
// gives each its permissions, and only the admin's may create streams.
func (c Config) HasIdentity() bool {
	return c.NKeySeed != "" || c.Creds != "" || c.TLS.Cert != ""
}

// TLSConfig enables TLS (and mutual TLS when Cert and Key are set).
type TLSConfig struct {
	CA   string `yaml:"ca"`
	Cert string `yaml:"cert"`
	Key  string `yaml:"key"`
}

// Defaults fills unset fields.
func (c *Config) Defaults() {
	if c.EventsMaxAge == 0 {
		c.EventsMaxAge = config.Duration(90 * 24 * time.Hour)
	}
	c.Limits.defaults()
	if c.Replicas == 0 {
		c.Replicas = 1
	}
	if c.PingInterval == 0 {
		c.PingInterval = config.Duration(2 * time.Second)
	}
}

// Validate checks the config, reporting every key that is wrong; key names
// are relative to the bus section.
func (c *Config) Validate() error {
	var errs []error
	if c.URL == "" {
		errs = append(errs, config.Errf("bus.url", "required (the NATS servers, fan-nats or nats-server; a service runs none of its own)"))
	}
	if c.Creds != "" && c.NKeySeed != "" {
		errs = append(errs, config.Errf("bus.creds", "set bus.creds or bus.nkey_seed, not both"))
	}
	if (c.TLS.Cert == "") != (c.TLS.Key == "") {
		errs = append(errs, config.Errf("bus.tls", "cert and key go together"))
	}
	errs = append(errs, c.validateLeaders())
	if c.Replicas < 0 || c.Replicas > 5 {
		errs = append(errs, config.Errf("bus.replicas", "must be 1..5, got %d", c.Replicas))
	}
	errs = append(errs, c.validateBounds(), c.Limits.validate())
	// The URLs must parse before their hosts can be judged.
	if urlsErr := c.validateURLs(); urlsErr != nil {
		errs = append(errs, urlsErr)
	} else {
		errs = append(errs, c.checkSecure())
	}
	return config.Join(errs...)
}

// Bounds of the bus keys (README "bus" table). A negative max age made
// provisioning retry forever; a ping interval below 100 ms turns a busy
// link into a disconnect storm, above 1m a dead server goes unnoticed.
const (
	MinEventsMaxAge = time.Hour
	MaxEventsMaxAge = 10 * 365 * 24 * time.Hour
	MinPingInterval = 100 * time.Millisecond
	MaxPingInterval = time.Minute
	// MaxServers bounds bus.url's list (and fan-nats's cluster.routes).
	MaxServers = 16
)

func (c *Config) validateBounds() error {
	urls := strings.Split(c.URL, ",")
	if c.URL == "" {
		urls = nil
	}
	return config.Join(
		config.DurationOrZero("bus.events_max_age", c.EventsMaxAge.D(), MinEventsMaxAge, MaxEventsMaxAge),
		config.DurationOrZero("bus.ping_interval", c.PingInterval.D(), MinPingInterval, MaxPingInterval),
		config.CountIn("bus.url", len(urls), 0, MaxServers),
		config.CountIn("bus.leader_servers", len(c.LeaderServers), 0, MaxServers),
	)
}

// validateURLs checks each server of bus.url.
func (c *Config) validateURLs() error {
	if c.URL == "" {
		return nil
	}
	var errs []error
	for i, u := range strings.Split(c.URL, ",") {
		if _, err := serverURL(strings.TrimSpace(u)); err != nil {
			errs = append(errs, config.Errf(fmt.Sprintf("bus.url[%d]", i), "%v", err))
		}
	}
	return config.Join(errs...)
}

// serverURL accepts what nats.go dials: host:port or scheme://host[:port].
func serverURL(r string) (*url.URL, error) {
	if !strings.Contains(r, "://") {
		r = "nats://" + r
	}
	u, err := url.Parse(r)
	if err != nil {
		return nil, err
	}
	if u.Hostname() == "" {
		return nil, fmt.Errorf("server %q: no host", redact(r))
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.ParseUint(p, 10, 16); err != nil || n == 0 {
			return nil, fmt.Errorf("server %q: port must be 1..65535", redact(r))
		}
	}
	return u, nil
}
