package chaos

import "time"

// The bounds a chaos run is judged by. Each is derived from the settings
// the lab runs with (fan's defaults unless lab/stack's templates say
// otherwise); README.md repeats the derivations. If a default changes, the
// derivation here must change with it; loosening a bound to make a run pass
// hides exactly what the run is for.

// Inputs of the partition bound: pkg/platform/bus's client options and the
// ipmover's bus-loss monitor (services/ipmover/internal/busloss).
const (
	natsPingInterval    = 2 * time.Second        // bus.Config.PingInterval default
	natsMaxPingsOut     = 2                      // nats.MaxPingsOutstanding in bus.Connect
	natsReconnectWait   = 250 * time.Millisecond // nats.ReconnectWait in bus.Connect
	natsReconnectJitter = 100 * time.Millisecond // nats.ReconnectJitter (plain TCP)
	natsDialTimeout     = 2 * time.Second        // nats.go's default connect timeout
	busCheckEvery       = 250 * time.Millisecond // bus_loss.check_every default
	busCheckTimeout     = busCheckEvery / 2      // each PING/PONG check times out at half the period
	resyncMargin        = 250 * time.Millisecond // KV read of the group status + netlink delete (busloss.Margin)
)

// PartitionBound is how long, after a link cut or a NATS-only partition
// heals, the node that held the address before the fault may still answer
// ARP for it next to the holder the arbiter chose meanwhile. Under the
// default bus-loss policy (hold) a holder that cannot reach the bus keeps
// its address, by design (invariant 6, docs/invariants.md); it gives it up when contact
// returns and the group status names another holder.
//
// Contact returns at the latest when the NATS client notices its old
// connection is dead and dials again:
//   - a connection whose peer went silent is declared stale at the third
//     ping tick without a pong: (MaxPingsOut+1) × PingInterval = 6 s after
//     the last pong, which was no later than the fault, so no later than 6 s
//     after the heal (a shorter fault may recover sooner through TCP's own
//     retransmission);
//   - a client already reconnecting when the fault heals has a dial in
//     flight (≤ 2 s timeout) before waiting ReconnectWait + jitter and
//     dialing again: ≤ 2.35 s, inside the 6 s above;
//   - after a stale connection the next dial waits ReconnectWait + jitter:
//     350 ms.
//
// Then the ipmover's monitor sees contact at its next check (≤ 250 ms, plus
// its 125 ms round trip) and re-syncs: one KV read and the netlink delete
// (250 ms margin). 6 s + 350 ms + 375 ms + 250 ms = 6.975 s, so 7 s.
const PartitionBound = (natsMaxPingsOut+1)*natsPingInterval + natsReconnectWait + natsReconnectJitter +
	busCheckEvery + busCheckTimeout + resyncMargin + 25*time.Millisecond

// Inputs of the route-partition bound: lab/stack's fan-nats cluster and
// pkg/platform/bus's embedded server.
const (
	routePingInterval   = 2 * time.Second // bus.routePingInterval (fan-nats)
	routeMaxPingsOut    = 2               // Cluster.MaxPingsOut in natsserver.Start
	routeReconnectDelay = time.Second     // nats-server's DEFAULT_ROUTE_RECONNECT
	consumerHeartbeat   = time.Second     // idle heartbeat of the executors' consumers: a stall is noticed in 2 of them
)

// RoutePartitionBound replaces PartitionBound after a RoutePartition heals.
// It is looser because the cut-off server's clients never lose their
// connection: the ipmover's bus-loss monitor keeps seeing its server
// answer, so it neither releases under bus_loss nor reconnects; contact
// with the cluster returns only when the server's routes do. The stalled
// route is closed at the third route ping tick without a pong,
// (MaxPingsOut+1) × 2 s = 6 s after the heal at the latest, and dialled
// again after nats-server's 1 s route reconnect delay; the executor's
// consumer then notices its stall within two idle heartbeats (2 s) and
// resumes, and the release it was sent is applied (the re-sync margin,
// 250 ms). 6 + 1 + 2 + 0.25 = 9.25 s.
const RoutePartitionBound = (routeMaxPingsOut+1)*routePingInterval + routeReconnectDelay + 2*consumerHeartbeat + resyncMargin

// Inputs of the rejoin bound: nats-server's raft and the ipmover's cluster
// check (services/ipmover/internal/busloss).
const (
	raftMaxElection   = 9 * time.Second // nats-server's maxElectionTimeoutDefault (server/raft.go)
	clusterCheckEvery = time.Second     // busloss.DefaultClusterEvery; each check times out at half of it
)

// rejoinElection is what a PBX host's NATS server costs when it comes
// back into the cluster (the colocated topology): while cut off, its raft
// groups campaigned and raised their terms, and nats-server's raft, which
// has no pre-vote, deposes the current leaders when it hears those terms.
// JetStream then has no leader for the state bucket and the command
// stream until one election round ends (at most the largest election
// timeout, 9 s; a split vote takes another round, which no bound here
// covers). Until then the node that held the address before the fault
// cannot read who holds it now, nor receive its release; its cluster check
// sees the leader at the next check (1 s, plus the 500 ms timeout), and its
// re-sync then reads the held group through the leader and gives the
// address up.
const rejoinElection = raftMaxElection + clusterCheckEvery + clusterCheckEvery/2

// RejoinBound replaces PartitionBound after a link cut of a PBX node whose
// host runs one of the cluster's servers heals: 7 + 9 + 1.5 = 17.5 s.
const RejoinBound = PartitionBound + rejoinElection

// RouteRejoinBound replaces RoutePartitionBound in the colocated topology:
// 9.25 + 10.5 = 19.75 s.
const RouteRejoinBound = RoutePartitionBound + rejoinElection

// Inputs of the outage bound: the lab's prober settings (lab/stack), the
// arbiter's policy defaults (services/arbiter/internal/decide) and the
// ipmover's claim settings in the lab config.
const (
	presenceInterval    = 100 * time.Millisecond // prober presence_interval (stack.Options default)
	presenceMisses      = 3                      // policy.presence_misses
	presenceGrace       = 50 * time.Millisecond  // policy.presence_grace
	peerInterval        = 200 * time.Millisecond // peer SIP check interval (stack.Options: Interval)
	peerTimeout         = 150 * time.Millisecond // peer SIP check timeout
	peerFall            = 3                      // misses before the peer check reports down
	arbiterTick         = 25 * time.Millisecond  // the arbiter's timer tick (silence, claim timeouts)
	arbiterClaimTimeout = 5 * time.Second        // policy.claim_timeout: an unconfirmed claim is given up, the next tried
	claimProbeWait      = 100 * time.Millisecond // claim.probe_wait in the lab's ipmover config
	verifyEvery         = 200 * time.Millisecond // verify.every: one retried SIP check before "applied"
	clientSlack         = 50 * time.Millisecond  // the client's 10 ms probes, the GARP's way to the client, scheduling
)

// holderGoneEvidence is how long after a holder vanishes (link cut) the
// arbiter has what it needs to replace it: the node silent (its presence
// beacons missed) and its peer's SIP checks of it failed fall times in a row
// (the first failing check starts within one interval of the cut and each
// times out; the deciding one's decisive_margin may end it sooner, never
// later). The later of the two decides: 750 ms.
const holderGoneEvidence = max(presenceMisses*presenceInterval+presenceGrace,
	peerInterval+(peerFall-1)*peerInterval+peerTimeout)

// OutageBound is the longest the floating IP may go unanswered while at
// least one node is healthy, with the lab's detection settings. The slowest
// fault the schedule injects is a cut link on the holder: nothing on the
// bus says it died, so the arbiter waits for holderGoneEvidence (750 ms)
// and acts at its next tick (25 ms). One claim may be lost (for example sent
// while the arbiter's lease changes hands) and is retried after
// claim_timeout (5 s). The claim on the standby probes ARP (100 ms) and
// verifies SIP (one retry, 200 ms); the client needs 50 ms. A dead PBX is
// found faster (fall × interval = 600 ms), a killed service or a NATS fault
// should cost no answer at all.
// 0.75 + 0.025 + 5 + 0.1 + 0.2 + 0.05 = 6.125 s.
const OutageBound = holderGoneEvidence + arbiterTick + arbiterClaimTimeout + claimProbeWait + verifyEvery + clientSlack

// Observation settings.
const (
	ARPInterval = 20 * time.Millisecond
	SIPInterval = 10 * time.Millisecond
	SIPTimeout  = 300 * time.Millisecond
	// outageMinGap: gaps between answered probes shorter than this are the
	// probe interval and scheduling noise, not outages.
	outageMinGap = 50 * time.Millisecond
)
