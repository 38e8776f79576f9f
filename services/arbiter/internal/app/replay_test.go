package app

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/bus/bustest"
	"github.com/fanpbx/fan/pkg/platform/config"
	"github.com/fanpbx/fan/pkg/platform/waittest"
	"github.com/fanpbx/fan/services/arbiter/internal/replay"
)

// TestReplay records a real arbiter placing a group, failing it over when
// the holder's PBX goes down and failing it back inside a window once the
// PBX is back, then replays the audit stream through the decision core:
// an operator then freezes the group and switches it over by hand. Under
// the arbiter's configuration every decision comes out the same;
// under a longer hold-down the failback does not, and the replay says so.
func TestReplay(t *testing.T) {
	l := newLab(t, "n1", "n2")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	l.nodesUp(ctx)
	edit := func(c *Config) {
		c.Policy.HoldDown = config.Duration(time.Second)
		c.Groups[0].Failback = FailbackConfig{StableFor: config.Duration(time.Second), DrainMaxChannels: -1}
	}
	stop := l.arbiterWith("ctl", edit)
	l.waitHolder("n1", 10*time.Second)
	l.setPBX("n1", false)
	l.waitHolder("n2", 10*time.Second)
	l.setPBX("n1", true)
	sched := bustest.Connect(t, l.s, bus.Identity{Cluster: "lab", Service: "scheduler", Node: "ctl"})
	now := time.Now()
	if _, err := sched.Emit(ctx, events.FailbackPermit{Group: "pbx", Window: "test", ValidFrom: now, ValidUntil: now.Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	l.waitHolder("n1", 15*time.Second)
	// Once the failback's claim is confirmed the arbiter has nothing left
	// to decide; stopping it ends the recording.
	waittest.Until(t, 10*time.Second, "the failback's claim result", func() bool {
		return slices.ContainsFunc(l.records(ctx), func(r replay.Record) bool {
			res, ok := r.Payload.(*events.CommandResult)
			return ok && res.Node == "n1" && res.CommandType == events.TypeClaimIP && res.Outcome == events.OutcomeApplied &&
				l.claimOf(ctx, res.CommandID) == events.ActionFailback
		})
	})
	// An operator freezes the group and moves it by hand; a second
	// switchover to the same node is refused. The replay applies both.
	ask := l.asker()
	for _, req := range []events.OperatorRequest{
		{Verb: events.OpMaintenanceOn, Group: "pbx", Reason: "replay test"},
		{Verb: events.OpSwitchover, Group: "pbx", Node: "n2", Reason: "replay test"},
	} {
		if rep := ask("alice", req); !rep.Accepted {
			t.Fatalf("%s refused: %s", req.Verb, rep.Message)
		}
	}
	l.waitHolder("n2", 10*time.Second)
	waittest.Until(t, 10*time.Second, "the switchover's claim confirmed", func() bool {
		rep := ask("alice", events.OperatorRequest{Verb: events.OpSwitchover, Group: "pbx", Node: "n2", Reason: "again"})
		return !rep.Accepted && strings.Contains(rep.Message, "already holds")
	})
	stop()
	trail := l.records(ctx)

	run := func(t *testing.T, edit func(*Config)) replay.Report {
		c := l.cfg("ctl")
		edit(&c)
		rep, err := replay.Run(c.decideConfig(), trail, replay.Options{})
		if err != nil {
			t.Fatal(err)
		}
		var b strings.Builder
		_ = rep.Print(&b)
		t.Log("\n" + b.String())
		return rep
	}
	t.Run("the arbiter's configuration replays every decision", func(t *testing.T) {
		rep := run(t, edit)
		if rep.Differ != 0 || rep.NotCompared != 0 || len(rep.OtherPolicy) != 0 {
			dumpTrail(t, trail)
			t.Fatalf("%d differences, %d not compared, other policy in terms %v", rep.Differ, rep.NotCompared, rep.OtherPolicy)
		}
		var actions []events.Action
		for _, r := range rep.Rows {
			if !r.Recorded.Planned && r.Recorded.Action != events.ActionHold {
				actions = append(actions, r.Recorded.Action)
			}
		}
		// A loaded machine may cost the arbiter its lease (and the replay
		// follows the takeover): the moves asked for must be there, in order.
		want := []events.Action{events.ActionPlace, events.ActionFailover, events.ActionFailback, events.ActionSwitchover}
		if !inOrder(actions, want) {
			t.Fatalf("moves replayed %v, want %v", actions, want)
		}
	})
	t.Run("a longer hold-down is flagged", func(t *testing.T) {
		rep := run(t, func(c *Config) {
			edit(c)
			c.Policy.HoldDown = config.Duration(time.Hour)
		})
		if rep.Differ == 0 {
			t.Fatal("no difference flagged")
		}
		if len(rep.OtherPolicy) == 0 {
			t.Fatal("the term's policy digest does not tell the configurations apart")
		}
		i := slices.IndexFunc(rep.Rows, func(r replay.Row) bool {
			return r.Recorded != nil && r.Recorded.Action == events.ActionFailback
		})
		if i < 0 || len(rep.Rows[i].Diffs) == 0 {
			t.Fatal("the recorded failback is not flagged")
		}
		if r := rep.Rows[i].Replayed; r != nil && r.Action == events.ActionFailback {
			t.Fatalf("replayed a failback within the hold-down: %+v", r)
		}
	})
}

// records reads the whole trail, audit and live, as the replay takes it.
func (l *lab) records(ctx context.Context) []replay.Record {
	b := bustest.Connect(l.t, l.s, bus.Identity{Cluster: "lab", Service: "test", Node: "reader"})
	stored, err := b.ReadAll(ctx, bus.WatchOptions{All: true,
		Subjects: []string{events.ClusterEvents("lab"), events.ClusterCommands("lab"), events.ClusterLiveState("lab")}})
	if err != nil {
		l.t.Fatal(err)
	}
	out := make([]replay.Record, 0, len(stored))
	for _, r := range stored {
		out = append(out, replay.Record{Env: r.Env, Payload: r.Payload, Stored: r.At})
	}
	return out
}

// claimOf is the action of the decision that issued a claim, if recorded.
func (l *lab) claimOf(ctx context.Context, id string) events.Action {
	for _, r := range l.records(ctx) {
		if d, ok := r.Payload.(*events.ArbiterDecision); ok && slices.Contains(d.Commands, id) {
			return d.Action
		}
	}
	return ""
}

// inOrder reports whether want appears in got in that order.
func inOrder[T comparable](got, want []T) bool {
	for _, g := range got {
		if len(want) > 0 && g == want[0] {
			want = want[1:]
		}
	}
	return len(want) == 0
}

// TestReplayFromATermStart: an arbiter places the group and dies; a second
// one takes the lease, restores the holder and fails the group over. A
// replay of only what came after the first one's time — no arbiter start
// in it, so the state is known only from the term the second one recorded —
// finds every decision of that term the same.
func TestReplayFromATermStart(t *testing.T) {
	l := newLab(t, "n1", "n2")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	l.nodesUp(ctx)
	stopA := l.arbiter("ctlA")
	l.waitHolder("n1", 10*time.Second)
	stopA()
	l.arbiter("ctlB")
	waittest.Until(t, 10*time.Second, "ctlB's term", func() bool {
		return slices.ContainsFunc(l.records(ctx), func(r replay.Record) bool {
			_, ok := r.Payload.(*events.ArbiterTerm)
			return ok && r.Env.Source.Node == "ctlB"
		})
	})
	l.setPBX("n1", false)
	l.waitHolder("n2", 10*time.Second)
	waittest.Until(t, 10*time.Second, "the failover's claim confirmed", func() bool {
		return slices.ContainsFunc(l.records(ctx), func(r replay.Record) bool {
			res, ok := r.Payload.(*events.CommandResult)
			return ok && res.Node == "n2" && res.CommandType == events.TypeClaimIP && res.Outcome == events.OutcomeApplied
		})
	})
	trail := l.records(ctx)
	// Begin just after ctlB's start announcement: only its term says
	// what state it began from.
	from := slices.IndexFunc(trail, func(r replay.Record) bool {
		a, ok := r.Payload.(*events.ServiceAnnounce)
		return ok && a.Service == "arbiter" && a.State == events.ServiceStarted && r.Env.Source.Node == "ctlB"
	})
	if from < 0 {
		t.Fatal("no start announcement of ctlB")
	}
	cfg := l.cfg("ctlB")
	rep, err := replay.Run(cfg.decideConfig(), trail[from+1:], replay.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	_ = rep.Print(&b)
	t.Log("\n" + b.String())
	if rep.StartTerm == 0 || rep.Differ != 0 {
		dumpTrail(t, trail)
		t.Fatalf("start term %d, %d differences", rep.StartTerm, rep.Differ)
	}
	if !slices.ContainsFunc(rep.Rows, func(r replay.Row) bool { return r.Same() && r.Recorded.Action == events.ActionFailover }) {
		t.Fatal("the failover was not replayed")
	}
}

// dumpTrail logs the trail a failed replay read: what the core was given
// and what the arbiter recorded, in stream order.
func dumpTrail(t *testing.T, trail []replay.Record) {
	var b strings.Builder
	for _, r := range trail {
		extra := ""
		switch p := r.Payload.(type) {
		case *events.ArbiterDecision:
			extra = fmt.Sprintf("%s %s trig=%s input=%s audit=%s live=%s", p.Action, p.Reason[:min(40, len(p.Reason))], p.Trigger, p.Input, p.InputAudit, p.InputLive)
		case *events.CommandResult:
			extra = fmt.Sprintf("%s %s %s cmd=%s", p.CommandType, p.Node, p.Outcome, p.CommandID)
		case *events.NodeHeartbeat:
			extra = fmt.Sprintf("%s seq=%d", p.Node, p.Seq)
		case *events.OperatorAction:
			extra = fmt.Sprintf("%s stage=%s acc=%v", p.Verb, p.Stage, p.Accepted)
		case *events.ArbiterTerm:
			extra = fmt.Sprintf("input=%s audit=%s live=%s since=%s", p.Input, p.InputAudit, p.InputLive, p.Since)
		case *events.PlannedMove:
			extra = fmt.Sprintf("%s trig=%s input=%s", p.Stage, p.Trigger, p.Input)
		}
		fmt.Fprintf(&b, "%s %-22s %-14s %s %s\n", r.Env.Time.Format("05.000000"), r.Env.Type, r.Env.Source.Service+"@"+r.Env.Source.Node, r.Env.ID, extra)
	}
	t.Log("\n" + b.String())
}
