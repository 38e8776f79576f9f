package ipexec

import (
	"fmt"
	"net/netip"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/config"
	"github.com/fanpbx/fan/pkg/platform/daemon"
	"github.com/fanpbx/fan/services/ipmover/internal/allow"
	"github.com/fanpbx/fan/services/ipmover/internal/announce"
	"github.com/fanpbx/fan/services/ipmover/internal/busloss"
	"github.com/fanpbx/fan/services/ipmover/internal/gateway"
)

// Config is the IP executor's configuration (executor: ip, the default):
// the keys of the ipmover's file that belong to it, and no other.
type Config struct {
	daemon.Common `yaml:",inline"`
	// Groups are the only groups this node may ever hold, and the ranges
	// their addresses must lie in. A command or a state-bucket entry for
	// anything else is refused: the bus can be written by others, this
	// file cannot.
	Groups []GroupConfig `yaml:"groups"`
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
	Verify          VerifyConfig    `yaml:"verify"`
	Announce        AnnounceConfig  `yaml:"announce"`
	Claim           ClaimConfig     `yaml:"claim"`
	Conflict        ConflictConfig  `yaml:"conflict"`
	BusLoss         BusLossConfig   `yaml:"bus_loss"`
	Gateway         GatewayConfig   `yaml:"gateway"`
	Calls           CallsConfig     `yaml:"calls"`
}

// GroupConfig is one group the node may hold.
type GroupConfig struct {
	Name string `yaml:"name"`
	// Prefixes are the ranges the group's addresses lie in: an address
	// must be inside one and have a prefix length no shorter than its
	// (198.51.100.10/32 allows exactly 198.51.100.10/32; 198.51.100.0/24
	// allows any 198.51.100.x/24 to /32).
	Prefixes []string `yaml:"prefixes"`
}

// allowList builds the groups' allow-list.
func (c *Config) allowList() (*allow.List, error) {
	groups := make([]allow.Group, 0, len(c.Groups))
	for i, g := range c.Groups {
		ag := allow.Group{Name: g.Name}
		for _, p := range g.Prefixes {
			pp, err := netip.ParsePrefix(p)
			if err != nil {
				return nil, config.Errf(fmt.Sprintf("groups[%d].prefixes", i), "%v", err)
			}
			ag.Prefixes = append(ag.Prefixes, pp)
		}
		groups = append(groups, ag)
	}
	l, err := allow.New(groups)
	if err != nil {
		return nil, &config.FieldError{Key: "groups", Err: err}
	}
	return l, nil
}

// AnswerConfig says how this node's PBX is made to answer on a claimed address.
type AnswerConfig struct {
	// Mode: hot (ip_nonlocal_bind, already bound), reload (AMI Reload of
	// Modules) or restart (systemctl restart Unit).
	Mode    events.AnswerMode `yaml:"mode"`
	Modules []string          `yaml:"modules"`
	// Unit and Systemctl are for restart mode.
	Unit      string `yaml:"unit"`
	Systemctl string `yaml:"systemctl"`
	// Timeout bounds the whole answer step.
	Timeout config.Duration `yaml:"timeout"`
}

// AMIConfig reaches the local Asterisk manager interface.
type AMIConfig struct {
	Address  string `yaml:"address"`
	Username string `yaml:"username"`
	Secret   string `yaml:"secret"`
}

// VerifyConfig is the SIP OPTIONS check that ends a claim.
type VerifyConfig struct {
	// Enabled defaults to true: a claim is reported done only once the
	// PBX answers on the floating address.
	Enabled *bool `yaml:"enabled"`
	Port    int   `yaml:"port"`
	// Timeout bounds the whole verification; Every bounds one OPTIONS.
	Timeout config.Duration `yaml:"timeout"`
	Every   config.Duration `yaml:"every"`
}

// On reports whether verification is enabled.
func (v VerifyConfig) On() bool { return v.Enabled == nil || *v.Enabled }

// ClaimConfig tunes claiming.
type ClaimConfig struct {
	// ProbeWait is how long an ARP probe waits for another holder to
	// answer before a claim whose previous holder is not fenced; 0 means
	// the default, a negative value disables probing.
	ProbeWait config.Duration `yaml:"probe_wait"`
	// ReleaseWait bounds the wait for the releases a claim names (nodes
	// still on the bus letting go in the same decision) before the address
	// is taken; past it the claim goes ahead as the arbiter fenced it.
	// 0 means the default, a negative value disables the wait.
	ReleaseWait config.Duration `yaml:"release_wait"`
}

// ConflictConfig tunes conflict detection while holding.
type ConflictConfig struct {
	// Watch defaults to true.
	Watch          *bool           `yaml:"watch"`
	ConfirmTimeout config.Duration `yaml:"confirm_timeout"`
	MinInterval    config.Duration `yaml:"min_interval"`
}

// BusLossConfig is the policy while the bus is unreachable.
type BusLossConfig struct {
	Policy       busloss.Policy  `yaml:"policy"`
	ReleaseAfter config.Duration `yaml:"release_after"`
	CheckEvery   config.Duration `yaml:"check_every"`
	// HeartbeatInterval and ArbiterSilentAfter are the prober's heartbeat
	// period and the arbiter's silent_after: the release lease is checked
	// against them at start.
	HeartbeatInterval  config.Duration `yaml:"heartbeat_interval"`
	ArbiterSilentAfter config.Duration `yaml:"arbiter_silent_after"`
}

// GatewayConfig is the optional LAN-gateway role.
type GatewayConfig struct {
	Sysctls map[string]string `yaml:"sysctls"`
	Routes  []RouteConfig     `yaml:"routes"`
}

// RouteConfig is one route installed while holding.
type RouteConfig struct {
	To     string `yaml:"to"`
	Via    string `yaml:"via"`
	Dev    string `yaml:"dev"`
	Src    string `yaml:"src"`
	Metric int    `yaml:"metric"`
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

// DefaultProbeWait keeps the probe before an unfenced claim short: a live
// holder on the same LAN answers in well under a millisecond, and the wait
// is paid in full by every unfenced claim (a failover's claim names its
// previous holder fenced and skips it).
const DefaultProbeWait = 100 * time.Millisecond

// DefaultReleaseWait is how long a claim waits for the releases sent with
// it: a live node releases and reports in a few milliseconds; waiting
// longer only delays phones when its executor is dead.
const DefaultReleaseWait = 300 * time.Millisecond

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

func (g GatewayConfig) build() (gateway.Config, error) {
	out := gateway.Config{Sysctls: g.Sysctls}
	var errs []error
	for i, r := range g.Routes {
		key := fmt.Sprintf("gateway.routes[%d]", i)
		to, err := netip.ParsePrefix(r.To)
		if err != nil {
			errs = append(errs, config.Errf(key+".to", "%v", err))
		}
		gr := gateway.Route{To: to, Dev: r.Dev, Metric: r.Metric}
		if r.Via != "" {
			if gr.Via, err = netip.ParseAddr(r.Via); err != nil {
				errs = append(errs, config.Errf(key+".via", "%v", err))
			}
		}
		if r.Src != "" {
			if gr.Src, err = netip.ParseAddr(r.Src); err != nil {
				errs = append(errs, config.Errf(key+".src", "%v", err))
			}
		}
		out.Routes = append(out.Routes, gr)
	}
	return out, config.Join(errs...)
}

// Validate checks the file after loading and fills defaults, reporting
// every key that is wrong.
func (c *Config) Validate() error {
	errs := []error{c.Common.Validate(), c.validateBounds()}
	if c.Interface == "" {
		errs = append(errs, config.Errf("interface", "required"))
	}
	if len(c.Groups) == 0 {
		errs = append(errs, config.Errf("groups", "required: the groups this node may hold and their address ranges (see README, upgrading)"))
	} else if _, err := c.allowList(); err != nil {
		errs = append(errs, err)
	}
	if c.StateFile == "" {
		errs = append(errs, config.Errf("state_file", "required (it keeps commands at most once across restarts)"))
	}
	def := func(d *config.Duration, v time.Duration) {
		if *d == 0 {
			*d = config.Duration(v)
		}
	}
	def(&c.ReconcilePeriod, 2*time.Second)
	def(&c.Answer.Timeout, 5*time.Second)
	def(&c.Verify.Timeout, 3*time.Second)
	def(&c.Verify.Every, 200*time.Millisecond)
	def(&c.Claim.ProbeWait, DefaultProbeWait)
	def(&c.Claim.ReleaseWait, DefaultReleaseWait)
	def(&c.Conflict.ConfirmTimeout, time.Second)
	def(&c.Conflict.MinInterval, time.Second)
	def(&c.BusLoss.ReleaseAfter, busloss.DefaultReleaseAfter)
	def(&c.BusLoss.CheckEvery, busloss.DefaultCheckEvery)
	def(&c.BusLoss.HeartbeatInterval, busloss.DefaultHeartbeat)
	def(&c.BusLoss.ArbiterSilentAfter, busloss.DefaultSilentAfter)
	if c.Verify.Port == 0 {
		c.Verify.Port = 5060 // any other value out of 1..65535 is out of the bounds
	}
	if c.Answer.Mode == "" {
		c.Answer.Mode = events.AnswerHot
	}
	switch c.Answer.Mode {
	case events.AnswerHot:
	case events.AnswerReload:
		if len(c.Answer.Modules) == 0 {
			c.Answer.Modules = []string{"res_pjsip.so"}
		}
		if c.AMI.Address == "" || c.AMI.Username == "" || c.AMI.Secret == "" {
			errs = append(errs, config.Errf("ami", "answer mode reload needs ami.address, ami.username and ami.secret"))
		}
	case events.AnswerRestart:
		if c.Answer.Unit == "" {
			c.Answer.Unit = "asterisk.service"
		}
	default:
		errs = append(errs, config.Errf("answer.mode", "unknown mode %q (hot, reload, restart)", c.Answer.Mode))
	}
	switch c.BusLoss.Policy {
	case "":
		c.BusLoss.Policy = busloss.Hold
	case busloss.Hold:
	case busloss.Release:
		if err := busloss.ValidateLease(c.BusLoss.ReleaseAfter.D(), c.BusLoss.CheckEvery.D(),
			c.BusLoss.HeartbeatInterval.D(), c.BusLoss.ArbiterSilentAfter.D()); err != nil {
			errs = append(errs, &config.FieldError{Key: "bus_loss.release_after", Err: err})
		}
	default:
		errs = append(errs, config.Errf("bus_loss.policy", "unknown policy %q (hold, release)", c.BusLoss.Policy))
	}
	if _, err := c.Gateway.build(); err != nil {
		errs = append(errs, err)
	}
	if err := c.Announce.schedule().Validate(); err != nil {
		errs = append(errs, &config.FieldError{Key: "announce", Err: err})
	}
	return config.Join(errs...)
}

// CheckHost checks what the file names on this host (config.HostChecker):
// the bus's files and http_listen (daemon.Common), the directory the state
// file is written in (the unit's StateDirectory, the package's
// tmpfiles.d), and the interface, which must exist here: an "eth0" copied
// from another host would otherwise fail the first claim, at a failover.
func (c *Config) CheckHost() error {
	return config.Join(c.Common.CheckHost(),
		config.ParentDirExists("state_file", c.StateFile),
		config.InterfaceExists("interface", c.Interface))
}
