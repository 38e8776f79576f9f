package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/services/arbiter/internal/steward"
	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
)

// The leaders hold (events.LeadersHoldRecord): an operator asks the leader
// (fanctl leaders hold), which checks the request, records it, writes the
// hold to the state bucket and records its start; every replica watches
// the record. While it is in force the steward moves no raft leader but
// onto the hold's server, and a standby replica that leads keeps the lease
// instead of handing it back. The leader ends it when its end comes, when
// an operator releases it, or when the steward breaks it (steward package:
// only when keeping it would cost a failover). The decision core has no
// part in it: it is about where the bus's leaders are, not where a group's
// address is.

// leadersHold is this replica's copy of the hold record.
type leadersHold struct {
	mu  sync.Mutex
	rec events.LeadersHoldRecord
}

func (h *leadersHold) onKey(_ string, value []byte, deleted bool, _ uint64) {
	var rec events.LeadersHoldRecord
	if !deleted && json.Unmarshal(value, &rec) != nil {
		return // not fan's record: keep what we had
	}
	h.mu.Lock()
	h.rec = rec
	h.mu.Unlock()
}

// get is the last record read (zero: none).
func (h *leadersHold) get() events.LeadersHoldRecord {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.rec
}

// inForce reports whether a hold holds at now.
func (h *leadersHold) inForce(now time.Time) bool { return h.get().InForce(now) }

// forSteward is the hold in force as the steward obeys it.
func (h *leadersHold) forSteward() steward.Hold {
	r := h.get()
	if !r.InForce(time.Now()) {
		return steward.Hold{}
	}
	return steward.Hold{ID: r.EventID, Server: r.Server}
}

// writeTrouble says why the leader cannot store its state or a command
// now, for the steward (which runs beside the decision loop).
type writeTrouble struct {
	persist, command atomic.Pointer[string]
}

func (w *writeTrouble) set(p *atomic.Pointer[string], why string) {
	if why == "" {
		p.Store(nil)
		return
	}
	p.Store(&why)
}

func (w *writeTrouble) String() string {
	var parts []string
	for _, p := range []*atomic.Pointer[string]{&w.persist, &w.command} {
		if s := p.Load(); s != nil {
			parts = append(parts, *s)
		}
	}
	return strings.Join(parts, "; ")
}

// holdWriteTimeout bounds one write of the hold record; the operator's
// client waits a few seconds for the answer.
const holdWriteTimeout = 2 * time.Second

// operateLeaders answers a leaders hold or release; the request is
// already recorded (requested). Like the core's actions, the outcome is an
// OperatorAction citing the request, and what it did cites the outcome.
func (a *arbiter) operateLeaders(ctx context.Context, req events.OperatorRequest, requested events.Envelope) events.OperatorReply {
	id := uuid.Must(uuid.NewV7()).String()
	now := time.Now()
	var accepted bool
	var msg string
	var after []func()
	switch req.Verb {
	case events.OpLeadersHold:
		accepted, msg, after = a.holdLeaders(ctx, req, requested.ID, id, now)
	case events.OpLeadersRelease:
		accepted, msg, after = a.releaseLeaders(ctx, req, id, now)
	}
	act := events.OperatorAction{Verb: req.Verb, Reason: req.Reason, Operator: req.Operator, Comment: req.Comment,
		Accepted: accepted, Outcome: msg, ForMS: req.ForMS, Until: req.Until, Server: req.Server,
		Input: a.core.Input(), InputAudit: a.core.InputAudit(), InputLive: a.core.InputLive()}
	// The outcome's record goes first, so that what it did can cite it.
	if _, err := a.ob.Post("", act, events.WithID(id), events.CausedByID(requested.ID, requested.ID), events.WithEpoch(a.lease.Epoch()),
		events.At(now.UTC())); err != nil {
		a.log.Error("operator action not recorded", "verb", req.Verb, "err", err)
	}
	for _, f := range after {
		f()
	}
	a.log.Info("operator action", "verb", req.Verb, "operator", req.Operator, "comment", req.Comment, "accepted", accepted,
		"outcome", msg, "event_id", id, "requested_id", requested.ID)
	return events.OperatorReply{Accepted: accepted, Message: msg, EventID: id}
}

// holdLeaders starts a hold, replacing one in force (whose start it keeps
// as HeldSince). It returns the posts to make once the outcome is recorded.
func (a *arbiter) holdLeaders(ctx context.Context, req events.OperatorRequest, requestID, actionID string, now time.Time) (bool, string, []func()) {
	until := req.Until
	if req.ForMS != 0 {
		until = now.Add(time.Duration(req.ForMS) * time.Millisecond)
	}
	switch {
	case !until.After(now):
		return false, fmt.Sprintf("until %s has passed (the arbiter's clock says %s)", until.UTC().Format(time.RFC3339), now.UTC().Format(time.RFC3339)), nil
	case until.Sub(now) > events.MaxLeadersHold:
		return false, fmt.Sprintf("a hold until %s lasts %s, at most %s", until.UTC().Format(time.RFC3339),
			until.Sub(now).Round(time.Second), events.MaxLeadersHold), nil
	}
	if req.Server != "" {
		if err := a.checkServer(ctx, req.Server); err != nil {
			return false, err.Error(), nil
		}
	}
	heldID := uuid.Must(uuid.NewV7()).String()
	facts := events.LeadersHoldFacts{Operator: req.Operator, Reason: req.Reason, Comment: req.Comment, Server: req.Server,
		Since: now, Until: until, HeldSince: now, RequestID: requestID, ActionID: actionID}
	var replaced *events.LeadersHold
	err := a.updateHold(ctx, func(cur events.LeadersHoldRecord) (events.LeadersHoldRecord, error) {
		replaced = nil
		f := facts
		if cur.InForce(now) {
			f.HeldSince = cur.HeldSince
			replaced = &events.LeadersHold{Stage: events.HoldEnded, LeadersHoldFacts: cur.LeadersHoldFacts, End: events.HoldReplaced,
				Why: fmt.Sprintf("%s, replaced by %s's hold until %s", describeHold(cur.LeadersHoldFacts), req.Operator,
					until.UTC().Format(time.RFC3339)), CausedBy: []string{actionID, cur.EventID}}
		}
		return events.LeadersHoldRecord{LeadersHoldFacts: f, EventID: heldID}, nil
	})
	if err != nil {
		return false, "the hold could not be stored, so nothing changed: " + err.Error(), nil
	}
	facts.HeldSince = now
	if replaced != nil {
		facts.HeldSince = replaced.HeldSince
	}
	held := events.LeadersHold{Stage: events.HoldStarted, LeadersHoldFacts: facts, Why: describeHold(facts), CausedBy: []string{actionID}}
	msg := describeHold(facts)
	if replaced != nil {
		msg += fmt.Sprintf(" (replacing %s's, held since %s)", replaced.Operator, replaced.HeldSince.UTC().Format(time.RFC3339))
	}
	msg += "; fanctl leaders release ends it sooner"
	epoch := a.lease.Epoch()
	return true, msg, []func(){func() {
		if replaced != nil {
			a.postHold(*replaced, uuid.Must(uuid.NewV7()).String(), epoch, now)
		}
		a.postHold(held, heldID, epoch, now)
	}}
}

// releaseLeaders ends the hold in force, if any.
func (a *arbiter) releaseLeaders(ctx context.Context, req events.OperatorRequest, actionID string, now time.Time) (bool, string, []func()) {
	endID := uuid.Must(uuid.NewV7()).String()
	var ended *events.LeadersHold
	err := a.updateHold(ctx, func(cur events.LeadersHoldRecord) (events.LeadersHoldRecord, error) {
		ended = nil
		if !cur.InForce(now) {
			return cur, errNoChange
		}
		why := fmt.Sprintf("%s, released by %s", describeHold(cur.LeadersHoldFacts), req.Operator)
		if req.Reason != "" {
			why += " (" + req.Reason + ")"
		}
		ended = &events.LeadersHold{Stage: events.HoldEnded, LeadersHoldFacts: cur.LeadersHoldFacts, End: events.HoldReleased, Why: why,
			CausedBy: []string{actionID, cur.EventID}}
		cur.EndedAt, cur.End, cur.Why, cur.EndEventID = now, events.HoldReleased, why, endID
		return cur, nil
	})
	switch {
	case errors.Is(err, errNoChange):
		return true, "no leaders hold is in force", nil
	case err != nil:
		return false, "the release could not be stored, so the hold stays: " + err.Error(), nil
	}
	epoch := a.lease.Epoch()
	return true, ended.Why + ": the steward keeps the leaders on bus.leader_servers again", []func(){func() { a.postHold(*ended, endID, epoch, now) }}
}

// endHold ends the hold id (its start's event) if it is still in force:
// at its end (the keeper) or broken (the steward). The record is written
// first, then the end is recorded, caused by the hold's start.
func (a *arbiter) endHold(ctx context.Context, id string, end events.HoldEnd, why string, now time.Time) error {
	endID := uuid.Must(uuid.NewV7()).String()
	var ended *events.LeadersHold
	err := a.updateHold(ctx, func(cur events.LeadersHoldRecord) (events.LeadersHoldRecord, error) {
		ended = nil
		if cur.EventID != id || !cur.EndedAt.IsZero() {
			return cur, errNoChange
		}
		text := describeHold(cur.LeadersHoldFacts) + ", " + why
		ended = &events.LeadersHold{Stage: events.HoldEnded, LeadersHoldFacts: cur.LeadersHoldFacts, End: end, Why: text, CausedBy: []string{cur.EventID}}
		at := now
		if end == events.HoldExpired {
			at = cur.Until
		}
		cur.EndedAt, cur.End, cur.Why, cur.EndEventID = at, end, text, endID
		return cur, nil
	})
	if errors.Is(err, errNoChange) {
		return nil
	}
	if err != nil {
		return err
	}
	a.postHold(*ended, endID, a.lease.Epoch(), now)
	return nil
}

// errNoChange: the record needs no write.
var errNoChange = errors.New("no change")

// updateHold reads the hold record, lets change make the next one and
// writes it only if nobody wrote it meanwhile (the keeper, the steward's
// break and an operator's request run apart), trying a few times.
func (a *arbiter) updateHold(ctx context.Context, change func(cur events.LeadersHoldRecord) (events.LeadersHoldRecord, error)) error {
	key := events.LeadersHoldKey(a.cfg.Cluster)
	var last error
	for range 3 {
		wctx, cancel := context.WithTimeout(ctx, holdWriteTimeout)
		var cur events.LeadersHoldRecord
		var rev uint64
		e, err := a.kv.Get(wctx, key)
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
		case err != nil:
			cancel()
			return fmt.Errorf("read %s: %w", key, err)
		default:
			rev = e.Revision()
			if err := json.Unmarshal(e.Value(), &cur); err != nil {
				cur = events.LeadersHoldRecord{} // unreadable: replaced whole
			}
		}
		next, err := change(cur)
		if err != nil {
			cancel()
			return err
		}
		b, err := json.Marshal(next)
		if err != nil {
			cancel()
			return err
		}
		if rev == 0 {
			_, err = a.kv.Create(wctx, key, b)
		} else {
			_, err = a.kv.Update(wctx, key, b, rev)
		}
		cancel()
		if err == nil {
			a.hold.onKey(key, b, false, 0) // seen at once, not a watch later
			return nil
		}
		last = err
		if !errors.Is(err, jetstream.ErrKeyExists) && !isWrongLastSequence(err) {
			return fmt.Errorf("write %s: %w", key, err)
		}
	}
	return fmt.Errorf("write %s: written meanwhile by another, three times: %w", key, last)
}

func isWrongLastSequence(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence
}

func (a *arbiter) postHold(h events.LeadersHold, id string, epoch uint64, at time.Time) {
	if _, err := a.ob.Post("", h, events.WithID(id), events.CausedByID(h.CausedBy[0], ""), events.WithEpoch(epoch), events.At(at.UTC())); err != nil {
		a.log.Error("leaders hold not recorded", "stage", h.Stage, "end", h.End, "err", err)
	}
}

// describeHold says who held the leaders, where, why and until when.
func describeHold(f events.LeadersHoldFacts) string {
	where := "where they are"
	if f.Server != "" {
		where = "on " + f.Server
	}
	s := fmt.Sprintf("leaders held %s by %s", where, f.Operator)
	if f.Reason != "" {
		s += " (" + f.Reason + ")"
	}
	return s + " until " + f.Until.UTC().Format(time.RFC3339)
}

// checkServer refuses a hold's server that the steward could not keep the
// leaders on: none runs (bus.leader_servers is empty), or the server is not
// a peer of the command stream (a typo, or a server of another cluster).
func (a *arbiter) checkServer(ctx context.Context, server string) error {
	if len(a.cfg.Bus.LeaderServers) == 0 {
		return fmt.Errorf("this arbiter keeps no leaders in place (bus.leader_servers is empty), so none can be kept on %s: hold without a server", server)
	}
	ictx, cancel := context.WithTimeout(ctx, holdWriteTimeout)
	defer cancel()
	st, err := a.bus.JS.Stream(ictx, events.CommandsStream)
	if err != nil {
		return fmt.Errorf("cannot read the command stream's peers to check %s: %w", server, err)
	}
	var peers []string
	if ci := st.CachedInfo().Cluster; ci != nil {
		if ci.Leader != "" {
			peers = append(peers, ci.Leader)
		}
		for _, p := range ci.Replicas {
			if p != nil {
				peers = append(peers, p.Name)
			}
		}
	}
	if !slices.Contains(peers, server) {
		sort.Strings(peers)
		return fmt.Errorf("no NATS server %s leads or follows the command stream (its servers: %s)", server, strings.Join(peers, ", "))
	}
	return nil
}

// runHoldKeeper ends the hold at its end, on the replica that commands.
func (a *arbiter) runHoldKeeper(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			r := a.hold.get()
			if r.EventID == "" || !r.EndedAt.IsZero() || now.Before(r.Until) || !a.lease.Leading() {
				continue
			}
			if err := a.endHold(ctx, r.EventID, events.HoldExpired, "ended at its end", now); err != nil {
				a.log.Warn("leaders hold: could not record its end; trying again", "hold", r.EventID, "err", err)
			}
		}
	}
}

// breakHold is the steward's Break: the hold ends now, and says why.
func (a *arbiter) breakHold(ctx context.Context, id, why string) {
	// The steward obeys the hold no more from now on; the record follows,
	// and is tried again by the keeper's next pass if the bucket is away.
	go func() {
		for attempt := 0; ctx.Err() == nil; attempt++ {
			err := a.endHold(ctx, id, events.HoldBroken, "broken by the steward: "+why, time.Now())
			if err == nil {
				return
			}
			a.log.Warn("leaders hold: could not record that it broke; trying again", "hold", id, "err", err)
			select {
			case <-ctx.Done():
			case <-time.After(min(time.Duration(attempt+1)*time.Second, 5*time.Second)):
			}
		}
	}()
}

// holdMetrics exports the hold as every replica reads it.
type holdMetrics struct {
	h                  *leadersHold
	held, until, since *prometheus.Desc
}

func newHoldMetrics(h *leadersHold) *holdMetrics {
	return &holdMetrics{h: h,
		held: prometheus.NewDesc("fan_arbiter_leaders_held",
			"1 while an operator's leaders hold is in force (fanctl leaders hold): the steward keeps no leader on bus.leader_servers.", nil, nil),
		until: prometheus.NewDesc("fan_arbiter_leaders_hold_until_timestamp_seconds",
			"When the leaders hold in force ends by itself (Unix time; absent without one).", nil, nil),
		since: prometheus.NewDesc("fan_arbiter_leaders_held_since_timestamp_seconds",
			"Since when the leaders have been held without a gap, renewals included (Unix time; absent without a hold).", nil, nil),
	}
}

func (m *holdMetrics) Describe(ch chan<- *prometheus.Desc) {
	ch <- m.held
	ch <- m.until
	ch <- m.since
}

func (m *holdMetrics) Collect(ch chan<- prometheus.Metric) {
	r := m.h.get()
	if !r.InForce(time.Now()) {
		ch <- prometheus.MustNewConstMetric(m.held, prometheus.GaugeValue, 0)
		return
	}
	ch <- prometheus.MustNewConstMetric(m.held, prometheus.GaugeValue, 1)
	ch <- prometheus.MustNewConstMetric(m.until, prometheus.GaugeValue, float64(r.Until.UnixMilli())/1e3)
	ch <- prometheus.MustNewConstMetric(m.since, prometheus.GaugeValue, float64(r.HeldSince.UnixMilli())/1e3)
}
