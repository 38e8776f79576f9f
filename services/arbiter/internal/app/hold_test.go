package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/bus/bustest"
	"github.com/fanpbx/fan/pkg/platform/waittest"
	"github.com/nats-io/nats.go/jetstream"
)

func TestStandbyKeepsTheLeaseWhileHeld(t *testing.T) {
	t0 := time.Unix(1000, 0)
	p := newPrimaries(t0)
	at := t0.Add(presenceDeadAfter)
	if !p.mayHoldHeld(at, false, false) {
		t.Fatal("a standby that hears no primary does not campaign")
	}
	// The witness's replica comes back and settles.
	for end := at.Add(presenceSettle + presenceEvery); at.Before(end); at = at.Add(presenceEvery) {
		p.heard("ctl", at)
	}
	if p.mayHoldHeld(at, true, false) {
		t.Fatal("without a hold the standby keeps the lease from a settled primary")
	}
	if !p.mayHoldHeld(at, true, true) {
		t.Fatal("while the leaders are held the standby hands the lease back")
	}
	if p.mayHoldHeld(at, false, true) {
		t.Fatal("a hold made a standby campaign while a primary is alive")
	}
}

// holdLab is operatorLab with a handle on the leader's arbiter, for what
// no request can cause (the steward breaking a hold).
func holdLab(t *testing.T) (*lab, context.Context, func(string, events.OperatorRequest) events.OperatorReply, *arbiter) {
	l := newLab(t, "n1", "n2")
	l.leaseTTL = operatorLeaseTTL
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	l.nodesUp(ctx)
	svc, err := New(l.cfg("ctlA"), testLogger("ctlA"), "test")
	if err != nil {
		t.Fatal(err)
	}
	wired := make(chan *arbiter, 1)
	svc.wired = func(a *arbiter) { wired <- a }
	done := make(chan struct{})
	go func() { _ = svc.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	l.waitHolder("n1", 10*time.Second)
	return l, ctx, l.asker(), <-wired
}

func (l *lab) holdRecord(ctx context.Context) (events.LeadersHoldRecord, bool) {
	l.t.Helper()
	b := bustest.Connect(l.t, l.s, bus.Identity{Cluster: "lab", Service: "test", Node: "reader"})
	kv, err := b.StateKV(ctx)
	if err != nil {
		l.t.Fatal(err)
	}
	e, err := kv.Get(ctx, events.LeadersHoldKey("lab"))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return events.LeadersHoldRecord{}, false
	}
	if err != nil {
		l.t.Fatal(err)
	}
	var r events.LeadersHoldRecord
	if err := json.Unmarshal(e.Value(), &r); err != nil {
		l.t.Fatal(err)
	}
	return r, true
}

type holdEvent struct {
	env events.Envelope
	h   events.LeadersHold
}

func (l *lab) holdEvents(ctx context.Context) []holdEvent {
	var out []holdEvent
	for _, env := range l.trail(ctx) {
		if env.Type == events.TypeLeadersHold {
			var h events.LeadersHold
			if err := json.Unmarshal(env.Data, &h); err != nil {
				l.t.Fatal(err)
			}
			out = append(out, holdEvent{env, h})
		}
	}
	return out
}

// waitHoldEvents waits until the trail holds n leaders hold events (they go
// through the outbox, a moment after the reply).
func (l *lab) waitHoldEvents(ctx context.Context, n int) []holdEvent {
	l.t.Helper()
	var evs []holdEvent
	waittest.Succeeds(l.t, 10*time.Second, fmt.Sprintf("%d leaders hold events in the trail", n), func() error {
		if evs = l.holdEvents(ctx); len(evs) < n {
			return fmt.Errorf("%d: %+v", len(evs), evs)
		}
		return nil
	})
	return evs
}

// TestLeadersHold: an operator holds the leaders, holds them again (the
// hold replaced, its age kept), releases them; a hold that reaches its end
// is ended by the leader; one the steward breaks says why. Each start and
// end is in the trail, citing the operator's action or the hold's start,
// and the record in the state bucket says what is in force.
func TestLeadersHold(t *testing.T) {
	l, ctx, ask, svc := holdLab(t)

	rep := ask("alice", events.OperatorRequest{Verb: events.OpLeadersHold, ForMS: time.Hour.Milliseconds(), Reason: "witness reboot"})
	if !rep.Accepted || !strings.Contains(rep.Message, "leaders held where they are by alice (witness reboot) until ") {
		t.Fatalf("hold: %+v", rep)
	}
	first, ok := l.holdRecord(ctx)
	if !ok || !first.InForce(time.Now()) || first.Operator != "alice" || first.ActionID != rep.EventID ||
		first.Until.Sub(first.Since) != time.Hour {
		t.Fatalf("hold record %+v", first)
	}
	evs := l.waitHoldEvents(ctx, 1)
	if h := evs[0]; h.h.Stage != events.HoldStarted || h.env.ID != first.EventID || h.h.CausedBy[0] != rep.EventID {
		t.Fatalf("start %+v, record %+v", h, first)
	}

	rep = ask("bob", events.OperatorRequest{Verb: events.OpLeadersHold, ForMS: (2 * time.Hour).Milliseconds()})
	if !rep.Accepted || !strings.Contains(rep.Message, "replacing alice's") {
		t.Fatalf("second hold: %+v", rep)
	}
	second, _ := l.holdRecord(ctx)
	if second.Operator != "bob" || !second.HeldSince.Equal(first.Since) || second.EventID == first.EventID {
		t.Fatalf("second hold %+v: want bob's, held since %s", second, first.Since)
	}
	evs = l.waitHoldEvents(ctx, 3)
	if e := evs[1]; e.h.Stage != events.HoldEnded || e.h.End != events.HoldReplaced || e.h.Operator != "alice" ||
		e.h.CausedBy[0] != rep.EventID || e.h.CausedBy[1] != first.EventID {
		t.Fatalf("replaced: %+v", e.h)
	}

	if rep := ask("alice", events.OperatorRequest{Verb: events.OpLeadersHold, ForMS: time.Hour.Milliseconds(), Server: "nats-ctl"}); rep.Accepted ||
		!strings.Contains(rep.Message, "bus.leader_servers is empty") {
		t.Fatalf("a hold on a server without a steward: %+v", rep)
	}
	if rep := ask("alice", events.OperatorRequest{Verb: events.OpLeadersHold, Until: time.Now().Add(-time.Minute)}); rep.Accepted {
		t.Fatalf("a hold ending in the past: %+v", rep)
	}

	rep = ask("carol", events.OperatorRequest{Verb: events.OpLeadersRelease, Reason: "witness is back"})
	if !rep.Accepted || !strings.Contains(rep.Message, "released by carol (witness is back)") {
		t.Fatalf("release: %+v", rep)
	}
	released, _ := l.holdRecord(ctx)
	if released.InForce(time.Now()) || released.End != events.HoldReleased {
		t.Fatalf("released record %+v", released)
	}
	if rep := ask("carol", events.OperatorRequest{Verb: events.OpLeadersRelease}); !rep.Accepted || rep.Message != "no leaders hold is in force" {
		t.Fatalf("second release: %+v", rep)
	}
	evs = l.waitHoldEvents(ctx, 4)
	if e := evs[3]; e.h.End != events.HoldReleased || e.env.ID != released.EndEventID {
		t.Fatalf("released event %+v, record %+v", e, released)
	}

	// A hold that reaches its end: the leader ends it within a second.
	rep = ask("alice", events.OperatorRequest{Verb: events.OpLeadersHold, Until: time.Now().Add(1500 * time.Millisecond)})
	if !rep.Accepted {
		t.Fatalf("short hold: %+v", rep)
	}
	evs = l.waitHoldEvents(ctx, 6)
	if e := evs[5]; e.h.End != events.HoldExpired || e.h.CausedBy[0] != evs[4].env.ID {
		t.Fatalf("expired: %+v", e.h)
	}
	if r, _ := l.holdRecord(ctx); r.End != events.HoldExpired || !r.EndedAt.Equal(r.Until) {
		t.Fatalf("expired record %+v", r)
	}

	// One the steward breaks.
	if rep := ask("alice", events.OperatorRequest{Verb: events.OpLeadersHold, ForMS: time.Hour.Milliseconds()}); !rep.Accepted {
		t.Fatalf("hold: %+v", rep)
	}
	held, _ := l.holdRecord(ctx)
	svc.breakHold(ctx, held.EventID, "raft stream FAN_CMD has had no leader for 12s")
	evs = l.waitHoldEvents(ctx, 8)
	if e := evs[7]; e.h.End != events.HoldBroken || !strings.Contains(e.h.Why, "broken by the steward: raft stream FAN_CMD") ||
		e.h.CausedBy[0] != held.EventID {
		t.Fatalf("broken: %+v", e.h)
	}
	// The actions are in the trail as any other, with what was asked.
	var holds int
	for _, a := range operatorActions(l, ctx) {
		if a.Verb == events.OpLeadersHold && a.Stage == "" && a.Accepted {
			holds++
			if a.ForMS == 0 && a.Until.IsZero() {
				t.Errorf("hold recorded without its end: %+v", a)
			}
		}
	}
	if holds != 4 {
		t.Errorf("%d accepted holds recorded, want 4", holds)
	}
}

// TestLeadersHoldWritesDoNotRace: the keeper, the steward's break and an
// operator's request write the record apart; a write made on a revision
// someone else changed is made again on the new one, never over it.
func TestLeadersHoldWritesDoNotRace(t *testing.T) {
	l, ctx, ask, svc := holdLab(t)
	if rep := ask("alice", events.OperatorRequest{Verb: events.OpLeadersHold, ForMS: time.Hour.Milliseconds()}); !rep.Accepted {
		t.Fatalf("hold: %+v", rep)
	}
	held, _ := l.holdRecord(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { svc.breakHold(ctx, held.EventID, "test") })
	wg.Go(func() {
		ask("bob", events.OperatorRequest{Verb: events.OpLeadersHold, ForMS: (2 * time.Hour).Milliseconds()})
	})
	wg.Wait()
	// Broken then replaced, or replaced (and the break found nothing to end).
	waittest.Succeeds(t, 10*time.Second, "alice's hold ended once and bob's in force", func() error {
		evs := l.holdEvents(ctx)
		ends := 0
		for _, e := range evs {
			if e.h.Stage == events.HoldEnded && e.h.CausedBy[len(e.h.CausedBy)-1] == held.EventID {
				ends++
			}
		}
		if ends > 1 {
			t.Fatalf("alice's hold ended %d times: %+v", ends, evs)
		}
		r, _ := l.holdRecord(ctx)
		if ends == 1 && r.Operator == "bob" && r.InForce(time.Now()) {
			return nil
		}
		if ends == 1 && r.Operator == "bob" {
			t.Fatalf("bob's hold is not in force: %+v", r)
		}
		return fmt.Errorf("record %+v, events %+v", r, evs)
	})
}
