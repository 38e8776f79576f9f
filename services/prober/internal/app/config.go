package app

import (
	"fmt"
	"maps"
	"net/netip"
	"net/url"
	"regexp"
	"slices"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/config"
	"github.com/fanpbx/fan/pkg/platform/daemon"
	"github.com/fanpbx/fan/services/prober/internal/check"
)

// Config is the prober's configuration file.
type Config struct {
	daemon.Common `yaml:",inline"`
	// HeartbeatInterval is how often the node's heartbeat (telemetry and
	// every check's current state) is published.
	HeartbeatInterval config.Duration `yaml:"heartbeat_interval"`
	// PresenceInterval is how often a presence beacon goes out on core
	// NATS (never stored). The arbiter counts this node silent after a few
	// missed beacons, so this bounds how fast a crashed node or a cut link
	// is noticed.
	PresenceInterval config.Duration `yaml:"presence_interval"`
	// ResultsEvery rate-limits raw results: a result is published when it
	// differs from the previous one, or when this long has passed.
	ResultsEvery config.Duration `yaml:"results_every"`
	Checks       []CheckConfig   `yaml:"checks"`
	// Groups are quorums over checks: each is published as a health
	// transition of its own, with the group's name as the check.
	Groups []GroupConfig `yaml:"groups"`
}

// GroupConfig is a quorum: up while at least MinUp of Checks are up.
type GroupConfig struct {
	Name       string      `yaml:"name"`
	MinUp      int         `yaml:"min_up"`
	Checks     []string    `yaml:"checks"`
	Role       events.Role `yaml:"role"`
	TargetNode string      `yaml:"target_node"`
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
	// DecisiveMargin (peer checks only): once fall-1 runs in a row failed,
	// the next one, which decides, waits only as long as the target's
	// answers have been taking (health.RoundTrips: the smoothed round trip
	// plus four deviations or this margin, whichever is more), at most
	// Timeout. It puts a peer's verdict on a dead target fall intervals
	// plus a margin after its last answer, not fall-1 intervals plus a
	// whole timeout after its first miss. Negative turns it off.
	DecisiveMargin config.Duration `yaml:"decisive_margin"`

	// ami: LoginTimeout bounds a login, which runs apart from the probes.
	LoginTimeout config.Duration `yaml:"login_timeout"`
	// sip: Transport is udp or tcp; Retransmit is the first UDP
	// retransmission interval (RFC 3261 T1, doubling).
	Transport  string          `yaml:"transport"`
	Retransmit config.Duration `yaml:"retransmit"`
	// sip, http: Codes are the healthy status codes ("2xx", "401", "200-399").
	Codes []string `yaml:"codes"`
	// http: Body is a regular expression the body must match.
	Body               string `yaml:"body"`
	InsecureSkipVerify bool   `yaml:"insecure_skip_verify"`
	// dns: Query is the name asked, QueryType its type, Recursion sets RD.
	Query     string `yaml:"query"`
	QueryType string `yaml:"query_type"`
	Recursion bool   `yaml:"recursion"`
	// icmp: ICMPMode is auto, raw or unprivileged.
	ICMPMode string `yaml:"icmp_mode"`
	// exec: Command is the argv run; exit status 0 is healthy.
	Command []string `yaml:"command"`
	// exec: SecretArgs marks arguments that must never be shown: an index
	// into command (1 is the first argument) or a prefix ("--password="
	// hides what follows it; an argument equal to the prefix hides the
	// next one). See README "Secrets".
	SecretArgs []string `yaml:"secret_args"`

	codes check.Codes
	body  *regexp.Regexp
}

var knownKinds = map[string]bool{"ami": true, "sip": true, "tcp": true, "http": true, "dns": true, "icmp": true, "exec": true}

// kindKeys says which kind each kind-specific key belongs to, so a key set
// on the wrong kind is an error rather than silently ignored.
func (ch *CheckConfig) kindKeys() map[string]bool {
	return map[string]bool{
		"username":             ch.Username == "" || ch.Kind == "ami",
		"secret":               ch.Secret == "" || ch.Kind == "ami",
		"login_timeout":        ch.LoginTimeout == 0 || ch.Kind == "ami",
		"transport":            ch.Transport == "" || ch.Kind == "sip",
		"retransmit":           ch.Retransmit == 0 || ch.Kind == "sip",
		"codes":                len(ch.Codes) == 0 || ch.Kind == "sip" || ch.Kind == "http",
		"body":                 ch.Body == "" || ch.Kind == "http",
		"insecure_skip_verify": !ch.InsecureSkipVerify || ch.Kind == "http",
		"query":                ch.Query == "" || ch.Kind == "dns",
		"query_type":           ch.QueryType == "" || ch.Kind == "dns",
		"recursion":            !ch.Recursion || ch.Kind == "dns",
		"icmp_mode":            ch.ICMPMode == "" || ch.Kind == "icmp",
		"command":              len(ch.Command) == 0 || ch.Kind == "exec",
		"secret_args":          len(ch.SecretArgs) == 0 || ch.Kind == "exec",
	}
}

// Bounds of the check keys (README "Configuration").
const (
	maxChecks        = 256
	minCheckInterval = 10 * time.Millisecond
	maxCheckInterval = time.Hour
)

// Validate checks the file after loading and fills defaults. Every key that
// is wrong is reported; a check whose kind is unknown is not checked
// further for what that kind needs.
func (c *Config) Validate() error {
	errs := []error{c.Common.Validate()}
	if c.HeartbeatInterval == 0 {
		c.HeartbeatInterval = config.Duration(2 * time.Second)
	}
	if c.PresenceInterval == 0 {
		c.PresenceInterval = config.Duration(100 * time.Millisecond)
	}
	if c.ResultsEvery == 0 {
		c.ResultsEvery = config.Duration(10 * time.Second)
	}
	// A zero or negative heartbeat interval panicked in time.NewTicker; the
	// upper bounds are what events.NodeHeartbeat and the presence beacon
	// accept, so the arbiter never refuses a well-configured prober.
	errs = append(errs,
		config.DurationIn("heartbeat_interval", c.HeartbeatInterval.D(), events.MinHeartbeatInterval, time.Minute),
		config.DurationIn("presence_interval", c.PresenceInterval.D(), events.MinBeaconInterval, events.MaxBeaconInterval),
		config.DurationIn("results_every", c.ResultsEvery.D(), time.Second, time.Hour),
		config.CountIn("checks", len(c.Checks), 1, maxChecks),
		config.CountIn("groups", len(c.Groups), 0, maxChecks),
	)
	seen := map[string]bool{}
	for i := range c.Checks {
		errs = append(errs, c.validateCheck(i, seen))
	}
	errs = append(errs, c.validateGroups(seen))
	return config.Join(errs...)
}

// validateCheck checks one check and fills its defaults.
func (c *Config) validateCheck(i int, seen map[string]bool) error {
	ch := &c.Checks[i]
	key := func(k string) string { return fmt.Sprintf("checks[%d].%s", i, k) }
	var errs []error
	if err := events.ValidToken("name", ch.Name); err != nil {
		errs = append(errs, &config.FieldError{Key: key("name"), Err: err})
	} else if seen[ch.Name] {
		errs = append(errs, config.Errf(key("name"), "duplicate check name %q", ch.Name))
	}
	seen[ch.Name] = true
	errs = append(errs, c.resolveTarget(&ch.Role, &ch.TargetNode, key))
	intervalErr := config.DurationIn(key("interval"), ch.Interval.D(), minCheckInterval, maxCheckInterval)
	errs = append(errs, intervalErr)
	// timeout, jitter and decisive_margin are measured against interval
	// and timeout: with either wrong, they cannot be judged.
	timed := intervalErr == nil && ch.Timeout > 0 && ch.Timeout < ch.Interval
	if intervalErr == nil && !timed {
		errs = append(errs, config.Errf(key("timeout"), "must be positive and below interval %v, got %v", ch.Interval, ch.Timeout))
	}
	errs = append(errs,
		config.IntIn(key("rise"), ch.Rise, 1, events.MaxRiseFall),
		config.IntIn(key("fall"), ch.Fall, 1, events.MaxRiseFall),
	)
	if timed {
		if ch.Jitter < 0 || ch.Jitter >= ch.Interval-ch.Timeout {
			errs = append(errs, config.Errf(key("jitter"), "must be below interval - timeout (%v)", ch.Interval-ch.Timeout))
		}
		errs = append(errs, ch.validateDecisiveMargin(key))
	}
	if !knownKinds[ch.Kind] {
		return config.Join(append(errs, config.Errf(key("kind"), "unknown kind %q", ch.Kind))...)
	}
	kindKeys := ch.kindKeys()
	for _, k := range slices.Sorted(maps.Keys(kindKeys)) {
		if !kindKeys[k] {
			errs = append(errs, config.Errf(key(k), "does not apply to kind %s", ch.Kind))
		}
	}
	errs = append(errs, ch.validateKind(key, timed))
	if ch.Kind == "sip" && ch.Retransmit == 0 && timed {
		// RFC 3261's 500 ms T1 would never fire inside a 150 ms probe:
		// retransmit at least twice within the timeout.
		ch.Retransmit = config.Duration(min(500*time.Millisecond, ch.Timeout.D()/3))
	}
	return config.Join(errs...)
}

// DefaultDecisiveMargin is a peer check's decisive_margin: a LAN answers in
// well under a millisecond, so this is nearly all margin, and the estimate
// grows past it as soon as answers slow down or spread.
const DefaultDecisiveMargin = 20 * time.Millisecond

// validateDecisiveMargin fills and checks decisive_margin. Only a peer's
// verdict may be hurried: it moves nothing unless the holder is also silent
// on the bus, where a self check's verdict moves the address by itself.
func (ch *CheckConfig) validateDecisiveMargin(key func(string) string) error {
	switch {
	case ch.Role != events.RolePeer:
		if ch.DecisiveMargin != 0 {
			return config.Errf(key("decisive_margin"), "applies to role peer only, not %s", ch.Role)
		}
	case ch.DecisiveMargin == 0:
		ch.DecisiveMargin = config.Duration(min(DefaultDecisiveMargin, ch.Timeout.D()))
	case ch.DecisiveMargin < 0:
		// off: every run waits timeout
	case ch.DecisiveMargin.D() < time.Millisecond || ch.DecisiveMargin > ch.Timeout:
		return config.Errf(key("decisive_margin"), "must be from 1ms to timeout %v (or negative: off), got %v", ch.Timeout, ch.DecisiveMargin)
	}
	return nil
}

func (c *Config) validateGroups(checks map[string]bool) error {
	var errs []error
	for i := range c.Groups {
		g := &c.Groups[i]
		key := func(k string) string { return fmt.Sprintf("groups[%d].%s", i, k) }
		if err := events.ValidToken("name", g.Name); err != nil {
			errs = append(errs, &config.FieldError{Key: key("name"), Err: err})
		} else if checks[g.Name] {
			errs = append(errs, config.Errf(key("name"), "%q is already the name of a check or group", g.Name))
		}
		checks[g.Name] = true
		if len(g.Checks) == 0 {
			errs = append(errs, config.Errf(key("checks"), "a group needs at least one check"))
		}
		inGroup := map[string]bool{}
		for j, m := range g.Checks {
			switch {
			case !c.hasCheck(m):
				errs = append(errs, config.Errf(fmt.Sprintf("groups[%d].checks[%d]", i, j), "no check named %q", m))
			case inGroup[m]:
				errs = append(errs, config.Errf(fmt.Sprintf("groups[%d].checks[%d]", i, j), "%q listed twice", m))
			}
			inGroup[m] = true
		}
		if len(g.Checks) > 0 && (g.MinUp < 1 || g.MinUp > len(g.Checks)) {
			errs = append(errs, config.Errf(key("min_up"), "must be between 1 and the number of checks (%d), got %d", len(g.Checks), g.MinUp))
		}
		errs = append(errs, c.resolveTarget(&g.Role, &g.TargetNode, key))
	}
	return config.Join(errs...)
}

func (c *Config) hasCheck(name string) bool {
	for _, ch := range c.Checks {
		if ch.Name == name {
			return true
		}
	}
	return false
}

// validateKind checks the keys each kind needs and fills their defaults;
// timed says interval and timeout are valid (retransmit is measured
// against timeout).
func (ch *CheckConfig) validateKind(key func(string) string, timed bool) error {
	hostPort := func() error {
		if ch.Address == "" {
			return config.Errf(key("address"), "required (host:port)")
		}
		return config.HostPort(key("address"), ch.Address, false)
	}
	codes := func(def []string) error {
		if len(ch.Codes) == 0 {
			ch.Codes = def
		}
		if err := config.CountIn(key("codes"), len(ch.Codes), 1, 64); err != nil {
			return err
		}
		cs, err := check.ParseCodes(ch.Codes)
		if err != nil {
			return &config.FieldError{Key: key("codes"), Err: err}
		}
		ch.codes = cs
		return nil
	}
	var errs []error
	switch ch.Kind {
	case "ami":
		errs = append(errs, hostPort())
		if ch.Username == "" {
			errs = append(errs, config.Errf(key("username"), "required: ami checks need username and secret"))
		}
		if ch.Secret == "" {
			errs = append(errs, config.Errf(key("secret"), "required: ami checks need username and secret"))
		}
		if ch.LoginTimeout == 0 {
			ch.LoginTimeout = config.Duration(3 * time.Second)
		}
		// Asterisk answers a wrong secret after sleeping 1 s: a shorter
		// login deadline reports every wrong password as a timeout.
		if d := ch.LoginTimeout.D(); d <= 1500*time.Millisecond || d > time.Minute {
			errs = append(errs, config.Errf(key("login_timeout"), "must be above 1.5s (Asterisk waits 1 s before refusing a login) and at most 1m, got %v", ch.LoginTimeout))
		}
	case "sip":
		if _, err := netip.ParseAddrPort(ch.Address); err != nil {
			errs = append(errs, config.Errf(key("address"), "want ip:port: %v", err))
		}
		switch ch.Transport {
		case "":
			ch.Transport = "udp"
		case "udp", "tcp":
		default:
			errs = append(errs, config.Errf(key("transport"), "want udp or tcp, got %q", ch.Transport))
		}
		if ch.Retransmit < 0 || timed && ch.Retransmit >= ch.Timeout {
			errs = append(errs, config.Errf(key("retransmit"), "must be 0 (default: timeout/3, at most 500ms) or below timeout %v, got %v", ch.Timeout, ch.Retransmit))
		}
		errs = append(errs, codes(check.DefaultSIPCodes))
	case "tcp":
		errs = append(errs, hostPort())
	case "http":
		u, err := url.Parse(ch.Address)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			errs = append(errs, config.Errf(key("address"), "want an http:// or https:// URL, got %q", ch.Address))
		}
		switch {
		case len(ch.Body) > 4096:
			errs = append(errs, config.Errf(key("body"), "at most 4096 bytes, got %d", len(ch.Body)))
		case ch.Body != "":
			re, err := regexp.Compile(ch.Body)
			if err != nil {
				errs = append(errs, &config.FieldError{Key: key("body"), Err: err})
			} else {
				ch.body = re
			}
		}
		errs = append(errs, codes([]string{"2xx"}))
	case "dns":
		errs = append(errs, hostPort())
		if ch.Query == "" || len(ch.Query) > 255 {
			errs = append(errs, config.Errf(key("query"), "required, at most 255 bytes (the name to ask, e.g. the zone for its SOA)"))
		}
		if ch.QueryType == "" {
			ch.QueryType = "SOA"
		}
		if _, ok := check.DNSTypes[ch.QueryType]; !ok {
			errs = append(errs, config.Errf(key("query_type"), "unknown type %q", ch.QueryType))
		}
	case "icmp":
		if _, err := netip.ParseAddr(ch.Address); err != nil {
			errs = append(errs, config.Errf(key("address"), "want an IP address: %v", err))
		}
		switch ch.ICMPMode {
		case "":
			ch.ICMPMode = check.ICMPAuto
		case check.ICMPAuto, check.ICMPRaw, check.ICMPUnprivileged:
		default:
			errs = append(errs, config.Errf(key("icmp_mode"), "want auto, raw or unprivileged, got %q", ch.ICMPMode))
		}
	case "exec":
		if len(ch.Command) == 0 || ch.Command[0] == "" {
			errs = append(errs, config.Errf(key("command"), "required (the argv to run)"))
		}
		countErrs := config.Join(
			config.CountIn(key("command"), len(ch.Command), 0, 256),
			config.CountIn(key("secret_args"), len(ch.SecretArgs), 0, 64),
		)
		errs = append(errs, countErrs)
		if countErrs == nil {
			if err := check.ValidateSecretArgs(ch.SecretArgs, len(ch.Command)); err != nil {
				errs = append(errs, &config.FieldError{Key: key("secret_args"), Err: err})
			}
		}
		if ch.Address != "" {
			errs = append(errs, config.Errf(key("address"), "does not apply to kind exec (the command is the target)"))
		}
	}
	return config.Join(errs...)
}

// resolveTarget defaults a check's or group's role to self (aimed at this
// node) and requires a target node for the peer and vip roles.
func (c *Config) resolveTarget(role *events.Role, target *string, key func(string) string) error {
	if *role == "" {
		*role = events.RoleSelf
	}
	switch *role {
	case events.RoleSelf:
		if *target == "" {
			*target = c.Node
			return nil // node is checked as node
		}
	case events.RolePeer, events.RoleVIP:
		if *target == "" {
			return config.Errf(key("target_node"), "required for role %s", *role)
		}
	default:
		return config.Errf(key("role"), "unknown role %q (self, peer or vip)", *role)
	}
	if err := events.ValidToken("target_node", *target); err != nil {
		return &config.FieldError{Key: key("target_node"), Err: err}
	}
	return nil
}

// secrets are the credentials the configuration holds, which no event, log
// line or metric may carry: AMI secrets, URL passwords and password-like
// query values, and exec arguments marked (or recognised) as secret.
func (c *Config) secrets() []string {
	var out []string
	for _, ch := range c.Checks {
		switch ch.Kind {
		case "ami":
			out = append(out, ch.Secret)
		case "http":
			_, s := check.RedactURL(ch.Address)
			out = append(out, s...)
		case "exec":
			_, s := check.RedactArgs(ch.Command, ch.SecretArgs)
			out = append(out, s...)
		}
	}
	return out
}
