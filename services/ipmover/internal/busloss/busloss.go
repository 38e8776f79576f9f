// Package busloss watches this node's contact with the bus and applies the
// bus-loss policy: hold the floating addresses (default) or release them
// once contact has been gone for a lease, before the arbiter can have told
// another node to take them.
//
// Why hold is the default: a holder cut off from the bus but still serving
// phones must not be replaced (invariant 6, docs/invariants.md), and the arbiter does
// not replace it while peers still reach it. Releasing on bus loss turns a
// NATS outage or restart into a phone outage (vip-manager#411). Release is
// for sites that prefer "no holder" to "maybe two" when the bus is gone.
//
// # Lease arithmetic (release)
//
// Let P be the instant contact is lost. The arbiter hears this node's last
// heartbeat no earlier than P − H (H: heartbeat interval) and calls it silent
// only after S more (decide.DefaultSilentAfter, 3 s), so no claim for
// another node is issued before P − H + S. The monitor's last good round
// trip is at or before P; it checks every C (each check times out after
// C/2) and releases at the first check where R has passed since, so by
// P + R + C. Releasing first needs R + C + H + M ≤ S, with M a margin for
// the netlink delete and scheduling. Defaults: R = 1.5 s, C = 250 ms,
// H = 1 s, M = 250 ms: 3.0 s ≤ 3 s. ValidateLease refuses anything else.
package busloss

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// Policy is what to do with held addresses while the bus is unreachable.
type Policy string

const (
	Hold    Policy = "hold"
	Release Policy = "release"
)

// Defaults; see the package comment for how they fit together.
const (
	DefaultReleaseAfter = 1500 * time.Millisecond
	DefaultCheckEvery   = 250 * time.Millisecond
	DefaultHeartbeat    = time.Second
	DefaultSilentAfter  = 3 * time.Second // the arbiter's decide.DefaultSilentAfter
	Margin              = 250 * time.Millisecond
)

// ValidateLease checks the release lease against the arbiter's silence
// threshold: the address must be gone before anyone else can be told to
// take it.
func ValidateLease(releaseAfter, checkEvery, heartbeat, silentAfter time.Duration) error {
	if releaseAfter <= 0 || checkEvery <= 0 || heartbeat <= 0 || silentAfter <= 0 {
		return fmt.Errorf("busloss: durations must be positive")
	}
	if worst := releaseAfter + checkEvery + heartbeat + Margin; worst > silentAfter {
		return fmt.Errorf("busloss: release_after %v + check_every %v + heartbeat %v + margin %v = %v exceeds the arbiter's silent_after %v: another node could be told to claim before this one releases",
			releaseAfter, checkEvery, heartbeat, Margin, worst, silentAfter)
	}
	return nil
}

// Config configures a Monitor.
type Config struct {
	Policy       Policy
	ReleaseAfter time.Duration
	CheckEvery   time.Duration
	// Check does one round trip to the bus (a PING/PONG); nil error means contact.
	Check func(ctx context.Context) error
	// OnRelease is called once per loss, when the lease has run out under
	// the release policy. It must take the addresses off before returning.
	OnRelease func(lostFor time.Duration)
	// OnRegained is called when contact comes back after at least one
	// failed check, under either policy: the executor re-reads desired
	// state (another node may have been given the address meanwhile).
	OnRegained func(lostFor time.Duration)
	// ClusterCheck, when set, asks something only the cluster's majority
	// answers (a raft leader), at most every ClusterEvery while Check
	// succeeds. On a NATS server shared with this host, Check keeps
	// answering while the host is cut off from the other servers: the
	// commands and the group status that moved the address meanwhile reach
	// this node only once the server is back in the cluster, and nothing
	// would tell the executor to look. Its failure is not a loss of the
	// bus (a raft election elsewhere fails it too, while the arbiter still
	// hears this node), so it never releases; its recovery calls
	// OnRegained like the bus's.
	ClusterCheck func(ctx context.Context) error
	ClusterEvery time.Duration // default DefaultClusterEvery
	Logger       *slog.Logger
}

// DefaultClusterEvery is how often the cluster is asked (each time out
// after half of it).
const DefaultClusterEvery = time.Second

// Run checks contact until ctx ends.
func Run(ctx context.Context, cfg Config) {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log = log.With("component", "busloss", "policy", cfg.Policy)
	if cfg.ClusterEvery <= 0 {
		cfg.ClusterEvery = DefaultClusterEvery
	}
	// OnRegained is called from this loop and from the cluster's, one at a
	// time.
	var regainMu sync.Mutex
	regained := func(lostFor time.Duration) {
		regainMu.Lock()
		defer regainMu.Unlock()
		if cfg.OnRegained != nil {
			cfg.OnRegained(lostFor)
		}
	}
	// The cluster is asked in a loop of its own, so that its slower round
	// trip never delays this loop's checks: the release lease (package
	// comment) has no slack for it.
	var localOK atomic.Bool
	localOK.Store(true)
	if cfg.ClusterCheck != nil {
		done := make(chan struct{})
		defer func() { <-done }()
		go func() { defer close(done); watchCluster(ctx, cfg, &localOK, regained, log) }()
	}
	lastOK := time.Now()
	var lost, released bool
	t := time.NewTicker(cfg.CheckEvery)
	defer t.Stop()
	for {
		cctx, cancel := context.WithTimeout(ctx, cfg.CheckEvery/2)
		err := cfg.Check(cctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		now := time.Now()
		switch {
		case err == nil:
			if lost {
				log.Info("bus contact regained", "lost_for", now.Sub(lastOK))
				regained(now.Sub(lastOK))
			}
			lastOK, lost, released = now, false, false
			localOK.Store(true)
		default:
			if !lost {
				log.Warn("bus contact lost", "err", err)
			}
			lost = true
			localOK.Store(false)
			if cfg.Policy == Release && !released && now.Sub(lastOK) >= cfg.ReleaseAfter {
				released = true
				log.Warn("bus lease ran out: releasing every held address", "lost_for", now.Sub(lastOK))
				if cfg.OnRelease != nil {
					cfg.OnRelease(now.Sub(lastOK))
				}
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// watchCluster asks the cluster every ClusterEvery while this node's own
// server answers, and calls regained when the cluster answers again after
// it did not. While the own server is lost, the bus loop's own recovery
// re-syncs, so a cluster loss seen meanwhile is forgotten.
func watchCluster(ctx context.Context, cfg Config, localOK *atomic.Bool, regained func(time.Duration), log *slog.Logger) {
	t := time.NewTicker(cfg.ClusterEvery)
	defer t.Stop()
	lastOK, lost := time.Now(), false
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if !localOK.Load() {
			lastOK, lost = time.Now(), false
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, cfg.ClusterEvery/2)
		err := cfg.ClusterCheck(cctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		now := time.Now()
		switch {
		case err == nil && lost:
			log.Info("cluster contact regained", "lost_for", now.Sub(lastOK))
			regained(now.Sub(lastOK))
			lastOK, lost = now, false
		case err == nil:
			lastOK = now
		case !lost:
			log.Warn("cluster contact lost: this node's NATS server answers, the cluster's leaders do not", "err", err)
			lost = true
		}
	}
}
