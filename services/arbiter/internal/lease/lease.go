// Package lease elects one arbiter leader through a lease kept in the
// command stream, and fences every command the leader publishes.
//
// The lease is a message on events.LeaseSubject(cluster, "arbiter") with a
// per-message TTL. A candidate acquires it by publishing with "expect no
// message on this subject"; the leader renews by publishing with "expect
// my last lease message". The epoch of a term is the stream sequence of the
// acquiring message: it only grows, across leaders and restarts.
//
// Fencing is enforced by the server, not only by executors: every command is
// published with "expect the lease subject's last sequence to be mine". Once
// the lease has expired or another leader took it, a stale leader's command
// is rejected by JetStream itself (err 10071) and never reaches an executor.
//
// A leader that cannot renew stops commanding at a local deadline measured
// on the monotonic clock from before its last successful renewal was sent,
// minus a margin; the server can only expire the lease later than that.
//
// Only a valid successor deposes a leader. A successor acquires with "expect
// no message on this subject", which the server grants only once every
// record of the previous term has expired; so while the leader's own last
// record is still stored, a newer record on the subject was written by
// someone who did not follow the protocol (a forgery, or a client with a
// stolen arbiter key), and the leader renews over it instead of stepping
// down. Likewise a record older than the TTL (a forgery written without a
// TTL, or with a longer one) does not block the lease: any candidate takes
// it over, conditional on that record's sequence, so only one wins.
package lease

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/nats-io/nats.go/jetstream"
)

// ErrNotLeader is returned when publishing a fenced command without a valid lease.
var ErrNotLeader = errors.New("not the leader")

// Config tunes the lease. TTL has whole-second granularity on the server.
type Config struct {
	Cluster string
	// Holder names this candidate (node plus instance) in the lease record.
	Holder string
	TTL    time.Duration
	// RenewEvery defaults to TTL/3, so two renewals can fail before the
	// local deadline passes.
	RenewEvery time.Duration
	// Margin is kept between the local deadline and the server's expiry.
	Margin time.Duration
	// MayHold, when set, is asked before every campaign and renewal (with
	// whether this replica leads now). While it says no, a follower does
	// not campaign and a leader stops commanding and stops renewing: its
	// lease message expires within TTL and another replica takes over.
	MayHold func(leading bool) bool
}

// Change reports a leadership change to the owner.
type Change struct {
	Leading bool
	Epoch   uint64
}

// Lease campaigns for and holds the arbiter lease.
type Lease struct {
	cfg     Config
	js      jetstream.JetStream
	b       *bus.Bus
	records *bus.LeaseRecords // opened at the first need
	log     *slog.Logger
	subject string
	now     func() time.Time

	mu         sync.Mutex
	leading    bool
	epoch      uint64
	lastSeq    uint64
	validUntil time.Time
	// holdOffUntil: after Release, no campaign before this time.
	holdOffUntil time.Time
}

// New prepares a lease; Run campaigns.
func New(cfg Config, b *bus.Bus, log *slog.Logger) (*Lease, error) {
	if cfg.TTL < time.Second || cfg.TTL%time.Second != 0 {
		return nil, fmt.Errorf("lease ttl %v: must be whole seconds, at least 1s", cfg.TTL)
	}
	if cfg.RenewEvery == 0 {
		cfg.RenewEvery = cfg.TTL / 3
	}
	if cfg.Margin == 0 {
		cfg.Margin = cfg.TTL / 4
	}
	if cfg.RenewEvery+cfg.Margin >= cfg.TTL {
		return nil, fmt.Errorf("lease: renew_every %v + margin %v must stay below ttl %v", cfg.RenewEvery, cfg.Margin, cfg.TTL)
	}
	return &Lease{cfg: cfg, js: b.JS, b: b, log: log, subject: events.LeaseSubject(cfg.Cluster, "arbiter"), now: time.Now}, nil
}

// Run campaigns and renews until ctx ends, reporting every change on
// changes (which it closes on return). On return it is no longer leading.
func (l *Lease) Run(ctx context.Context, changes chan<- Change) {
	defer close(changes)
	t := time.NewTimer(0)
	defer t.Stop()
	// reported is what the owner was last told; leadership can also be lost
	// inside PublishCommand or by the clock, and the owner must hear of it.
	reported, reportedEpoch := false, uint64(0)
	for {
		select {
		case <-ctx.Done():
			l.stepDown("stopping")
			if reported {
				changes <- Change{Leading: false, Epoch: reportedEpoch}
			}
			return
		case <-t.C:
		}
		l.attempt(ctx)
		now, epoch := l.Leading(), l.Epoch()
		if reported && now && epoch != reportedEpoch {
			// The term ended and a new one began between two looks (the
			// deadline passed while the bus was away, and the first attempt
			// after took the lease again): the owner ends the old term
			// before it commands in the new one, or it would keep stamping
			// commands with an epoch the lease refuses.
			changes <- Change{Leading: false, Epoch: reportedEpoch}
			reported = false
		}
		if now != reported {
			changes <- Change{Leading: now, Epoch: epoch}
			reported, reportedEpoch = now, epoch
		}
		t.Reset(l.cfg.RenewEvery)
	}
}

func (l *Lease) attempt(ctx context.Context) {
	l.mu.Lock()
	defer l.mu.Unlock()
	sent := l.now()
	if !l.leading && sent.Before(l.holdOffUntil) {
		return // released on purpose: let another replica have it first
	}
	if l.cfg.MayHold != nil && !l.cfg.MayHold(l.leading && sent.Before(l.validUntil)) {
		if l.leading {
			l.leading = false
			l.log.Info("handing the arbiter lease back", "epoch", l.epoch)
			// Deleting the term's messages lets the other replica take the
			// lease at its next campaign instead of after the TTL.
			if sent.Before(l.validUntil) {
				dctx, cancel := context.WithTimeout(ctx, l.validUntil.Sub(sent))
				if err := l.deleteTerm(dctx); err != nil {
					l.log.Warn("lease handback: could not delete the lease messages; they expire with their ttl", "epoch", l.epoch, "err", err)
				}
				cancel()
			}
		}
		return
	}
	if l.leading && sent.After(l.validUntil) {
		l.leading = false
		l.log.Warn("lease deadline passed without a renewal: stepped down", "epoch", l.epoch)
	}
	expect := uint64(0)
	if l.leading {
		expect = l.lastSeq
	}
	actx, cancel := context.WithTimeout(ctx, l.cfg.RenewEvery)
	defer cancel()
	ack, err := l.publishRecord(actx, sent, expect)
	if isWrongSequence(err) {
		// Someone else's record is last: take over only a record that does
		// not count (see the package comment).
		if over, ok := l.overridable(actx); ok {
			ack, err = l.publishRecord(actx, sent, over)
		}
	}
	switch {
	case err == nil:
		if !l.leading {
			l.epoch = ack.Sequence
			l.log.Info("acquired the arbiter lease", "epoch", l.epoch, "holder", l.cfg.Holder)
		}
		l.leading = true
		l.lastSeq = ack.Sequence
		l.validUntil = sent.Add(l.cfg.TTL - l.cfg.Margin)
	case isWrongSequence(err):
		if l.leading {
			l.log.Warn("lease taken over by another arbiter: stepped down", "epoch", l.epoch)
		}
		l.leading = false
	default:
		// Unknown outcome (timeout, no quorum): keep the lease until the
		// local deadline, which the next attempt checks.
		l.log.Warn("lease renewal failed", "leading", l.leading, "err", err)
	}
}

// publishRecord publishes a lease record conditional on the subject's last
// sequence being expect (0: no record). A record that starts a term carries
// no epoch: its own sequence is the term (events.LeaseRecord).
func (l *Lease) publishRecord(ctx context.Context, at time.Time, expect uint64) (*jetstream.PubAck, error) {
	rec := events.LeaseRecord{Holder: l.cfg.Holder, At: at.UTC()}
	if l.leading {
		rec.Epoch = l.epoch
	}
	data, _ := json.Marshal(rec)
	return l.js.Publish(ctx, l.subject, data,
		jetstream.WithExpectLastSequencePerSubject(expect), jetstream.WithMsgTTL(l.cfg.TTL))
}

// overridable reports whether the subject's last record may be published
// over, and its sequence: a leader whose own last record is still stored and
// younger than ttl - margin faces no valid successor; a candidate may take a
// record older than the TTL. Ages are the server's storage times against
// this host's clock, so the two rules never both hold for one record: a
// candidate takes a record only once it is older than the TTL, by which time
// its writer no longer renews over anything (a server may remove expired
// records a little late, so presence alone proves nothing). Caller holds mu.
func (l *Lease) overridable(ctx context.Context) (uint64, bool) {
	if l.records == nil {
		r, err := l.b.LeaseRecords(ctx, events.ArbiterLease)
		if err != nil {
			l.log.Warn("cannot read lease records", "err", err)
			return 0, false
		}
		l.records = r
	}
	last, stored, found, err := l.records.LastStored(ctx)
	if err != nil || !found {
		return 0, false // gone meanwhile: the next attempt acquires normally
	}
	now := l.now()
	if l.leading {
		mine, ok, err := l.records.StoredAt(ctx, l.lastSeq)
		if err == nil && ok && now.Sub(mine) < l.cfg.TTL-l.cfg.Margin {
			l.log.Warn("lease record written over this term by no valid successor; renewing over it",
				"epoch", l.epoch, "own_seq", l.lastSeq, "foreign_seq", last)
			return last, true
		}
		return 0, false
	}
	// A few seconds of clock skew between hosts only delays or hastens the
	// takeover of a record that is dead anyway.
	if age := now.Sub(stored); age > l.cfg.TTL {
		l.log.Warn("lease record older than the ttl still stored (not written by a fan arbiter's rules); taking over",
			"seq", last, "age", age.Round(time.Millisecond), "ttl", l.cfg.TTL)
		return last, true
	}
	return 0, false
}

func isWrongSequence(err error) bool {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		return apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
			apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant
	}
	return false
}

func (l *Lease) stepDown(why string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.leading {
		l.leading = false
		l.log.Info("released arbiter leadership", "epoch", l.epoch, "why", why)
	}
}

// Release gives up the lease at once, for a leader that cannot command
// (its state unreadable, its decisions unpersistable), and keeps this
// replica from campaigning again for holdOff so that another can take it.
// It deletes this term's lease messages (the acquisition and every
// renewal not yet expired) by sequence. Every lease message between the
// term's first and last sequence is this replica's (a candidate can only
// publish on an empty subject), so a successor's lease is never touched;
// once they are gone any other replica's campaign succeeds and every
// command still fenced by this term is refused by the server. If a delete
// fails the rest expire with their TTL, as after a crash.
func (l *Lease) Release(ctx context.Context, holdOff time.Duration, why string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	l.holdOffUntil = now.Add(holdOff)
	if !l.leading {
		return
	}
	l.leading = false
	l.log.Warn("released the arbiter lease", "epoch", l.epoch, "why", why, "campaign_in", holdOff.String())
	if !now.Before(l.validUntil) {
		return // the server expires it (or already has)
	}
	dctx, cancel := context.WithTimeout(ctx, l.validUntil.Sub(now))
	defer cancel()
	if err := l.deleteTerm(dctx); err != nil {
		l.log.Warn("lease release: could not delete the lease messages; they expire with their ttl", "epoch", l.epoch, "err", err)
	}
}

func (l *Lease) deleteTerm(ctx context.Context) error {
	st, err := l.js.Stream(ctx, bus.CommandsStream)
	if err != nil {
		return fmt.Errorf("open the command stream: %w", err)
	}
	for seq := l.epoch; seq <= l.lastSeq; {
		m, err := st.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(l.subject))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read lease message from sequence %d: %w", seq, err)
		}
		if m.Sequence > l.lastSeq {
			return nil
		}
		if err := st.DeleteMsg(ctx, m.Sequence); err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
			return fmt.Errorf("delete lease message %d: %w", m.Sequence, err)
		}
		seq = m.Sequence + 1
	}
	return nil
}

// Leading reports whether this instance may command right now.
func (l *Lease) Leading() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.leading && l.now().Before(l.validUntil)
}

// Epoch is the current (or last) term's epoch.
func (l *Lease) Epoch() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.epoch
}

// PublishCommand publishes a command fenced by the lease: the server rejects
// it unless the lease's last message is still ours. It holds the lease lock
// so a concurrent renewal cannot change the expected sequence mid-publish.
func (l *Lease) PublishCommand(ctx context.Context, env events.Envelope, cmd events.Command) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.leading || !l.now().Before(l.validUntil) {
		return fmt.Errorf("publish %s: %w", env.ID, ErrNotLeader)
	}
	if env.Epoch != l.epoch {
		return fmt.Errorf("publish %s: epoch %d is not the lease's %d: %w", env.ID, env.Epoch, l.epoch, ErrNotLeader)
	}
	err := l.b.Publish(ctx, env, cmd, jetstream.WithExpectLastSequenceForSubject(l.lastSeq, l.subject))
	if isWrongSequence(err) {
		// A record that is no valid successor does not depose: renew over
		// it and publish again, once.
		if over, ok := l.overridable(ctx); ok {
			if ack, rerr := l.publishRecord(ctx, l.now(), over); rerr == nil {
				l.lastSeq = ack.Sequence
				err = l.b.Publish(ctx, env, cmd, jetstream.WithExpectLastSequenceForSubject(l.lastSeq, l.subject))
			}
		}
	}
	if isWrongSequence(err) {
		l.leading = false
		l.log.Warn("command rejected by the server's fence: stepped down", "epoch", l.epoch, "event_id", env.ID)
		return fmt.Errorf("publish %s: %w: %v", env.ID, ErrNotLeader, err)
	}
	return err
}
