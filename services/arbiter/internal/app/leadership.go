package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/services/arbiter/internal/decide"
	"github.com/fanpbx/fan/services/arbiter/internal/lease"
	"github.com/nats-io/nats.go/jetstream"
)

// leadership switches the core. A new leader first restores what the
// previous one persisted, so it continues from the same holder and claim.
func (a *arbiter) leadership(ctx context.Context, ch lease.Change) {
	// What kept the last term from storing is not this term's.
	a.trouble.set(&a.trouble.persist, "")
	a.trouble.set(&a.trouble.command, "")
	if ch.Leading {
		a.restoring.reset()
		a.restoreEpoch = ch.Epoch
		a.tryRestore(ctx, time.Now())
		return
	}
	a.restoring.reset()
	a.unwritable.reset()
	a.commandEpoch = 0
	if err := a.core.SetLeadership(ch.Epoch, false); err != nil {
		a.log.Error("leadership change refused by the core", "epoch", ch.Epoch, "err", err)
		return
	}
	a.log.Info("leadership", "leading", false, "epoch", ch.Epoch)
}

// tryRestore is one attempt to restore the state of the term just taken
// and, if it works, to start commanding. Without the previous state this
// replica could command a second holder, so it does not command; but it
// holds the lease, so every other replica is kept from commanding too:
// after restore_within it gives the lease up (see giveUp).
func (a *arbiter) tryRestore(ctx context.Context, now time.Time) {
	epoch := a.restoreEpoch
	// An attempt never runs past the bound: a read that hangs (no raft
	// leader) must not stretch the time the lease is held for nothing.
	budget := a.cfg.RestoreWithin.D()
	if a.restoring.failing() {
		budget -= now.Sub(a.restoring.since)
	}
	rctx, cancel := context.WithTimeout(ctx, max(min(retryMax, budget), 50*time.Millisecond))
	st, err := a.restore(rctx)
	cancel()
	if err == nil && (!a.lease.Leading() || a.lease.Epoch() != epoch) {
		a.restoring.reset()
		a.conds.Clear(condRestoreFailed)
		a.log.Warn("restore finished after the lease was lost; not commanding", "epoch", epoch)
		return
	}
	if err != nil {
		over := a.restoring.failed(now)
		a.conds.Raise(condRestoreFailed, fmt.Sprintf("holding the lease (epoch %d) without commanding since %s: %v",
			epoch, a.restoring.since.UTC().Format(time.RFC3339Nano), err))
		a.metrics.restoreFailures.Inc()
		if over {
			a.log.Error("cannot restore arbiter state within restore_within; releasing the lease", "epoch", epoch,
				"restore_within", a.cfg.RestoreWithin.D().String(), "err", err)
			a.giveUp(ctx, now, "restore_failed")
			return
		}
		a.log.Warn("cannot restore arbiter state; not commanding, retrying", "epoch", epoch,
			"retry_in", a.restoring.next.Sub(now).String(), "err", err)
		return
	}
	a.restoring.reset()
	a.conds.Clear(condRestoreFailed)
	if err := a.core.SetLeadership(epoch, true); err != nil {
		a.log.Error("leadership change refused by the core", "epoch", epoch, "err", err)
		return
	}
	a.commandEpoch = epoch
	a.log.Info("leadership", "leading", true, "epoch", epoch)
	a.recordTerm(epoch)
	a.reissueUnsentClaims(ctx, st)
}

// retryStuck runs the retries that are due, and clears the conditions of a
// release once this replica may campaign again.
func (a *arbiter) retryStuck(ctx context.Context, now time.Time) {
	if a.restoring.due(now) {
		a.tryRestore(ctx, now)
	}
	if a.unwritable.due(now) {
		if err := a.persist(ctx); err != nil {
			a.persistFailed(ctx, now, err)
		} else {
			a.persisted()
		}
	}
	if !a.releasedUntil.IsZero() && !now.Before(a.releasedUntil) {
		a.releasedUntil = time.Time{}
		if !a.restoring.failing() {
			a.conds.Clear(condRestoreFailed)
		}
		if !a.unwritable.failing() {
			a.conds.Clear(condStateUnwritable)
		}
	}
}

// giveUp releases the lease so that another replica can take over, and
// keeps this one from campaigning for a lease TTL (long enough for every
// other replica to campaign at least twice).
func (a *arbiter) giveUp(ctx context.Context, now time.Time, reason string) {
	epoch := a.lease.Epoch()
	a.restoring.reset()
	a.unwritable.reset()
	holdOff := a.cfg.LeaseTTL.D()
	// Counted first: once the lease is gone another replica, or an
	// operator reading /metrics, may look, and the count must be there.
	a.metrics.releases.WithLabelValues(reason).Inc()
	a.lease.Release(ctx, holdOff, reason)
	a.releasedUntil = now.Add(holdOff)
	a.commandEpoch = 0
	if err := a.core.SetLeadership(epoch, false); err != nil {
		a.log.Error("leadership change refused by the core", "epoch", epoch, "err", err)
	}
}

// commanding reports whether this replica leads and has restored its term:
// only then does it answer operators and write group status (a follower's
// view written there would overwrite the holder a successor may need).
func (a *arbiter) commanding() bool {
	return a.commandEpoch != 0 && a.lease.Leading() && a.lease.Epoch() == a.commandEpoch
}

func (a *arbiter) restore(ctx context.Context) (decide.State, error) {
	var st decide.State
	// Through the bucket's raft leader, not a direct get: any replica may
	// answer one, and a replica on a host just back from a partition
	// answers with the state from before it, the holder the last term
	// moved the group away from. A new leader that restored that would
	// write it back as the group's status and take the address from the
	// node that holds it.
	raw, err := a.bus.LeaderGetKV(ctx, events.StateBucket, events.ArbiterStateKey(a.cfg.Cluster))
	if err != nil {
		return st, fmt.Errorf("read arbiter state: %w", err)
	}
	if raw == nil {
		return st, nil
	}
	// A record that cannot be decoded or restored is corrupt: it will not
	// get better by reading it again, and a leader that refuses to command
	// until it does is stuck for good. Start from a view rebuilt from the
	// group status instead (see rebuild).
	if err := json.Unmarshal(raw, &st); err != nil {
		return a.rebuild(ctx, fmt.Errorf("decode arbiter state (%d bytes): %w", len(raw), err))
	}
	// Not knowing whether the outstanding claim was answered, this replica
	// does not command: the restore is tried again (within restore_within).
	if err := a.replayClaimResults(ctx, st); err != nil {
		return st, err
	}
	if err := a.core.Restore(st); err != nil {
		return a.rebuild(ctx, fmt.Errorf("restore arbiter state: %w", err))
	}
	return st, nil
}

// reissueUnsentClaims looks for each restored outstanding claim in the
// command stream. The previous leader persists before it publishes, so a
// claim it recorded may never have been sent; and since this replica's
// lease is now the last word on the lease subject, the server's fence
// refuses anything the previous leader might still try. A claim that is
// not in the stream now never will be: the core issues the move again
// instead of waiting out the claim timeout with nobody holding. When the
// stream cannot be read the claim is left to the timeout, which is slow
// but safe.
func (a *arbiter) reissueUnsentClaims(ctx context.Context, st decide.State) {
	for _, g := range st.Groups {
		cl := g.Claim
		if cl == nil || !time.Now().Before(cl.Deadline) {
			continue
		}
		sent, err := a.claimInStream(ctx, *cl)
		if err != nil {
			a.log.Warn("restore: cannot tell whether the outstanding claim was sent; waiting for its deadline",
				"group", g.Name, "node", cl.Node, "command_id", cl.CommandID, "err", err)
			continue
		}
		if sent {
			continue
		}
		a.log.Warn("restore: the previous leader's claim never reached the bus; issuing the move again",
			"group", g.Name, "node", cl.Node, "command_id", cl.CommandID)
		a.execute(ctx, a.core.ClaimUnsent(time.Now(), cl.CommandID))
	}
}

// claimInStream reports whether the claim is stored in the command stream.
// Commands leave the stream at their deadline (message TTL), so only the
// few live claims for that node are walked.
func (a *arbiter) claimInStream(ctx context.Context, cl decide.Claim) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	st, err := a.bus.JS.Stream(ctx, bus.CommandsStream)
	if err != nil {
		return false, fmt.Errorf("open the command stream: %w", err)
	}
	subject := events.CommandSubject(a.cfg.Cluster, cl.Node, events.VerbClaim)
	for seq := uint64(1); ; {
		m, err := st.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(subject))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return false, nil
		}
		if err != nil {
			return false, fmt.Errorf("read claims on %s from sequence %d: %w", subject, seq, err)
		}
		if m.Header.Get(jetstream.MsgIDHeader) == cl.CommandID {
			return true, nil
		}
		seq = m.Sequence + 1
	}
}

// replayClaimResults feeds the core, still following, the results already
// in the trail for claims the previous leader left outstanding. A replica
// that starts after the previous leader died never saw them (it reads new
// events only), and would otherwise time out a claim that was in fact
// applied, releasing a healthy holder: a needless outage and move.
func (a *arbiter) replayClaimResults(ctx context.Context, st decide.State) error {
	for _, g := range st.Groups {
		if g.Claim == nil {
			continue
		}
		// Any result to this claim comes after it was issued, which is
		// at most the command TTL before its deadline. Every result stored
		// since then is read, as many as the consumer says are pending when
		// it is made (none: nothing to wait for): a result missed here
		// would make the claim look unanswered, and the core would move a
		// group its claimant holds.
		since := g.Claim.Deadline.Add(-2 * time.Minute)
		cons, err := a.bus.JS.OrderedConsumer(ctx, bus.EventsStream, jetstream.OrderedConsumerConfig{
			FilterSubjects: []string{events.CommandResultSubject(a.cfg.Cluster, g.Claim.Node)},
			DeliverPolicy:  jetstream.DeliverByStartTimePolicy, OptStartTime: &since,
		})
		if err != nil {
			return fmt.Errorf("read the results of group %s's outstanding claim on %s: %w", g.Name, g.Claim.Node, err)
		}
		info, err := cons.Info(ctx)
		if err != nil {
			return fmt.Errorf("read the results of group %s's outstanding claim on %s: %w", g.Name, g.Claim.Node, err)
		}
		for left := info.NumPending; left > 0; {
			batch, err := cons.Fetch(int(min(left, 256)), jetstream.FetchMaxWait(time.Second))
			if err != nil {
				return fmt.Errorf("read the results of group %s's outstanding claim on %s: %w", g.Name, g.Claim.Node, err)
			}
			n := uint64(0)
			for m := range batch.Messages() {
				n++
				env, p, _ := a.bus.DecodeFrom(m.Subject(), m.Data())
				if r, ok := p.(*events.CommandResult); ok && r.CommandID == g.Claim.CommandID {
					a.core.Handle(time.Now(), env, p)
					a.log.Info("restore: outstanding claim already answered", "group", g.Name, "node", r.Node, "outcome", r.Outcome)
				}
			}
			if err := batch.Error(); err != nil {
				return fmt.Errorf("read the results of group %s's outstanding claim on %s: %w", g.Name, g.Claim.Node, err)
			}
			if n == 0 && ctx.Err() != nil {
				return fmt.Errorf("read the results of group %s's outstanding claim on %s: %w", g.Name, g.Claim.Node, ctx.Err())
			}
			left -= min(n, left)
		}
	}
	return nil
}

// recordTerm stores, ahead of this term's first decision, the state the
// term began from (as restored: an outstanding claim the trail had already
// answered is confirmed), so that a replay of the decisions can begin here
// (fanctl replay) and not only at an arbiter's start. The per-node view is
// left out: it is informational, and the replay rebuilds it from the trail.
func (a *arbiter) recordTerm(epoch uint64) {
	b, err := stateRecord(a.core.Snapshot())
	if err == nil {
		_, err = a.ob.Post("", events.ArbiterTerm{State: b, Input: a.core.Input(), InputAudit: a.core.InputAudit(),
			InputLive: a.core.InputLive(), Since: a.core.FirstInput(), Policy: a.core.ConfigDigest()}, events.WithEpoch(epoch))
	}
	if err != nil {
		a.log.Warn("term start not recorded: a replay cannot begin at this term", "epoch", epoch, "err", err)
	}
}
