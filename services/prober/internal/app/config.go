package app

import (
	"fmt"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/config"
	"github.com/fanpbx/fan/pkg/platform/daemon"
)

// Config is the prober's configuration file.
type Config struct {
	daemon.Common `yaml:",inline"`
	// HeartbeatInterval is how often the node's heartbeat (telemetry and
	// every check's current state) is published.
	HeartbeatInterval config.Duration `yaml:"heartbeat_interval"`
	// ResultsEvery rate-limits raw results: a result is published when it
	// differs from the previous one, or when this long has passed.
	ResultsEvery config.Duration `yaml:"results_every"`
	Checks       []CheckConfig   `yaml:"checks"`
}

// CheckConfig is one check.
type CheckConfig struct {
	Name string `yaml:"name"`
	Kind string `yaml:"kind"`
	// Role says whose PBX this is: self (this node's), peer (another
	// node's, through its node address) or vip (the floating IP).
	Role events.Role `yaml:"role"`
	// TargetNode is the node whose health this check measures; for role
	// self it defaults to this node.
	TargetNode string          `yaml:"target_node"`
	Address    string          `yaml:"address"`
	Username   string          `yaml:"username"`
	Secret     string          `yaml:"secret"`
	Interval   config.Duration `yaml:"interval"`
	Timeout    config.Duration `yaml:"timeout"`
	Rise       int             `yaml:"rise"`
	Fall       int             `yaml:"fall"`
	// Jitter delays each run by up to this much, so many checks started
	// together do not fire in lockstep.
	Jitter config.Duration `yaml:"jitter"`
}

var knownKinds = map[string]bool{"ami": true}

// Validate checks the file after loading and fills defaults.
func (c *Config) Validate() error {
	if err := c.Common.Validate(); err != nil {
		return err
	}
	if c.HeartbeatInterval == 0 {
		c.HeartbeatInterval = config.Duration(2 * time.Second)
	}
	if c.ResultsEvery == 0 {
		c.ResultsEvery = config.Duration(10 * time.Second)
	}
	if len(c.Checks) == 0 {
		return config.Errf("checks", "at least one check is required")
	}
	seen := map[string]bool{}
	for i := range c.Checks {
		ch := &c.Checks[i]
		key := func(k string) string { return fmt.Sprintf("checks[%d].%s", i, k) }
		if err := events.ValidToken("name", ch.Name); err != nil {
			return &config.FieldError{Key: key("name"), Err: err}
		}
		if seen[ch.Name] {
			return config.Errf(key("name"), "duplicate check name %q", ch.Name)
		}
		seen[ch.Name] = true
		if !knownKinds[ch.Kind] {
			return config.Errf(key("kind"), "unknown kind %q", ch.Kind)
		}
		if ch.Role == "" {
			ch.Role = events.RoleSelf
		}
		switch ch.Role {
		case events.RoleSelf:
			if ch.TargetNode == "" {
				ch.TargetNode = c.Node
			}
		case events.RolePeer, events.RoleVIP:
			if ch.TargetNode == "" {
				return config.Errf(key("target_node"), "required for role %s", ch.Role)
			}
		default:
			return config.Errf(key("role"), "unknown role %q (self, peer or vip)", ch.Role)
		}
		if err := events.ValidToken("target_node", ch.TargetNode); err != nil {
			return &config.FieldError{Key: key("target_node"), Err: err}
		}
		if ch.Address == "" {
			return config.Errf(key("address"), "required")
		}
		if ch.Kind == "ami" && (ch.Username == "" || ch.Secret == "") {
			return config.Errf(key("username"), "ami checks need username and secret")
		}
		if ch.Interval <= 0 {
			return config.Errf(key("interval"), "required and positive")
		}
		if ch.Timeout <= 0 || ch.Timeout >= ch.Interval {
			return config.Errf(key("timeout"), "must be positive and below interval %v, got %v", ch.Interval, ch.Timeout)
		}
		if ch.Rise < 1 {
			return config.Errf(key("rise"), "must be at least 1, got %d", ch.Rise)
		}
		if ch.Fall < 1 {
			return config.Errf(key("fall"), "must be at least 1, got %d", ch.Fall)
		}
		if ch.Jitter < 0 || ch.Jitter >= ch.Interval-ch.Timeout {
			return config.Errf(key("jitter"), "must be below interval - timeout (%v)", ch.Interval-ch.Timeout)
		}
	}
	return nil
}
