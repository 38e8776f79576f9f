package decide

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/fanpbx/fan/pkg/events"
)

// Policy defaults. Each is a trade between moving fast when phones are hurt
// and never moving when they are not.
const (
	// DefaultSilentAfter: heartbeats come once a second, so three missed
	// ones in a row mark a node silent (one lost heartbeat is noise). Silence
	// alone never moves an address (peers must confirm), so being quick
	// here costs nothing and makes a crashed holder replaceable sooner.
	DefaultSilentAfter = 3 * time.Second
	// DefaultPresenceMisses beacons missed in a row make a node silent;
	// with the prober's 100 ms beacons that is 300 ms (+ the grace).
	DefaultPresenceMisses = 3
	// DefaultPresenceGrace absorbs scheduling and bus jitter on top.
	DefaultPresenceGrace = 50 * time.Millisecond
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
	// command still queued for the node that failed has expired, so claiming
	// it again cannot race a late copy of the old command.
	DefaultRetryBackoff = DefaultCommandTTL
	// DefaultClockSkew is how far an executor's clock may lag the arbiter's.
	// Claims expire this long before the arbiter gives up on them (see
	// ClaimTTL), so NTP-synchronised hosts (skew in milliseconds) are
	// covered many times over.
	DefaultClockSkew = time.Second
	// DefaultMaxMovesPerHour caps automatic moves (failover, failback) per
	// group in any hour, like Pacemaker's migration-threshold: past it the
	// group freezes and asks for a human. Five dead holders in an hour is
	// not bad luck, it is a fault that moving again will not fix.
	DefaultMaxMovesPerHour = 5
	// DefaultStableFor: the preferred node must have been healthy and heard
	// this long before a failback to it (a node that restarts twice in ten
	// minutes is not ready).
	DefaultStableFor = 10 * time.Minute
	// DefaultForceBefore: with OnWindowClose force, a failback still waiting
	// for calls to drain goes ahead this long before the window closes.
	DefaultForceBefore = time.Minute
	// DefaultDrainWithin: a planned move (switchover, standby) waits this
	// long for the holder's calls to end. Half an hour covers nearly every
	// business call; a maintenance that cannot wait says --within or --now.
	DefaultDrainWithin = 30 * time.Minute
)

// WindowClose is what a failback still waiting for calls to drain does
// when its window is about to close.
type WindowClose string

const (
	// WindowCloseWait gives up until the next window (the default: no
	// call is cut for a failback that can wait a day).
	WindowCloseWait WindowClose = "wait"
	// WindowCloseForce fails back anyway, ForceBefore the window closes.
	WindowCloseForce WindowClose = "force"
)

// FailbackPolicy says when a group may move back to a more preferred node
// while its holder is fine. Failback is never automatic without a
// FailbackPermit from the scheduler; the policy adds the other conditions.
type FailbackPolicy struct {
	// StableFor: the target has been healthy and heard this long (default 10m).
	StableFor time.Duration
	// RequireReplication: wait for a ReplicationStatus from the holder to
	// the target with CaughtUp, for every tree reported since the last move.
	RequireReplication bool
	// DrainMaxChannels: the holder's heartbeat must report at most this
	// many active channels (0, the default, means none). Negative disables
	// the drain condition. Unknown (not reported) is not drained.
	DrainMaxChannels int
	OnWindowClose    WindowClose // default wait
	ForceBefore      time.Duration
}

// PlannedPolicy is how a group's planned moves (an operator's switchover or
// node standby) wait for the holder's calls. The drain limit is the
// failback's (FailbackPolicy.DrainMaxChannels): one number says when a
// holder counts as drained.
type PlannedPolicy struct {
	// DrainWithin is the default wait (default 30m, 1s..24h); a request
	// may name its own.
	DrainWithin time.Duration
}

// Config is the arbiter's view of one cluster. Zero durations take the defaults above.
type Config struct {
	Cluster string
	Groups  []Group
	// NewID returns a fresh envelope id (a UUID v7 in production:
	// uuid.Must(uuid.NewV7()).String()). The core pre-assigns ids so that a
	// decision can name its commands; it is injected to keep the core
	// deterministic under test.
	NewID func() string

	SilentAfter time.Duration // bus silence after which a node counts as silent
	// PresenceMisses beacon intervals plus PresenceGrace without a beacon
	// make a node that sends beacons silent (defaults 3 and 50 ms).
	PresenceMisses int
	PresenceGrace  time.Duration
	ClaimTimeout   time.Duration // a claim not confirmed within this is given up
	CommandTTL     time.Duration // NotAfter = now + CommandTTL on every command
	HoldDown       time.Duration // no discretionary move within this of the last move
	RetryBackoff   time.Duration // a node whose claim failed is skipped this long
	SettleAfter    time.Duration // at start, wait this long for unheard higher-priority nodes (default SilentAfter)
	ClockSkew      time.Duration // how far an executor's clock may lag (claims expire this long before ClaimTimeout)
	// MaxMovesPerHour caps automatic moves per group; 0 takes the default,
	// negative disables the cap.
	MaxMovesPerHour int
}

// Digest names the policy: equal configurations (defaults filled in) have
// equal digests. A term records it, so a replay under another policy says
// so rather than passing its differences off as the arbiter's.
func (c Config) Digest() string {
	c.NewID = nil
	c.withDefaults()
	sum := sha256.Sum256(fmt.Appendf(nil, "%+v", c)) // fmt prints maps sorted: the text is stable
	return hex.EncodeToString(sum[:8])
}

// ClaimTTL is how long a claim stays valid: ClaimTimeout - ClockSkew.
//
// The arithmetic that closes the dual-holder gap: a claim published at t
// carries NotAfter = t + ClaimTimeout - ClockSkew. An executor whose clock
// lags the arbiter's by at most ClockSkew refuses it (and the server's TTL
// deletes it) by arbiter time t + ClaimTimeout, which is exactly when the
// arbiter gives up on it and claims elsewhere. So a claim the arbiter has
// given up can no longer start being applied anywhere. What remains is a
// claim whose application started before its deadline and is still
// running: the release the arbiter sends at the same moment sits behind it
// in the same node's ordered queue, so that node lets go as soon as it has
// finished (the overlap is bounded by one claim's execution time).
func (c Config) ClaimTTL() time.Duration { return c.ClaimTimeout - c.ClockSkew }

// Group is one set of floating addresses and the nodes that may hold them.
type Group struct {
	Name      string
	Addresses []string // prefixes, e.g. 198.51.100.10/24
	Nodes     []string // priority order, first = preferred
	Failback  FailbackPolicy
	Planned   PlannedPolicy
	// HealthCheck is the self-role check (or quorum group) whose health on a
	// node, as its own prober reports it, makes the node eligible.
	HealthCheck string
	// PeerChecks names the peer-role checks that count as evidence about a
	// silent holder. Empty means every peer-role check targeting the node,
	// which suits the usual one-peer-check-per-neighbour setup.
	PeerChecks []string
	// HealthFrom names, for members that run no prober of their own (a DNS
	// site), which observer's check about them decides their
	// health. Such a member's bus presence is its observer's: it is heard
	// while the observer heartbeats and silent when the observer is.
	HealthFrom map[string]HealthSource
}

// HealthSource is the check, run by another node's prober, that stands for a
// member's own health: typically a quorum group ("at least N of M of the
// site's HTTP, DNS and ICMP checks up") with role peer and target_node the
// member.
type HealthSource struct {
	Observer string
	Check    string
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
	def(&c.PresenceGrace, DefaultPresenceGrace)
	if c.PresenceMisses == 0 {
		c.PresenceMisses = DefaultPresenceMisses
	}
	def(&c.ClaimTimeout, DefaultClaimTimeout)
	def(&c.CommandTTL, DefaultCommandTTL)
	def(&c.HoldDown, DefaultHoldDown)
	def(&c.RetryBackoff, DefaultRetryBackoff)
	def(&c.SettleAfter, c.SilentAfter)
	def(&c.ClockSkew, DefaultClockSkew)
	if c.MaxMovesPerHour == 0 {
		c.MaxMovesPerHour = DefaultMaxMovesPerHour
	}
	// Groups is the caller's slice: fill defaults in a copy.
	c.Groups = slices.Clone(c.Groups)
	for i := range c.Groups {
		fb := &c.Groups[i].Failback
		def(&fb.StableFor, DefaultStableFor)
		def(&fb.ForceBefore, DefaultForceBefore)
		if fb.OnWindowClose == "" {
			fb.OnWindowClose = WindowCloseWait
		}
		def(&c.Groups[i].Planned.DrainWithin, DefaultDrainWithin)
	}
}

// minClaimTTL leaves an executor time to receive and start a claim.
const minClaimTTL = 500 * time.Millisecond

// validate returns the first problem it finds, looking at the settings
// that apply to every group, then at each group, then at the observers
// the groups' members borrow across groups.
func (c *Config) validate() error {
	if err := c.validateSettings(); err != nil {
		return err
	}
	if err := c.validateTimings(); err != nil {
		return err
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
		if err := g.validate(); err != nil {
			return err
		}
	}
	return c.validateObservers()
}

// validateSettings checks what names the cluster and makes ids.
func (c *Config) validateSettings() error {
	if err := events.ValidToken("cluster", c.Cluster); err != nil {
		return fmt.Errorf("%w: %v", ErrConfig, err)
	}
	if c.NewID == nil {
		return fmt.Errorf("%w: NewID is required", ErrConfig)
	}
	if c.PresenceMisses < 1 {
		return fmt.Errorf("%w: PresenceMisses must be at least 1, got %d", ErrConfig, c.PresenceMisses)
	}
	return nil
}

// validateTimings refuses a negative duration, and a claim that expires
// before an executor can take it or outlives the command that carries it.
func (c *Config) validateTimings() error {
	for name, d := range map[string]time.Duration{
		"SilentAfter": c.SilentAfter, "ClaimTimeout": c.ClaimTimeout, "CommandTTL": c.CommandTTL,
		"HoldDown": c.HoldDown, "RetryBackoff": c.RetryBackoff, "SettleAfter": c.SettleAfter, "ClockSkew": c.ClockSkew,
		"PresenceGrace": c.PresenceGrace,
	} {
		if d < 0 {
			return fmt.Errorf("%w: %s is negative", ErrConfig, name)
		}
	}
	if c.ClaimTTL() < minClaimTTL {
		return fmt.Errorf("%w: claim_timeout %v must exceed clock_skew %v by at least %v (claims expire at claim_timeout - clock_skew)",
			ErrConfig, c.ClaimTimeout, c.ClockSkew, minClaimTTL)
	}
	if c.ClaimTTL() > c.CommandTTL {
		return fmt.Errorf("%w: claim_timeout - clock_skew (%v) must not exceed command_ttl %v", ErrConfig, c.ClaimTTL(), c.CommandTTL)
	}
	return nil
}

// validate checks one group on its own; its name is the caller's to check
// against the other groups'.
func (g *Group) validate() error {
	if len(g.Addresses) == 0 {
		return fmt.Errorf("%w: group %s has no addresses", ErrConfig, g.Name)
	}
	for _, a := range g.Addresses {
		if _, err := netip.ParsePrefix(a); err != nil {
			return fmt.Errorf("%w: group %s address %q: %v", ErrConfig, g.Name, a, err)
		}
	}
	nodes, err := g.members()
	if err != nil {
		return err
	}
	if err := events.ValidToken("health check", g.HealthCheck); err != nil {
		return fmt.Errorf("%w: group %s: %v", ErrConfig, g.Name, err)
	}
	if err := g.validatePolicies(); err != nil {
		return err
	}
	for _, pc := range g.PeerChecks {
		if err := events.ValidToken("peer check", pc); err != nil {
			return fmt.Errorf("%w: group %s: %v", ErrConfig, g.Name, err)
		}
	}
	return g.validateHealthFrom(nodes)
}

// members checks the group's node list and returns it as a set.
func (g *Group) members() (map[string]bool, error) {
	if len(g.Nodes) == 0 {
		return nil, fmt.Errorf("%w: group %s has no nodes", ErrConfig, g.Name)
	}
	nodes := map[string]bool{}
	for _, n := range g.Nodes {
		if err := events.ValidToken("node", n); err != nil {
			return nil, fmt.Errorf("%w: group %s: %v", ErrConfig, g.Name, err)
		}
		if nodes[n] {
			return nil, fmt.Errorf("%w: group %s lists node %s twice", ErrConfig, g.Name, n)
		}
		nodes[n] = true
	}
	return nodes, nil
}

// validatePolicies checks the group's failback and planned move settings.
func (g *Group) validatePolicies() error {
	if fb := g.Failback; fb.StableFor < 0 || fb.ForceBefore < 0 {
		return fmt.Errorf("%w: group %s: negative failback duration", ErrConfig, g.Name)
	}
	if d := g.Planned.DrainWithin; d < events.MinDrainWithin || d > events.MaxDrainWithin {
		return fmt.Errorf("%w: group %s: planned drain_within %v, want between %v and %v", ErrConfig, g.Name, d, events.MinDrainWithin, events.MaxDrainWithin)
	}
	if w := g.Failback.OnWindowClose; w != WindowCloseWait && w != WindowCloseForce {
		return fmt.Errorf("%w: group %s: on_window_close %q (want wait or force)", ErrConfig, g.Name, w)
	}
	return nil
}

// validateHealthFrom checks the group's borrowed health: each entry is a
// member's, and names another node's check.
func (g *Group) validateHealthFrom(nodes map[string]bool) error {
	for n, hs := range g.HealthFrom {
		if !nodes[n] {
			return fmt.Errorf("%w: group %s: health_from names %s, which is not a member", ErrConfig, g.Name, n)
		}
		if err := events.ValidToken("health_from observer", hs.Observer); err != nil {
			return fmt.Errorf("%w: group %s: health_from %s: %v", ErrConfig, g.Name, n, err)
		}
		if err := events.ValidToken("health_from check", hs.Check); err != nil {
			return fmt.Errorf("%w: group %s: health_from %s: %v", ErrConfig, g.Name, n, err)
		}
		if hs.Observer == n {
			return fmt.Errorf("%w: group %s: health_from %s names itself as observer (leave it out: its own prober counts)", ErrConfig, g.Name, n)
		}
	}
	return nil
}

// validateObservers checks health_from across groups. A member without a
// prober borrows one observer's presence; two observers, or an observer
// that borrows in turn, would make "heard" ambiguous.
func (c *Config) validateObservers() error {
	proxy := map[string]string{}
	for _, g := range c.Groups {
		for n, hs := range g.HealthFrom {
			if o, ok := proxy[n]; ok && o != hs.Observer {
				return fmt.Errorf("%w: node %s takes its health from %s and %s; one observer per node", ErrConfig, n, o, hs.Observer)
			}
			proxy[n] = hs.Observer
		}
	}
	for n, o := range proxy {
		if _, ok := proxy[o]; ok {
			return fmt.Errorf("%w: node %s takes its health from %s, which takes its own from another node", ErrConfig, n, o)
		}
	}
	return nil
}
