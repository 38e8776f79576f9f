package app

import (
	"fmt"
	"maps"
	"net/netip"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/config"
	"github.com/fanpbx/fan/pkg/platform/daemon"
	"github.com/fanpbx/fan/services/arbiter/internal/decide"
	"github.com/fanpbx/fan/services/arbiter/internal/httphb"
	"github.com/fanpbx/fan/services/arbiter/internal/notify"
	"github.com/fanpbx/fan/services/arbiter/internal/registry"
	"github.com/google/uuid"
)

// Config is the arbiter's configuration file.
type Config struct {
	daemon.Common `yaml:",inline"`
	// LeaseTTL is the leadership lease (whole seconds). A dead leader is
	// replaced after about this long; commands are fenced by it.
	LeaseTTL config.Duration `yaml:"lease_ttl"`
	// Standby marks a replica on a PBX host: it campaigns for the lease only
	// while it hears no replica without it, and hands the lease back once it
	// has heard one for a while (see "Where the raft leaders live").
	Standby bool `yaml:"standby"`
	// Replicas names every arbiter replica of the cluster by its node,
	// this one included: each replica reports which of them it hears
	// (fan_arbiter_replica_up), so a replica whose process or host is gone
	// is noticed even by a replica that started after it went. Empty: the
	// replicas heard since this one started.
	Replicas []string       `yaml:"replicas"`
	Groups   []GroupConfig  `yaml:"groups"`
	Policy   PolicyConfig   `yaml:"policy"`
	Registry RegistryConfig `yaml:"registry"`
	// HTTPHeartbeat is the REST endpoint for hosts without a prober.
	HTTPHeartbeat HTTPHeartbeatConfig `yaml:"http_heartbeat"`
	// Notify runs commands and webhooks on holder changes, health
	// transitions of the groups' checks and needs-human decisions.
	Notify notify.Config `yaml:"notify"`

	// RestoreWithin bounds how long a replica may hold the lease without
	// commanding: a takeover whose state cannot be read (restored) or a
	// leader whose decisions cannot be persisted releases the lease after
	// this long so another replica can try. Default lease_ttl/3; at least
	// 200ms, below lease_ttl.
	RestoreWithin config.Duration `yaml:"restore_within"`
}

// HTTPHeartbeatConfig enables POST /api/servers/heartbeat and GET
// /api/servers when Listen is set.
type HTTPHeartbeatConfig struct {
	Listen string `yaml:"listen"` // host:port
	// Token or TokenFile (one of them) is the bearer token clients send.
	Token     string `yaml:"token"`
	TokenFile string `yaml:"token_file"`
	// NodeTokenFiles gives nodes a token of their own, each in a file: such
	// a node posts with its token alone, and its token posts for it alone
	// (httphb.Config.NodeTokens). The shared token still reads GET
	// /api/servers and posts for the nodes without a token of their own.
	NodeTokenFiles map[string]string `yaml:"node_token_files"`
	// NodeTokens is what NodeTokenFiles hold, read by validate.
	NodeTokens map[string]string `yaml:"-"`
	// MaxBody bounds a request body in bytes (default 4096).
	MaxBody int64 `yaml:"max_body"`
	// Interval is the heartbeat period these hosts use, carried in the
	// events when the body gives none (default 60s, a once-a-minute cron).
	Interval config.Duration `yaml:"interval"`
	// Nodes may post; any other name is refused.
	Nodes []string `yaml:"nodes"`
	// TLS serves HTTPS with this certificate and key, reloaded when the
	// files change. Required unless Listen is on loopback or
	// InsecurePlaintext is set: the bearer token must not cross a network
	// in the clear.
	TLS               HTTPHeartbeatTLS `yaml:"tls"`
	InsecurePlaintext bool             `yaml:"insecure_plaintext"`
	// RateLimit is each source address's token bucket.
	RateLimit HTTPHeartbeatRateLimit `yaml:"rate_limit"`
	// ConnsPerSource and MaxConns bound the connections open at once, from
	// one address and in all (0: httphb's defaults).
	ConnsPerSource int `yaml:"conns_per_source"`
	MaxConns       int `yaml:"max_conns"`
}

// HTTPHeartbeatTLS names the certificate and key files (PEM).
type HTTPHeartbeatTLS struct {
	Cert string `yaml:"cert"`
	Key  string `yaml:"key"`
}

// HTTPHeartbeatRateLimit is the per-source token bucket; zero values take
// httphb's defaults.
type HTTPHeartbeatRateLimit struct {
	PerSecond  float64 `yaml:"per_second"`
	Burst      int     `yaml:"burst"`
	MaxSources int     `yaml:"max_sources"`
}

func (h *HTTPHeartbeatConfig) validate() error {
	if h.Listen == "" {
		return nil
	}
	var errs []error
	switch {
	case h.Token != "" && h.TokenFile != "":
		errs = append(errs, config.Errf("http_heartbeat.token", "set token or token_file, not both"))
	case h.TokenFile != "":
		b, err := os.ReadFile(h.TokenFile)
		if err != nil {
			errs = append(errs, &config.FieldError{Key: "http_heartbeat.token_file", Err: err})
			break
		}
		h.Token = strings.TrimSpace(string(b))
		fallthrough
	default:
		if len(h.Token) < 16 {
			errs = append(errs, config.Errf("http_heartbeat.token", "a bearer token of at least 16 characters is required"))
		}
	}
	h.NodeTokens = map[string]string{}
	for _, node := range slices.Sorted(maps.Keys(h.NodeTokenFiles)) {
		key := "http_heartbeat.node_token_files." + node
		if !slices.Contains(h.Nodes, node) {
			errs = append(errs, config.Errf(key, "node %q is not in http_heartbeat.nodes", node))
			continue
		}
		b, err := os.ReadFile(h.NodeTokenFiles[node])
		if err != nil {
			errs = append(errs, &config.FieldError{Key: key, Err: err})
			continue
		}
		tok := strings.TrimSpace(string(b))
		switch {
		case len(tok) < 16:
			errs = append(errs, config.Errf(key, "a bearer token of at least 16 characters is required"))
		case tok == h.Token:
			errs = append(errs, config.Errf(key, "the same as the shared token: a node's token must be its own"))
		case slices.Contains(slices.Collect(maps.Values(h.NodeTokens)), tok):
			errs = append(errs, config.Errf(key, "the same as another node's token: a node's token must be its own"))
		default:
			h.NodeTokens[node] = tok
		}
	}
	if h.MaxBody == 0 {
		h.MaxBody = httphb.DefaultMaxBody
	}
	if h.MaxBody > 0 && h.MaxBody < 256 { // negative: out of the bounds already
		errs = append(errs, config.Errf("http_heartbeat.max_body", "at least 256 bytes"))
	}
	if h.Interval == 0 {
		h.Interval = config.Duration(time.Minute)
	}
	if len(h.Nodes) == 0 {
		errs = append(errs, config.Errf("http_heartbeat.nodes", "list the nodes that may post heartbeats"))
	}
	errs = append(errs, h.validateTLS())
	for _, n := range h.Nodes {
		if err := events.ValidToken("node", n); err != nil {
			errs = append(errs, &config.FieldError{Key: "http_heartbeat.nodes", Err: err})
		}
	}
	return config.Join(errs...)
}

// RegistryConfig tunes the node registry.
type RegistryConfig struct {
	// OfflineAfter: a node silent this long is marked offline (default 5m).
	OfflineAfter config.Duration `yaml:"offline_after"`
	// SweepEvery: how often the leader sweeps (default offline_after/5, at most 30s).
	SweepEvery config.Duration `yaml:"sweep_every"`
}

// FailbackConfig is a group's failback policy. Failback is never automatic
// without a permit from the scheduler; these are the further conditions.
type FailbackConfig struct {
	StableFor          config.Duration `yaml:"stable_for"`          // default 10m
	RequireReplication bool            `yaml:"require_replication"` // default false until the replicator reports
	DrainMaxChannels   int             `yaml:"drain_max_channels"`  // default 0; negative disables the drain wait
	OnWindowClose      string          `yaml:"on_window_close"`     // wait (default) or force
	ForceBefore        config.Duration `yaml:"force_before"`        // default 1m
}

// PlannedConfig is a group's policy for planned moves.
type PlannedConfig struct {
	// DrainWithin is how long a planned move waits for the holder to
	// drain unless the request says (--within): default 30m, 1s..24h.
	DrainWithin config.Duration `yaml:"drain_within"`
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
	PeerChecks []string       `yaml:"peer_checks"`
	Failback   FailbackConfig `yaml:"failback"`
	// Planned is how an operator's switchover or node standby waits for
	// the holder's calls (the limit is failback.drain_max_channels).
	Planned PlannedConfig `yaml:"planned"`
	// HealthFrom, for members that run no prober (a DNS site), names the
	// observer node and its check (a peer-role quorum group targeting the
	// member) that decide the member's health; the member is heard while
	// the observer is.
	HealthFrom map[string]HealthSourceConfig `yaml:"health_from"`
	// Weights publishes load-aware dispatcher weights for the group's
	// nodes (internal/weights: formula and hysteresis).
	Weights WeightsConfig `yaml:"weights"`
}

// WeightsConfig enables dispatcher.weights for a group.
type WeightsConfig struct {
	Enabled bool `yaml:"enabled"`
	// Threshold: a weight moves only when the computed one differs by at
	// least this much (default 10, of 1..100)...
	Threshold int `yaml:"threshold"`
	// Confirm: ...in this many consecutive heartbeats (default 3).
	Confirm int `yaml:"confirm"`
}

// HealthSourceConfig is one health_from entry.
type HealthSourceConfig struct {
	Observer string `yaml:"observer"`
	Check    string `yaml:"check"`
}

// PolicyConfig tunes timing; zero values take the decision core's defaults.
type PolicyConfig struct {
	SilentAfter config.Duration `yaml:"silent_after"`
	// PresenceMisses missed presence beacons (plus PresenceGrace) make a
	// node silent: 3 x 100 ms + 50 ms with the prober's defaults.
	PresenceMisses int             `yaml:"presence_misses"`
	PresenceGrace  config.Duration `yaml:"presence_grace"`
	// TickEvery is how often the decision core's timers run (silence,
	// claim timeouts): how late past its limit a silence is acted on.
	TickEvery    config.Duration `yaml:"tick_every"`
	ClaimTimeout config.Duration `yaml:"claim_timeout"`
	CommandTTL   config.Duration `yaml:"command_ttl"`
	HoldDown     config.Duration `yaml:"hold_down"`
	RetryBackoff config.Duration `yaml:"retry_backoff"`
	SettleAfter  config.Duration `yaml:"settle_after"`
	ClockSkew    config.Duration `yaml:"clock_skew"`
	// MaxMovesPerHour caps automatic moves per group (default 5; negative: no cap).
	MaxMovesPerHour int `yaml:"max_moves_per_hour"`
}

// Validate checks the file after loading and fills defaults, reporting
// every key that is wrong.
func (c *Config) Validate() error {
	errs := []error{c.Common.Validate(), c.validateBounds()}
	if c.LeaseTTL == 0 {
		c.LeaseTTL = config.Duration(3 * time.Second)
	}
	if c.Policy.TickEvery == 0 {
		c.Policy.TickEvery = config.Duration(defaultTickEvery)
	}
	if d := c.Policy.TickEvery.D(); d < 5*time.Millisecond || d > time.Second {
		errs = append(errs, config.Errf("policy.tick_every", "must be between 5ms and 1s, got %v", d))
	}
	// Below 1s or above the range, the bounds name lease_ttl already.
	leaseOK := c.LeaseTTL.D() >= time.Second && c.LeaseTTL.D() <= maxLeaseTTL
	if d := c.LeaseTTL.D(); leaseOK && d%time.Second != 0 {
		leaseOK = false
		errs = append(errs, config.Errf("lease_ttl", "must be whole seconds, at least 1s (the server's TTL granularity), got %v", d))
	}
	if c.RestoreWithin == 0 {
		c.RestoreWithin = config.Duration(c.LeaseTTL.D() / 3)
	}
	if d := c.RestoreWithin.D(); leaseOK && (d < 200*time.Millisecond || d >= c.LeaseTTL.D()) {
		errs = append(errs, config.Errf("restore_within", "must be at least 200ms and below lease_ttl (%v), got %v", c.LeaseTTL.D(), d))
	}
	if len(c.Groups) == 0 {
		errs = append(errs, config.Errf("groups", "at least one group is required"))
	}
	errs = append(errs, c.validateReplicas())
	seen := map[string]bool{}
	for i, g := range c.Groups {
		errs = append(errs, validateGroup(i, g, seen))
	}
	// The bounds refuse an offline_after below 1s and a sweep_every below
	// 100ms; the default sweep of a valid offline_after is at least 200ms.
	if c.Registry.OfflineAfter == 0 {
		c.Registry.OfflineAfter = config.Duration(registry.DefaultOfflineAfter)
	}
	if c.Registry.SweepEvery == 0 {
		c.Registry.SweepEvery = config.Duration(min(c.Registry.OfflineAfter.D()/5, 30*time.Second))
	}
	errs = append(errs, c.HTTPHeartbeat.validate())
	names := make([]string, len(c.Groups))
	for i, g := range c.Groups {
		names[i] = g.Name
	}
	errs = append(errs, c.Notify.Validate(names))
	// The decision core checks the timing arithmetic (claim_timeout,
	// clock_skew, command_ttl) so that a bad file fails at start; after
	// another error it would only repeat it (a group's address, the cluster).
	if err := config.Join(errs...); err != nil {
		return err
	}
	if _, err := decide.New(c.decideConfig()); err != nil {
		return &config.FieldError{Key: "policy", Err: err}
	}
	return nil
}

// validateGroup checks one group; seen holds the names of those before it.
func validateGroup(i int, g GroupConfig, seen map[string]bool) error {
	key := func(k string) string { return fmt.Sprintf("groups[%d].%s", i, k) }
	var errs []error
	if err := events.ValidToken("name", g.Name); err != nil {
		errs = append(errs, &config.FieldError{Key: key("name"), Err: err})
	} else if seen[g.Name] {
		errs = append(errs, config.Errf(key("name"), "duplicate group %q", g.Name))
	}
	seen[g.Name] = true
	if len(g.Addresses) == 0 {
		errs = append(errs, config.Errf(key("addresses"), "at least one address is required"))
	}
	for _, a := range g.Addresses {
		if _, err := netip.ParsePrefix(a); err != nil {
			errs = append(errs, config.Errf(key("addresses"), "%q is not an address with a prefix length (198.51.100.10/24): %v", a, err))
		}
	}
	if len(g.Nodes) == 0 {
		errs = append(errs, config.Errf(key("nodes"), "at least one node is required"))
	}
	for _, n := range g.Nodes {
		if err := events.ValidToken("node", n); err != nil {
			errs = append(errs, &config.FieldError{Key: key("nodes"), Err: err})
		}
	}
	if g.HealthCheck == "" {
		errs = append(errs, config.Errf(key("health_check"), "required"))
	}
	if g.Weights.Threshold < 0 || g.Weights.Threshold > 99 || g.Weights.Confirm < 0 {
		errs = append(errs, config.Errf(key("weights"), "threshold 0..99 and confirm >= 0 (0 takes the defaults)"))
	}
	if d := g.Planned.DrainWithin.D(); d != 0 && (d < events.MinDrainWithin || d > events.MaxDrainWithin) {
		errs = append(errs, config.Errf(key("planned.drain_within"), "must be between %v and %v, got %v", events.MinDrainWithin, events.MaxDrainWithin, d))
	}
	if w := g.Failback.OnWindowClose; w != "" && w != "wait" && w != "force" {
		errs = append(errs, config.Errf(key("failback.on_window_close"), "want wait or force, got %q", w))
	}
	return config.Join(errs...)
}

// CheckHost checks what the file names on this host (config.HostChecker):
// the bus's files and http_listen (daemon.Common), the notify hooks'
// programs and secrets, the address the HTTP heartbeat listens on and how
// long its certificate stays valid.
func (c *Config) CheckHost() error {
	errs := []error{c.Common.CheckHost(), c.Notify.CheckFiles()}
	if h := c.HTTPHeartbeat; h.Listen != "" {
		errs = append(errs,
			config.ListenLocal("http_heartbeat.listen", h.Listen),
			config.CertValidity("http_heartbeat.tls.cert", h.TLS.Cert))
	}
	return config.Join(errs...)
}

func (c *Config) decideConfig() decide.Config {
	p := c.Policy
	dc := decide.Config{
		Cluster: c.Cluster, NewID: func() string { return uuid.Must(uuid.NewV7()).String() },
		SilentAfter: p.SilentAfter.D(), ClaimTimeout: p.ClaimTimeout.D(), CommandTTL: p.CommandTTL.D(),
		HoldDown: p.HoldDown.D(), RetryBackoff: p.RetryBackoff.D(), SettleAfter: p.SettleAfter.D(),
		ClockSkew: p.ClockSkew.D(), MaxMovesPerHour: p.MaxMovesPerHour,
		PresenceMisses: p.PresenceMisses, PresenceGrace: p.PresenceGrace.D(),
	}
	for _, g := range c.Groups {
		fb := g.Failback
		var hf map[string]decide.HealthSource
		for n, hs := range g.HealthFrom {
			if hf == nil {
				hf = map[string]decide.HealthSource{}
			}
			hf[n] = decide.HealthSource{Observer: hs.Observer, Check: hs.Check}
		}
		dc.Groups = append(dc.Groups, decide.Group{Name: g.Name, Addresses: g.Addresses, Nodes: g.Nodes, HealthFrom: hf,
			HealthCheck: g.HealthCheck, PeerChecks: g.PeerChecks, Failback: decide.FailbackPolicy{
				StableFor: fb.StableFor.D(), RequireReplication: fb.RequireReplication, DrainMaxChannels: fb.DrainMaxChannels,
				OnWindowClose: decide.WindowClose(fb.OnWindowClose), ForceBefore: fb.ForceBefore.D(),
			}, Planned: decide.PlannedPolicy{DrainWithin: g.Planned.DrainWithin.D()}})
	}
	return dc
}

// DecisionConfig reads an arbiter configuration file (strictly, as the
// arbiter does) and returns what its decision core is given: the replay
// runs the core under it.
func DecisionConfig(path string) (decide.Config, error) {
	var c Config
	if err := config.Load(path, &c); err != nil {
		return decide.Config{}, err
	}
	return c.decideConfig(), nil
}

// validateReplicas checks the replicas list: node names, each once, this
// replica's own among them (a list that lacks it was written for another
// cluster or host).
func (c *Config) validateReplicas() error {
	if len(c.Replicas) == 0 {
		return nil
	}
	for i, n := range c.Replicas {
		key := fmt.Sprintf("replicas[%d]", i)
		if err := events.ValidToken("node", n); err != nil {
			return &config.FieldError{Key: key, Err: err}
		}
		if slices.Index(c.Replicas, n) != i {
			return config.Errf(key, "%q listed twice", n)
		}
	}
	if !slices.Contains(c.Replicas, c.Node) {
		return config.Errf("replicas", "must include this replica's own node %q", c.Node)
	}
	return nil
}
