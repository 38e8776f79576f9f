// Package decide is the arbiter's decision core: events in, decisions and
// commands out, with the time passed in. It does no I/O, starts no
// goroutines and never reads the clock, so every rule can be driven by a
// table test and replayed from the audit stream: each decision carries the
// core's clock, what made it decide and the last input it had read
// (events.ArbiterDecision), and services/arbiter/internal/replay (behind
// `fanctl replay`) feeds the stored inputs back through a Core and compares
// what it decides with what was recorded.
//
// # What the core believes
//
// Per node it keeps the arbiter's view, not the truth:
//
//   - observations: the last known state of every check, keyed by the node
//     whose prober ran it (the observer) and the check name. A HealthTransition
//     sets one; a NodeHeartbeat carries them all (level-triggered), so a missed
//     transition is repaired by the next heartbeat. An observation never moves
//     backwards: a state whose Since is older than the one held is ignored.
//   - bus presence: when the node's last heartbeat arrived (the arbiter's
//     time, not the node's). A node is silent on the bus once that is older
//     than max(SilentAfter, 3 × its advertised heartbeat interval). A node
//     never heard from counts from the first time the core was given.
//
// A node is eligible to hold a group when it has heartbeated, is not silent,
// and its own prober reports the group's HealthCheck up. Silent nodes are not
// eligible because their executor reads commands from the same bus.
//
// Per group it keeps the confirmed holder, at most one outstanding claim, the
// nodes whose claim just failed (excluded for RetryBackoff), the time of the
// last move and the last hold it explained.
//
// # Rules
//
//   - No holder and no claim: claim on the highest-priority eligible node
//     (place). Right after start the core waits up to SettleAfter for
//     higher-priority nodes it has never heard from, so whichever prober
//     starts first does not win the address for good.
//   - The holder is down when its own prober reports the check down, or when
//     it is silent on the bus and the fresh peers that have an opinion all
//     report it down (at least one). For a holder that sends beacons, silent
//     on the bus here means its beacons stopped: heartbeats that arrive late
//     through the live stream do not make it so (busSilent). A silent holder that a peer still
//     reaches, or that no peer has an opinion on, is held (invariant
//     6 in docs/invariants.md: only move when clients are hurt). A down holder is replaced
//     by the highest-priority other eligible node (failover): release to the
//     old holder, then claim on the new one.
//   - A claim is confirmed by an applied (or duplicate) CommandResult. A
//     failed, expired or stale-epoch result, no result within ClaimTimeout,
//     or the claimant turning ineligible meanwhile, releases the claimant and
//     claims the next eligible node (retry); if none is left the group holds
//     with no holder and is placed again when a node becomes eligible.
//   - Failback only under a FailbackPermit in force (the scheduler's window),
//     past the hold-down, to the highest-priority eligible node above the
//     holder that has been healthy and heard for StableFor, with replication
//     back to it caught up when required, and with the holder's calls
//     drained (or the window closing and the policy says force). Each wait
//     is explained once per holder's tenure and term.
//   - Hold-down: every move is stamped and State shows HoldDownUntil; no
//     discretionary move (failback) may happen within HoldDown of the last
//     one. A hurt group (holder down, or no holder at all) is exempt: phones
//     that get no answer hurt more than a second move in a short time.
//   - Move cap: more than MaxMovesPerHour automatic moves (failover and
//     failback) in any hour freezes the group (a NeedsHuman hold) until an
//     operator turns its maintenance off.
//   - Claims expire at ClaimTimeout - ClockSkew (see Config.ClaimTTL), so a
//     claim the core gave up can no longer start being applied; releases
//     carry now+CommandTTL.
//   - Operator actions (Operate) are recorded as an OperatorAction that the
//     decisions they cause cite; maintenance freezes automatic moves, a
//     standby node holds nothing. They need a healthy target but ignore the
//     hold-down and the cap.
//   - Planned moves (an operator's switchover or node standby) wait until
//     the holder has at most the group's drain limit of channels that no
//     move carries across: with its current calls summary, those not in a
//     carriable call; without one, every active channel of its heartbeat
//     (unknown is not drained). They wait up to a deadline; then they give
//     up, or move anyway when asked to (force_after); "now" moves at once.
//     A move away from a holder records (and cites) what its last calls
//     summary said was up, so the trail tells what was carried and lost.
//     Each stage is a PlannedMove citing the operator's action; a failover
//     overrides a waiting move. The wait is persisted and restored.
//   - Holds are explained once per change of situation, never per event.
//
// # Leadership and causation
//
// Only a leader decides. While not leading the core keeps observing (a warm
// standby) but its group state is frozen and it emits nothing, not even
// decisions, so the audit stream never holds two explanations of one
// moment. A new leader calls Restore with the last persisted State and then
// SetLeadership; commands carry its epoch and a deadline.
//
// The core never builds envelopes. Each Emit carries the payload and the
// options the shell passes to events.New: a pre-assigned id from
// Config.NewID (so a decision can list its commands' ids), the causation
// (a decision is caused by the event that triggered it; its commands by the
// decision), and the epoch. Within one Output a decision precedes its
// commands, and a release precedes the claim it makes room for.
package decide
