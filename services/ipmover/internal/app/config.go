package app

import (
	"fmt"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/config"
	"github.com/fanpbx/fan/pkg/platform/daemon"
	"github.com/fanpbx/fan/services/ipmover/internal/announce"
)

// Config is the ipmover's configuration file.
type Config struct {
	daemon.Common `yaml:",inline"`
	// Interface carries the floating addresses (the LAN the phones are on).
	Interface string `yaml:"interface"`
	// StateFile persists the highest epoch seen and the applied command ids,
	// so a restart never re-applies an old command.
	StateFile string `yaml:"state_file"`
	// ReconcilePeriod bounds how long a vanished address goes unnoticed if
	// a netlink notification is lost.
	ReconcilePeriod config.Duration `yaml:"reconcile_period"`
	Answer          AnswerConfig    `yaml:"answer"`
	AMI             AMIConfig       `yaml:"ami"`
	Announce        AnnounceConfig  `yaml:"announce"`
}

// AnswerConfig says how this node's PBX is made to answer on a claimed address.
type AnswerConfig struct {
	// Mode: hot (already bound via ip_nonlocal_bind), reload (AMI Reload of
	// Modules) or restart.
	Mode    events.AnswerMode `yaml:"mode"`
	Modules []string          `yaml:"modules"`
	// Timeout bounds the whole answer step.
	Timeout config.Duration `yaml:"timeout"`
}

// AMIConfig reaches the local Asterisk manager interface.
type AMIConfig struct {
	Address  string `yaml:"address"`
	Username string `yaml:"username"`
	Secret   string `yaml:"secret"`
}

// AnnounceConfig is the gratuitous ARP / unsolicited NA schedule.
type AnnounceConfig struct {
	FirstCount     int             `yaml:"first_count"`
	FirstInterval  config.Duration `yaml:"first_interval"`
	SecondDelay    config.Duration `yaml:"second_delay"`
	SecondCount    int             `yaml:"second_count"`
	SecondInterval config.Duration `yaml:"second_interval"`
	Refresh        config.Duration `yaml:"refresh"`
}

// schedule merges the configured values over the defaults.
func (a AnnounceConfig) schedule() announce.Config {
	c := announce.DefaultConfig()
	if a.FirstCount > 0 {
		c.FirstCount = a.FirstCount
	}
	if a.FirstInterval > 0 {
		c.FirstInterval = a.FirstInterval.D()
	}
	if a.SecondDelay > 0 {
		c.SecondDelay = a.SecondDelay.D()
	}
	if a.SecondCount > 0 {
		c.SecondCount = a.SecondCount
	}
	if a.SecondInterval > 0 {
		c.SecondInterval = a.SecondInterval.D()
	}
	if a.Refresh > 0 {
		c.Refresh = a.Refresh.D()
	}
	return c
}

// Validate checks the file after loading and fills defaults.
func (c *Config) Validate() error {
	if err := c.Common.Validate(); err != nil {
		return err
	}
	if c.Interface == "" {
		return config.Errf("interface", "required")
	}
	if c.StateFile == "" {
		return config.Errf("state_file", "required (it keeps commands at most once across restarts)")
	}
	if c.ReconcilePeriod == 0 {
		c.ReconcilePeriod = config.Duration(2 * time.Second)
	}
	if c.Answer.Mode == "" {
		c.Answer.Mode = events.AnswerHot
	}
	if c.Answer.Timeout == 0 {
		c.Answer.Timeout = config.Duration(5 * time.Second)
	}
	switch c.Answer.Mode {
	case events.AnswerHot:
	case events.AnswerReload:
		if len(c.Answer.Modules) == 0 {
			c.Answer.Modules = []string{"res_pjsip.so"}
		}
		if c.AMI.Address == "" || c.AMI.Username == "" || c.AMI.Secret == "" {
			return config.Errf("ami", "answer mode reload needs ami.address, ami.username and ami.secret")
		}
	case events.AnswerRestart:
		return config.Errf("answer.mode", "restart is not supported yet; use hot or reload")
	default:
		return config.Errf("answer.mode", "unknown mode %q (hot, reload)", c.Answer.Mode)
	}
	if err := c.Announce.schedule().Validate(); err != nil {
		return &config.FieldError{Key: "announce", Err: fmt.Errorf("%w", err)}
	}
	return nil
}
