package app

import (
	"crypto/tls"
	"fmt"
	"net"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/config"
)

// Ranges of the arbiter's keys (README "Configuration"). Zero means the
// default for every policy duration; the defaults lie inside the ranges.
const (
	maxLeaseTTL = time.Minute
	// maxGroups and maxMembers (the nodes of every group, counted once per
	// group) bound the decision state, which is persisted whole (its
	// per-node view included) before every command: a thousand nodes in
	// groups of two or three fit with room to spare, and 2,048 members
	// (what 64 groups of 32 allowed before) keep the record far below
	// NATS's 1 MB message limit. See internal/nodesim's benchmark.
	maxGroups     = 512
	maxMembers    = 2048
	maxAddresses  = 64
	maxGroupNodes = 32
	maxHTTPNodes  = 1024
	// maxReplicas bounds the arbiter replicas a cluster names (replicas):
	// one per host of the bus is the usual shape, three.
	maxReplicas = 16
	// The HTTP heartbeat interval is carried as interval_ms in the events,
	// which refuse anything above events.MaxHeartbeatInterval.
	minHTTPInterval = time.Second
	maxHTTPBody     = 64 << 10
	maxOfflineAfter = 24 * time.Hour
)

// validateBounds refuses out-of-range values before any default is derived
// from them (lease_ttl: 100000h was accepted and fenced commands for years).
func (c *Config) validateBounds() error {
	p := c.Policy
	errs := []error{
		config.DurationOrZero("lease_ttl", c.LeaseTTL.D(), time.Second, maxLeaseTTL),
		config.DurationOrZero("policy.silent_after", p.SilentAfter.D(), 100*time.Millisecond, 10*time.Minute),
		config.IntIn("policy.presence_misses", p.PresenceMisses, 0, 100),
		config.DurationOrZero("policy.presence_grace", p.PresenceGrace.D(), time.Millisecond, 10*time.Second),
		config.DurationOrZero("policy.claim_timeout", p.ClaimTimeout.D(), 500*time.Millisecond, min(5*time.Minute, events.MaxCommandTTL)),
		config.DurationOrZero("policy.command_ttl", p.CommandTTL.D(), time.Second, events.MaxCommandTTL),
		config.DurationOrZero("policy.hold_down", p.HoldDown.D(), time.Millisecond, 24*time.Hour),
		config.DurationOrZero("policy.retry_backoff", p.RetryBackoff.D(), time.Millisecond, time.Hour),
		config.DurationOrZero("policy.settle_after", p.SettleAfter.D(), time.Millisecond, 10*time.Minute),
		config.DurationOrZero("policy.clock_skew", p.ClockSkew.D(), time.Millisecond, events.MaxClockSkew),
		config.IntIn("policy.max_moves_per_hour", p.MaxMovesPerHour, -1, 1000),
		config.CountIn("groups", len(c.Groups), 1, maxGroups),
		config.CountIn("replicas", len(c.Replicas), 0, maxReplicas),
		membersIn(c.Groups),
		config.DurationOrZero("registry.offline_after", c.Registry.OfflineAfter.D(), time.Second, maxOfflineAfter),
		config.DurationOrZero("registry.sweep_every", c.Registry.SweepEvery.D(), 100*time.Millisecond, maxOfflineAfter),
	}
	for i, g := range c.Groups {
		key := func(k string) string { return fmt.Sprintf("groups[%d].%s", i, k) }
		fb := g.Failback
		errs = append(errs,
			config.CountIn(key("addresses"), len(g.Addresses), 1, maxAddresses),
			config.CountIn(key("nodes"), len(g.Nodes), 1, maxGroupNodes),
			config.CountIn(key("peer_checks"), len(g.PeerChecks), 0, maxGroupNodes*8),
			config.CountIn(key("health_from"), len(g.HealthFrom), 0, maxGroupNodes),
			config.DurationOrZero(key("failback.stable_for"), fb.StableFor.D(), time.Second, 7*24*time.Hour),
			config.DurationOrZero(key("failback.force_before"), fb.ForceBefore.D(), time.Second, 24*time.Hour),
			config.IntIn(key("failback.drain_max_channels"), fb.DrainMaxChannels, -1, events.MaxCount),
			config.IntIn(key("weights.confirm"), g.Weights.Confirm, 0, 100),
		)
	}
	if h := c.HTTPHeartbeat; h.Listen != "" {
		errs = append(errs,
			config.HostPort("http_heartbeat.listen", h.Listen, true),
			config.IntIn("http_heartbeat.max_body", h.MaxBody, 0, maxHTTPBody),
			config.DurationOrZero("http_heartbeat.interval", h.Interval.D(), minHTTPInterval, events.MaxHeartbeatInterval),
			config.CountIn("http_heartbeat.nodes", len(h.Nodes), 0, maxHTTPNodes),
			config.IntIn("http_heartbeat.rate_limit.per_second", h.RateLimit.PerSecond, 0, 1000),
			config.IntIn("http_heartbeat.rate_limit.burst", h.RateLimit.Burst, 0, 10000),
			config.IntIn("http_heartbeat.rate_limit.max_sources", h.RateLimit.MaxSources, 0, 1_000_000),
			config.IntIn("http_heartbeat.conns_per_source", h.ConnsPerSource, 0, 1024),
			config.IntIn("http_heartbeat.max_conns", h.MaxConns, 0, 65536),
		)
		if r := h.RateLimit.PerSecond; r > 0 && r < 0.01 {
			errs = append(errs, config.Errf("http_heartbeat.rate_limit.per_second", "must be 0 (default) or between 0.01 and 1000, got %v", r))
		}
	}
	return config.Join(errs...)
}

// membersIn bounds the nodes of every group together, a node in two
// groups counted twice.
func membersIn(groups []GroupConfig) error {
	n := 0
	for _, g := range groups {
		n += len(g.Nodes)
	}
	if n > maxMembers {
		return config.Errf("groups", "at most %d members in all groups together (a node in two groups counts twice), got %d", maxMembers, n)
	}
	return nil
}

// validateTLS requires TLS off loopback and checks that the pair loads
// (how long the certificate stays valid is CheckHost's: a warning).
func (h *HTTPHeartbeatConfig) validateTLS() error {
	t := h.TLS
	if (t.Cert == "") != (t.Key == "") {
		return config.Errf("http_heartbeat.tls", "cert and key go together")
	}
	if t.Cert == "" {
		host, _, _ := net.SplitHostPort(h.Listen)
		if !h.InsecurePlaintext && (host == "" || !bus.IsLoopbackHost(host)) {
			return config.Errf("http_heartbeat.tls", "required: %s is not loopback, and the bearer token must not cross a network in the clear (insecure_plaintext: true only behind a TLS proxy on this host)", h.Listen)
		}
		return nil
	}
	if h.InsecurePlaintext {
		return config.Errf("http_heartbeat.insecure_plaintext", "contradicts http_heartbeat.tls")
	}
	if _, err := tls.LoadX509KeyPair(t.Cert, t.Key); err != nil {
		return &config.FieldError{Key: "http_heartbeat.tls", Err: err}
	}
	return nil
}
