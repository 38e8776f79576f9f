package decide

import (
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/fanpbx/fan/pkg/events"
)

// Policy defaults. Each is a trade between moving fast when phones are hurt
// and never moving when they are not.
const (
	// DefaultSilentAfter: heartbeats come once a second, so three missed
	// ones (seed FAN2's "3 misses in a row") mark a node silent. Silence
	// alone never moves an address (peers must confirm), so being quick
	// here costs nothing and makes a crashed holder replaceable sooner.
	DefaultSilentAfter = 3 * time.Second
	// DefaultClaimTimeout: an executor answers a claim in milliseconds; 5 s
	// covers a slow netlink call, ARP probing and a PBX reload while still
	// giving up on a dead claimant well inside a typical SIP retry budget.
	DefaultClaimTimeout = 5 * time.Second
	// DefaultCommandTTL bounds how long a command may sit in a node's queue
	// (a node cut off from the bus must not act on it much later).
	DefaultCommandTTL = 10 * time.Second
	// DefaultHoldDown: longer than a claim timeout plus keepalived's second
	// gratuitous-ARP burst (+5 s), so a move has settled on the LAN before
	// another discretionary move is considered.
	DefaultHoldDown = 10 * time.Second
	// DefaultRetryBackoff equals DefaultCommandTTL: once it has passed, any
	// claim still queued for the node that failed has expired, so claiming
	// it again cannot race a late copy of the old command.
	DefaultRetryBackoff = DefaultCommandTTL
)

// Config is the arbiter's view of one cluster. Zero durations take the defaults above.
type Config struct {
	Cluster string
	Groups  []Group
	// NewID returns a fresh envelope id (a UUID v7 in production:
	// uuid.Must(uuid.NewV7()).String()). The core pre-assigns ids so that a
	// decision can name its commands; it is injected to keep the core
	// deterministic under test.
	NewID func() string

	SilentAfter  time.Duration // bus silence after which a node counts as silent
	ClaimTimeout time.Duration // a claim not confirmed within this is given up
	CommandTTL   time.Duration // NotAfter = now + CommandTTL on every command
	HoldDown     time.Duration // no discretionary move within this of the last move
	RetryBackoff time.Duration // a node whose claim failed is skipped this long
	SettleAfter  time.Duration // at start, wait this long for unheard higher-priority nodes (default SilentAfter)
}

// Group is one set of floating addresses and the nodes that may hold them.
type Group struct {
	Name      string
	Addresses []string // prefixes, e.g. 198.51.100.10/24
	Nodes     []string // priority order, first = preferred
	// HealthCheck is the self-role check (or quorum group) whose health on a
	// node, as its own prober reports it, makes the node eligible.
	HealthCheck string
	// PeerChecks names the peer-role checks that count as evidence about a
	// silent holder. Empty means every peer-role check targeting the node,
	// which suits the usual one-peer-check-per-neighbour setup.
	PeerChecks []string
}

// ErrConfig wraps every configuration error.
var ErrConfig = errors.New("invalid arbiter config")

func (c *Config) withDefaults() {
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&c.SilentAfter, DefaultSilentAfter)
	def(&c.ClaimTimeout, DefaultClaimTimeout)
	def(&c.CommandTTL, DefaultCommandTTL)
	def(&c.HoldDown, DefaultHoldDown)
	def(&c.RetryBackoff, DefaultRetryBackoff)
	def(&c.SettleAfter, c.SilentAfter)
}

func (c *Config) validate() error {
	if err := events.ValidToken("cluster", c.Cluster); err != nil {
		return fmt.Errorf("%w: %v", ErrConfig, err)
	}
	if c.NewID == nil {
		return fmt.Errorf("%w: NewID is required", ErrConfig)
	}
	for name, d := range map[string]time.Duration{
		"SilentAfter": c.SilentAfter, "ClaimTimeout": c.ClaimTimeout, "CommandTTL": c.CommandTTL,
		"HoldDown": c.HoldDown, "RetryBackoff": c.RetryBackoff, "SettleAfter": c.SettleAfter,
	} {
		if d < 0 {
			return fmt.Errorf("%w: %s is negative", ErrConfig, name)
		}
	}
	if len(c.Groups) == 0 {
		return fmt.Errorf("%w: no groups", ErrConfig)
	}
	seen := map[string]bool{}
	for _, g := range c.Groups {
		if err := events.ValidToken("group", g.Name); err != nil {
			return fmt.Errorf("%w: %v", ErrConfig, err)
		}
		if seen[g.Name] {
			return fmt.Errorf("%w: group %s defined twice", ErrConfig, g.Name)
		}
		seen[g.Name] = true
		if len(g.Addresses) == 0 {
			return fmt.Errorf("%w: group %s has no addresses", ErrConfig, g.Name)
		}
		for _, a := range g.Addresses {
			if _, err := netip.ParsePrefix(a); err != nil {
				return fmt.Errorf("%w: group %s address %q: %v", ErrConfig, g.Name, a, err)
			}
		}
		if len(g.Nodes) == 0 {
			return fmt.Errorf("%w: group %s has no nodes", ErrConfig, g.Name)
		}
		nodes := map[string]bool{}
		for _, n := range g.Nodes {
			if err := events.ValidToken("node", n); err != nil {
				return fmt.Errorf("%w: group %s: %v", ErrConfig, g.Name, err)
			}
			if nodes[n] {
				return fmt.Errorf("%w: group %s lists node %s twice", ErrConfig, g.Name, n)
			}
			nodes[n] = true
		}
		if err := events.ValidToken("health check", g.HealthCheck); err != nil {
			return fmt.Errorf("%w: group %s: %v", ErrConfig, g.Name, err)
		}
		for _, pc := range g.PeerChecks {
			if err := events.ValidToken("peer check", pc); err != nil {
				return fmt.Errorf("%w: group %s: %v", ErrConfig, g.Name, err)
			}
		}
	}
	return nil
}
