package app

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/bus/bustest"
	"github.com/fanpbx/fan/pkg/platform/config"
	"github.com/fanpbx/fan/pkg/platform/daemon"
	"github.com/fanpbx/fan/pkg/platform/waittest"
	"github.com/nats-io/nats-server/v2/server"
)

// lab is one embedded JetStream with arbiters, a scripted prober per node
// and a model executor per node that follows the executor rules (at most
// once, no older epoch, no passed deadline) and records who holds.
type lab struct {
	t     *testing.T
	s     *server.Server
	nodes []string

	mu       sync.Mutex
	pbxUp    map[string]bool
	holders  map[string]bool   // node -> holds the address right now (per the executors)
	maxEpoch map[string]uint64 // node -> highest epoch its executor saw
	applied  map[string]string // command id -> node that applied it
	stored   map[string]events.Envelope
	dual     int // moments with two holders
	slow     map[string]chan struct{}
	// claimTimeout, when set, replaces the lab's 3 s claim timeout.
	claimTimeout time.Duration
	// leaseTTL, when set, replaces the lab's 1 s arbiter lease.
	leaseTTL time.Duration
	// channels, when set for a node, is what its heartbeats report as
	// active channels (nil: unknown); a node without reports 0.
	channels map[string]func(context.Context) *int
	// muted nodes' scripted probers stop sending heartbeats (the node falls silent).
	muted map[string]bool
	// arbs are the running arbiters (arbiterWith), each once it is built.
	arbs map[string]*atomic.Pointer[arbiter]
}

func newLab(t *testing.T, nodes ...string) *lab {
	l := &lab{t: t, s: bustest.Server(t), nodes: nodes, pbxUp: map[string]bool{}, holders: map[string]bool{},
		maxEpoch: map[string]uint64{}, applied: map[string]string{}, stored: map[string]events.Envelope{}, slow: map[string]chan struct{}{}, muted: map[string]bool{},
		arbs: map[string]*atomic.Pointer[arbiter]{}}
	for _, n := range nodes {
		l.pbxUp[n] = true
	}
	return l
}

func (l *lab) cfg(node string) Config {
	c := Config{Common: daemon.Common{Cluster: "lab", Node: node, Bus: bus.Config{URL: l.s.ClientURL()}},
		LeaseTTL: config.Duration(time.Second),
		Groups:   []GroupConfig{{Name: "pbx", Addresses: []string{"198.51.100.10/24"}, Nodes: l.nodes, HealthCheck: "pbx"}},
		Policy:   PolicyConfig{SilentAfter: config.Duration(2 * time.Second), ClaimTimeout: config.Duration(3 * time.Second), SettleAfter: config.Duration(500 * time.Millisecond)},
	}
	if l.claimTimeout != 0 {
		c.Policy.ClaimTimeout = config.Duration(l.claimTimeout)
	}
	if l.leaseTTL != 0 {
		c.LeaseTTL = config.Duration(l.leaseTTL)
	}
	if err := c.Validate(); err != nil {
		l.t.Fatal(err)
	}
	return c
}

// arbiter starts one replica; the returned function kills it (its lease
// is not released: the server expires it, as after a crash).
func (l *lab) arbiter(node string) context.CancelFunc { return l.arbiterWith(node, nil) }

// arbiterWith is arbiter with the configuration changed by edit first.
func (l *lab) arbiterWith(node string, edit func(*Config)) context.CancelFunc {
	c := l.cfg(node)
	if edit != nil {
		edit(&c)
	}
	svc, err := New(c, testLogger(node), "test")
	if err != nil {
		l.t.Fatal(err)
	}
	built := new(atomic.Pointer[arbiter])
	svc.wired = built.Store
	l.mu.Lock()
	l.arbs[node] = built
	l.mu.Unlock()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = svc.Run(ctx); close(done) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			<-done
			l.mu.Lock()
			if l.arbs[node] == built {
				delete(l.arbs, node)
			}
			l.mu.Unlock()
		})
	}
	l.t.Cleanup(stop)
	return stop
}

// tickedPast waits until every running arbiter has ticked its core at or
// after at: whatever the leader would have decided by then it has, and the
// commands it decided are stored. A test that proves nothing was decided
// (no second move, no release) waits for this rather than sleeping.
func (l *lab) tickedPast(at time.Time) {
	l.t.Helper()
	waittest.Until(l.t, time.Until(at)+15*time.Second, "every arbiter ticking past "+at.Format("15:04:05.000"), func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		for _, built := range l.arbs {
			if a := built.Load(); a == nil || a.tickedAt.Load() < at.UnixNano() {
				return false
			}
		}
		return true
	})
}

// refusals counts the "message refused" log lines of a replica, by reason.
type refusals struct {
	mu sync.Mutex
	n  map[string]int
}

func (r *refusals) Enabled(context.Context, slog.Level) bool { return true }
func (r *refusals) WithAttrs([]slog.Attr) slog.Handler       { return r }
func (r *refusals) WithGroup(string) slog.Handler            { return r }
func (r *refusals) Handle(_ context.Context, rec slog.Record) error {
	if rec.Message != "message refused" {
		return nil
	}
	rec.Attrs(func(a slog.Attr) bool {
		if a.Key == "reason" {
			r.mu.Lock()
			r.n[a.Value.String()]++
			r.mu.Unlock()
		}
		return true
	})
	return nil
}

func (r *refusals) count(reason string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n[reason]
}

// arbiterCounting starts one replica whose refusals are counted.
func (l *lab) arbiterCounting(node string) *refusals {
	r := &refusals{n: map[string]int{}}
	svc, err := New(l.cfg(node), slog.New(r), "test")
	if err != nil {
		l.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = svc.Run(ctx); close(done) }()
	l.t.Cleanup(func() { cancel(); <-done })
	return r
}

// probers heartbeat every node each 200 ms with its current PBX state.
func (l *lab) probers(ctx context.Context) {
	for _, n := range l.nodes {
		b := bustest.Connect(l.t, l.s, bus.Identity{Cluster: "lab", Service: "prober", Node: n})
		go func() {
			t := time.NewTicker(200 * time.Millisecond)
			defer t.Stop()
			since := time.Now()
			last := true
			for seq := uint64(1); ; seq++ {
				l.mu.Lock()
				up, muted := l.pbxUp[n], l.muted[n]
				l.mu.Unlock()
				h := events.HealthDown
				if up {
					h = events.HealthUp
				}
				if up != last {
					since, last = time.Now(), up
				}
				zero := 0
				active := &zero
				if f := l.channels[n]; f != nil {
					active = f(ctx)
				}
				if !muted {
					_, _ = b.Emit(ctx, events.NodeHeartbeat{Node: n, Seq: seq, IntervalMS: 200, Version: "t", ActiveChannels: active,
						Checks: map[string]events.CheckState{"pbx": {TargetNode: n, Role: events.RoleSelf, Health: h, Since: since}}})
				}
				select {
				case <-ctx.Done():
					return
				case <-t.C:
				}
			}
		}()
	}
}

// nodesUp starts every node's scripted prober and model executor.
func (l *lab) nodesUp(ctx context.Context) {
	l.probers(ctx)
	for _, n := range l.nodes {
		l.executor(ctx, n)
	}
}

// executor runs node's model executor from now on.
func (l *lab) executor(ctx context.Context, node string) {
	b := bustest.Connect(l.t, l.s, bus.Identity{Cluster: "lab", Service: "ipmover", Node: node})
	go func() {
		_ = b.ConsumeCommands(ctx, node, func(ctx context.Context, env events.Envelope, cmd events.Command, _ uint64) {
			l.mu.Lock()
			gate := l.slow[node]
			l.mu.Unlock()
			if gate != nil {
				select {
				case <-gate:
				case <-ctx.Done():
					return
				}
			}
			outcome, why := l.apply(node, env, cmd)
			if os.Getenv("FAN_TEST_LOG") != "" {
				fmt.Fprintf(os.Stderr, "EXEC %s node=%s type=%s epoch=%d src=%s outcome=%s why=%s\n", time.Now().Format("15:04:05.000"), node, env.Type, env.Epoch, env.Source.Node, outcome, why)
			}
			r := events.CommandResult{CommandID: env.ID, CommandType: env.Type, Node: node, Group: "pbx", Outcome: outcome, Error: why}
			_, _ = b.Emit(ctx, r, events.CausedBy(env))
		})
	}()
}

func (l *lab) apply(node string, env events.Envelope, cmd events.Command) (events.Outcome, string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.stored[env.ID] = env
	switch {
	case l.applied[env.ID] != "":
		return events.OutcomeDuplicate, ""
	case env.Epoch < l.maxEpoch[node]:
		return events.OutcomeStaleEpoch, fmt.Sprintf("epoch %d < %d", env.Epoch, l.maxEpoch[node])
	case time.Now().After(cmd.Deadline()):
		return events.OutcomeExpired, "deadline passed"
	}
	l.maxEpoch[node] = env.Epoch
	l.applied[env.ID] = node
	switch cmd.(type) {
	case *events.ClaimIP:
		l.holders[node] = true
		n := 0
		for _, h := range l.holders {
			if h {
				n++
			}
		}
		if n > 1 {
			l.dual++
		}
	case *events.ReleaseIP:
		l.holders[node] = false
	}
	return events.OutcomeApplied, ""
}

func (l *lab) holding() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, n := range l.nodes {
		if l.holders[n] {
			out = append(out, n)
		}
	}
	return out
}

func (l *lab) waitHolder(node string, within time.Duration) {
	l.t.Helper()
	waittest.Succeeds(l.t, within, "only "+node+" holding", func() error {
		if h := l.holding(); len(h) != 1 || h[0] != node {
			return fmt.Errorf("holders %v", h)
		}
		return nil
	})
}

func (l *lab) setPBX(node string, up bool) {
	l.mu.Lock()
	l.pbxUp[node] = up
	l.mu.Unlock()
}

// trail reads every event and command copy in the audit stream, and the
// live stream's heartbeats, in the order records gives them.
func (l *lab) trail(ctx context.Context) []events.Envelope {
	var out []events.Envelope
	for _, r := range l.records(ctx) {
		out = append(out, r.Env)
	}
	return out
}

// TestLeaderLostMidFailover: the leader issues a failover and dies before
// the claim is confirmed; the successor restores the outstanding claim,
// takes the confirmation, and never commands a second holder.
func TestLeaderLostMidFailover(t *testing.T) {
	l := newLab(t, "n1", "n2", "n3")
	// The claim must still be valid (claim timeout - 1 s clock skew) when n2
	// applies it after the leader's shutdown, which a loaded machine can
	// stretch to seconds: give it room so the test is about the handover.
	l.claimTimeout = 6 * time.Second
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	l.nodesUp(ctx)
	stopA := l.arbiter("ctlA")
	l.waitHolder("n1", 10*time.Second)
	l.arbiter("ctlB")

	gate := make(chan struct{})
	l.mu.Lock()
	l.slow["n2"] = gate // n2 receives its claim but answers only when told
	l.mu.Unlock()
	l.setPBX("n1", false)
	// Wait until n1 released (the failover is under way), then kill the leader.
	waittest.Until(t, 10*time.Second, "n1 released: a failover started", func() bool { return len(l.holding()) == 0 })
	stopA()
	close(gate) // n2 applies the claim the dead leader sent
	l.waitHolder("n2", 10*time.Second)

	// The successor leads with a higher epoch and keeps n2: no second move.
	l.tickedPast(time.Now().Add(l.claimTimeout + time.Second)) // a wrongly restored claim would have been retried by then
	if h := l.holding(); len(h) != 1 || h[0] != "n2" {
		t.Fatalf("holders %v after the handover", h)
	}
	l.mu.Lock()
	dual := l.dual
	l.mu.Unlock()
	if dual != 0 {
		t.Fatalf("two holders at once %d times", dual)
	}
	epochs := map[string]uint64{}
	// The leader may die after its claim to n2 was stored or before:
	// the successor waits for a stored claim and reissues only a lost one.
	var deadLeadersClaim bool
	var reissues int
	for _, env := range l.trail(ctx) {
		if env.Type == events.TypeArbiterDecision && env.Source.Node != "" {
			if e, ok := epochs[env.Source.Node]; !ok || env.Epoch > e {
				epochs[env.Source.Node] = env.Epoch
			}
			if strings.Contains(string(env.Data), "never reached the bus") {
				reissues++
			}
		}
		if env.Type == events.TypeClaimIP && env.Source.Node == "ctlA" && strings.Contains(string(env.Data), `"node":"n2"`) {
			deadLeadersClaim = true
		}
	}
	if want := map[bool]int{true: 0, false: 1}[deadLeadersClaim]; reissues != want {
		t.Fatalf("dead leader's claim stored: %v; reissued %d times, want %d", deadLeadersClaim, reissues, want)
	}
	if epochs["ctlB"] != 0 && epochs["ctlB"] <= epochs["ctlA"] {
		t.Fatalf("successor's epoch %d not above %d", epochs["ctlB"], epochs["ctlA"])
	}
}

// TestTwoArbitersRace: two replicas start at the same moment; exactly one
// commands, under one epoch.
func TestTwoArbitersRace(t *testing.T) {
	l := newLab(t, "n1", "n2")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	l.nodesUp(ctx)
	var wg sync.WaitGroup
	for _, n := range []string{"ctlA", "ctlB"} {
		wg.Go(func() { l.arbiter(n) })
	}
	wg.Wait()
	l.waitHolder("n1", 10*time.Second)
	l.setPBX("n1", false)
	l.waitHolder("n2", 10*time.Second)
	sources, epochs := map[string]bool{}, map[uint64]bool{}
	for _, env := range l.trail(ctx) {
		switch env.Type {
		case events.TypeArbiterDecision, events.TypeClaimIP, events.TypeReleaseIP:
			sources[env.Source.Node] = true
			epochs[env.Epoch] = true
		}
	}
	if len(sources) != 1 || len(epochs) != 1 {
		t.Fatalf("decisions and commands from %v under epochs %v: want one leader, one epoch", sources, epochs)
	}
}

// TestCommandDeliveredAfterItsDeadline: n2 is cut off (its executor reads
// nothing) when the failover claims it; the arbiter gives up at
// claim_timeout and moves on to n3. When n2 comes back it must not apply
// the old claim: by then it has expired (server TTL, or refused by deadline).
func TestCommandDeliveredAfterItsDeadline(t *testing.T) {
	l := newLab(t, "n1", "n2", "n3")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	l.probers(ctx)
	l.executor(ctx, "n1")
	l.executor(ctx, "n3")
	l.arbiter("ctlA")
	l.waitHolder("n1", 10*time.Second)
	l.setPBX("n1", false)
	l.waitHolder("n3", 15*time.Second) // n2's claim timed out, n3 took over
	ectx, ecancel := context.WithCancel(ctx)
	defer ecancel()
	l.executor(ectx, "n2") // the partition heals
	// n2 reads its queue: the claim (expired) and the release that followed it.
	var claimID string
	for _, env := range l.trail(ctx) {
		if env.Type == events.TypeClaimIP {
			var c events.ClaimIP
			_ = json.Unmarshal(env.Data, &c)
			if c.Node == "n2" {
				claimID = env.ID
			}
		}
	}
	if claimID == "" {
		t.Fatal("the failover never claimed n2")
	}
	// n2's executor has read what is left of its queue: nothing waiting,
	// nothing in its hands.
	reader := bustest.Connect(t, l.s, bus.Identity{Cluster: "lab", Service: "test", Node: "reader"})
	cons, err := reader.JS.Consumer(ctx, bus.CommandsStream, events.ExecutorConsumer("lab", "n2"))
	if err != nil {
		t.Fatal(err)
	}
	waittest.Succeeds(t, 10*time.Second, "n2's executor draining its queue", func() error {
		info, err := cons.Info(ctx)
		if err != nil {
			return err
		}
		if info.NumPending != 0 || info.NumAckPending != 0 {
			return fmt.Errorf("%d waiting, %d in its hands", info.NumPending, info.NumAckPending)
		}
		return nil
	})
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.applied[claimID] != "" {
		t.Fatalf("n2 applied claim %s after the arbiter had given it up", claimID)
	}
	if l.holders["n2"] {
		t.Fatal("n2 holds after the partition healed")
	}
	if l.dual != 0 {
		t.Fatalf("two holders at once %d times", l.dual)
	}
}

// TestOperatorRequestReply: an operator request over NATS is answered by
// the leader, recorded as an OperatorAction naming who asked, and causes
// the decision it asked for.
func TestOperatorRequestReply(t *testing.T) {
	l := newLab(t, "n1", "n2")
	l.leaseTTL = operatorLeaseTTL
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	l.nodesUp(ctx)
	l.arbiter("ctlA")
	l.arbiter("ctlB")
	l.waitHolder("n1", 10*time.Second)
	asker := l.asker()
	ask := func(req events.OperatorRequest) events.OperatorReply { return asker("alice", req) }
	// The leading arbiter refuses a switchover to a node it has not heard
	// yet; n2's first verdict may still be on its way on a loaded machine.
	rep := heardSwitchover(t, func() events.OperatorReply {
		return ask(events.OperatorRequest{Verb: events.OpSwitchover, Node: "n2", Reason: "patching n1", Operator: "alice@ops1"})
	})
	if !rep.Accepted || rep.EventID == "" || len(rep.Decisions) != 1 || rep.Epoch == 0 {
		t.Fatalf("reply %+v", rep)
	}
	l.waitHolder("n2", 10*time.Second)
	rep = ask(events.OperatorRequest{Verb: events.OpSwitchover, Node: "n9", Operator: "alice@ops1"})
	if rep.Accepted {
		t.Fatalf("switchover to an unknown node accepted: %+v", rep)
	}
	var requested, action, planned, decision *events.Envelope
	trail := l.trail(ctx)
	for _, env := range trail {
		if env.Type != events.TypeOperatorAction {
			continue
		}
		var a events.OperatorAction
		_ = json.Unmarshal(env.Data, &a)
		if action == nil && a.Stage == "" && a.Accepted {
			action = &env
		}
	}
	for _, env := range trail {
		switch {
		case action == nil:
		case env.Type == events.TypeOperatorAction && env.ID == action.CausationID:
			var a events.OperatorAction
			_ = json.Unmarshal(env.Data, &a)
			if a.Stage == events.StageRequested {
				requested = &env
			}
		case env.Type == events.TypePlannedMove && env.CausationID == action.ID:
			planned = &env
		case env.Type == events.TypeArbiterDecision && planned != nil && env.CausationID == planned.ID:
			decision = &env
		}
	}
	// The outcome's record must cite a "requested" record, the planned
	// move's stage (n1 reports no calls: moved at once) the outcome, and
	// the decision that stage.
	if requested == nil || action == nil || planned == nil || decision == nil {
		t.Fatalf("requested %v action %v planned %v decision %v", requested, action, planned, decision)
	}
	var a events.OperatorAction
	_ = json.Unmarshal(action.Data, &a)
	if a.Operator != "alice" || !a.Accepted || a.Reason != "patching n1" {
		t.Fatalf("action record %+v", a)
	}
}

// operatorLab is a two-node cluster with n1 holding, two arbiters, and
// ask(operator, request) sending a request on that operator's subject.
func operatorLab(t *testing.T) (*lab, context.Context, func(op string, req events.OperatorRequest) events.OperatorReply) {
	l := newLab(t, "n1", "n2")
	l.leaseTTL = operatorLeaseTTL
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	l.nodesUp(ctx)
	l.arbiter("ctlA")
	l.arbiter("ctlB")
	l.waitHolder("n1", 10*time.Second)
	return l, ctx, l.asker()
}

// operatorLeaseTTL is the arbiter lease in the tests of operator requests.
// Only the leader answers a request, and the lab's 1 s lease can pass from
// one replica to the other on a loaded machine (race detector, a shared runner) while a
// request is in flight: it then goes unanswered, as fanctl would report,
// which is not what these tests are about.
const operatorLeaseTTL = 3 * time.Second

// asker returns ask(operator, request): a request sent on that operator's
// subject, and the leader's reply.
func (l *lab) asker() func(op string, req events.OperatorRequest) events.OperatorReply {
	t := l.t
	b := bustest.Connect(t, l.s, bus.Identity{Cluster: "lab", Service: "fanctl", Node: "ops1"})
	return func(op string, req events.OperatorRequest) events.OperatorReply {
		t.Helper()
		data, _ := json.Marshal(req)
		m, err := b.NC.Request(events.OperatorRequestSubject("lab", op), data, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		var rep events.OperatorReply
		if err := json.Unmarshal(m.Data, &rep); err != nil {
			t.Fatal(err)
		}
		return rep
	}
}

func operatorActions(l *lab, ctx context.Context) []events.OperatorAction {
	var out []events.OperatorAction
	for _, env := range l.trail(ctx) {
		if env.Type == events.TypeOperatorAction {
			var a events.OperatorAction
			_ = json.Unmarshal(env.Data, &a)
			out = append(out, a)
		}
	}
	return out
}

// TestOperatorIsTheSubjects: alice's credentials (her subject) asking "as
// ceo@finance" are recorded as alice, with the free text as a comment.
func TestOperatorIsTheSubjects(t *testing.T) {
	l, ctx, ask := operatorLab(t)
	// On a loaded machine the leader may not have heard n2 yet: it refuses
	// (and records that, as alice too) until it has.
	rep := heardSwitchover(t, func() events.OperatorReply {
		return ask("alice", events.OperatorRequest{Verb: events.OpSwitchover, Node: "n2", Reason: "patching n1",
			Operator: "ceo@finance", Comment: "ceo@finance"})
	})
	if !rep.Accepted {
		t.Fatalf("reply %+v", rep)
	}
	l.waitHolder("n2", 10*time.Second)
	acts := operatorActions(l, ctx)
	accepted := 0
	for _, a := range acts {
		if a.Accepted && a.Stage == "" {
			accepted++
		}
	}
	if accepted != 1 || len(acts)%2 != 0 {
		t.Fatalf("operator actions %+v: want each request with its outcome, one accepted", acts)
	}
	for _, a := range acts {
		if a.Operator != "alice" || a.Comment != "ceo@finance" {
			t.Fatalf("recorded as %q (comment %q), want alice with the comment kept apart", a.Operator, a.Comment)
		}
	}
}

// TestOperatorReasonBounded: a 70,000-character reason is refused with a
// clear message, and nothing is applied or recorded as accepted.
func TestOperatorReasonBounded(t *testing.T) {
	l, ctx, ask := operatorLab(t)
	for _, req := range []events.OperatorRequest{
		{Verb: events.OpSwitchover, Node: "n2", Operator: "alice", Reason: strings.Repeat("x", 70000)},
		{Verb: events.OpSwitchover, Node: "n2", Operator: "alice", Reason: strings.Repeat("x", events.MaxReasonChars+1)},
	} {
		rep := ask("alice", req)
		if rep.Accepted || !strings.Contains(rep.Message, "refused") || !strings.Contains(rep.Message, "at most") {
			t.Fatalf("%d-character reason: %+v", len(req.Reason), rep)
		}
	}
	// A request that follows is served (so the refusals above were answered
	// and done with), and the refused ones left no accepted record.
	if rep := ask("alice", events.OperatorRequest{Verb: events.OpMaintenanceOn, Group: "pbx"}); !rep.Accepted {
		t.Fatalf("maintenance: %+v", rep)
	}
	for _, a := range operatorActions(l, ctx) {
		if a.Verb == events.OpSwitchover {
			t.Fatalf("a refused switchover was recorded: %+v", a)
		}
	}
	if h := l.holding(); len(h) != 1 || h[0] != "n1" {
		t.Fatalf("holders %v, want n1 still", h)
	}
}

// TestOperatorRequestUnrecordedIsRefused: when the audit stream does not
// take the request's record, the request is refused and nothing moves.
func TestOperatorRequestUnrecordedIsRefused(t *testing.T) {
	l, ctx, ask := operatorLab(t)
	admin := bustest.Connect(t, l.s, bus.Identity{Cluster: "lab", Service: "admin", Node: "ctl"})
	st, err := admin.JS.Stream(ctx, bus.EventsStream)
	if err != nil {
		t.Fatal(err)
	}
	// The audit stream stops taking operator actions (everything else still flows).
	cfg := st.CachedInfo().Config
	cfg.Subjects = []string{events.EventRoot + ".lab.probe.>", events.EventRoot + ".lab.node.>", events.EventRoot + ".lab.exec.>",
		events.EventRoot + ".lab.arbiter.>", events.EventRoot + ".lab.svc.>", events.EventRoot + ".lab.registry.>"}
	if _, err := admin.JS.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	rep := ask("alice", events.OperatorRequest{Verb: events.OpSwitchover, Node: "n2", Reason: "patching n1"})
	if rep.Accepted || !strings.Contains(rep.Message, "could not be recorded") {
		t.Fatalf("reply %+v", rep)
	}
	if h := l.holding(); len(h) != 1 || h[0] != "n1" {
		t.Fatalf("holders %v, want n1 still", h)
	}
}

// TestForgedHealthOnAnotherNodesSubject: a health event saying n1's PBX is
// down, published on n2's subject, is refused by the arbiters: no failover.
func TestForgedHealthOnAnotherNodesSubject(t *testing.T) {
	l := newLab(t, "n1", "n2")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	l.nodesUp(ctx)
	refused := l.arbiterCounting("ctlA")
	l.waitHolder("n1", 10*time.Second)
	n2 := bustest.Connect(t, l.s, bus.Identity{Cluster: "lab", Service: "prober", Node: "n2"})
	down := events.HealthTransition{Check: "pbx", TargetNode: "n1", Role: events.RoleSelf, From: events.HealthUp, To: events.HealthDown,
		Reason: "forged", Consecutive: 3, Rise: 2, Fall: 3, Evidence: []events.Evidence{{At: time.Now(), Error: "forged"}}}
	for _, src := range []string{"n1", "n2"} {
		env, err := events.New(events.Source{Service: "prober", Node: src}, "lab", down)
		if err != nil {
			t.Fatal(err)
		}
		data, _ := env.Encode()
		if _, err := n2.JS.Publish(ctx, events.HealthSubject("lab", "n2"), data); err != nil {
			t.Fatal(err)
		}
	}
	waittest.Succeeds(t, 10*time.Second, "two forged events refused", func() error {
		if n := refused.count(events.RefusedSubject); n < 2 {
			return fmt.Errorf("%v refused", n)
		}
		return nil
	})
	for _, env := range l.trail(ctx) {
		if env.Type == events.TypeArbiterDecision || env.Type == events.TypeReleaseIP {
			var d events.ArbiterDecision
			_ = json.Unmarshal(env.Data, &d)
			if env.Type == events.TypeReleaseIP || d.Action == events.ActionFailover {
				t.Fatalf("the forged health moved something: %s %s", env.Type, env.Data)
			}
		}
	}
	if h := l.holding(); len(h) != 1 || h[0] != "n1" {
		t.Fatalf("holders %v, want n1 still", h)
	}
}

// testLogger is silent unless FAN_TEST_LOG is set: then the arbiters log
// at debug level and the model executors print every command they apply,
// which is how a handover that fails only under load is read afterwards.
func testLogger(node string) *slog.Logger {
	if os.Getenv("FAN_TEST_LOG") == "" {
		return slog.New(slog.DiscardHandler)
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})).With("arb", node)
}
