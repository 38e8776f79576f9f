package app

import (
	"fmt"
	"net/netip"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/config"
	"github.com/fanpbx/fan/pkg/platform/daemon"
)

// Config is the arbiter's configuration file.
type Config struct {
	daemon.Common `yaml:",inline"`
	// LeaseTTL is the leadership lease (whole seconds). A dead leader is
	// replaced after about this long; commands are fenced by it.
	LeaseTTL config.Duration `yaml:"lease_ttl"`
	Groups   []GroupConfig   `yaml:"groups"`
	Policy   PolicyConfig    `yaml:"policy"`
}

// GroupConfig is one set of floating addresses.
type GroupConfig struct {
	Name      string   `yaml:"name"`
	Addresses []string `yaml:"addresses"`
	// Nodes in priority order: the first is preferred.
	Nodes []string `yaml:"nodes"`
	// HealthCheck is the prober check whose health on a node (as its own
	// prober reports it) makes the node eligible to hold the group.
	HealthCheck string `yaml:"health_check"`
	// PeerChecks are the peer-role checks that count as evidence about a
	// holder that went silent on the bus (default: all of them).
	PeerChecks []string `yaml:"peer_checks"`
}

// PolicyConfig tunes timing; zero values take the decision core's defaults.
type PolicyConfig struct {
	SilentAfter  config.Duration `yaml:"silent_after"`
	ClaimTimeout config.Duration `yaml:"claim_timeout"`
	CommandTTL   config.Duration `yaml:"command_ttl"`
	HoldDown     config.Duration `yaml:"hold_down"`
	RetryBackoff config.Duration `yaml:"retry_backoff"`
	SettleAfter  config.Duration `yaml:"settle_after"`
}

// Validate checks the file after loading and fills defaults.
func (c *Config) Validate() error {
	if err := c.Common.Validate(); err != nil {
		return err
	}
	if c.LeaseTTL == 0 {
		c.LeaseTTL = config.Duration(3 * time.Second)
	}
	if d := c.LeaseTTL.D(); d < time.Second || d%time.Second != 0 {
		return config.Errf("lease_ttl", "must be whole seconds, at least 1s (the server's TTL granularity), got %v", d)
	}
	if len(c.Groups) == 0 {
		return config.Errf("groups", "at least one group is required")
	}
	seen := map[string]bool{}
	for i, g := range c.Groups {
		key := func(k string) string { return fmt.Sprintf("groups[%d].%s", i, k) }
		if err := events.ValidToken("name", g.Name); err != nil {
			return &config.FieldError{Key: key("name"), Err: err}
		}
		if seen[g.Name] {
			return config.Errf(key("name"), "duplicate group %q", g.Name)
		}
		seen[g.Name] = true
		if len(g.Addresses) == 0 {
			return config.Errf(key("addresses"), "at least one address is required")
		}
		for _, a := range g.Addresses {
			if _, err := netip.ParsePrefix(a); err != nil {
				return config.Errf(key("addresses"), "%q is not an address with a prefix length (198.51.100.10/24): %v", a, err)
			}
		}
		if len(g.Nodes) == 0 {
			return config.Errf(key("nodes"), "at least one node is required")
		}
		for _, n := range g.Nodes {
			if err := events.ValidToken("node", n); err != nil {
				return &config.FieldError{Key: key("nodes"), Err: err}
			}
		}
		if g.HealthCheck == "" {
			return config.Errf(key("health_check"), "required")
		}
	}
	return nil
}
