package lease

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/bus/bustest"
	"github.com/nats-io/nats-server/v2/server"
)

func newLease(t *testing.T, s *server.Server, holder string) *Lease {
	t.Helper()
	b := bustest.Connect(t, s, bus.Identity{Cluster: "lab", Service: "arbiter", Node: holder})
	l, err := New(Config{Cluster: "lab", Holder: holder, TTL: time.Second, RenewEvery: 250 * time.Millisecond, Margin: 250 * time.Millisecond},
		b, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func run(t *testing.T, l *Lease) (chan Change, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	ch := make(chan Change, 16)
	done := make(chan struct{})
	go func() { l.Run(ctx, ch); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return ch, cancel
}

func waitChange(t *testing.T, ch <-chan Change, leading bool, within time.Duration) Change {
	t.Helper()
	deadline := time.After(within)
	for {
		select {
		case c, ok := <-ch:
			if !ok {
				t.Fatal("changes closed")
			}
			if c.Leading == leading {
				return c
			}
		case <-deadline:
			t.Fatalf("no change to leading=%v within %v", leading, within)
		}
	}
}

func claim(epoch uint64) (events.Envelope, *events.ClaimIP) {
	c := &events.ClaimIP{Group: "pbx", Node: "n2", Addresses: []string{"198.51.100.10/24"}, NotAfter: time.Now().Add(10 * time.Second)}
	env, err := events.New(events.Source{Service: "arbiter", Node: "a"}, "lab", c, events.WithEpoch(epoch))
	if err != nil {
		panic(err)
	}
	return env, c
}

func TestOneLeaderAndTakeoverWithHigherEpoch(t *testing.T) {
	s := bustest.Server(t)
	a, b := newLease(t, s, "a"), newLease(t, s, "b")
	cha, stopA := run(t, a)
	first := waitChange(t, cha, true, 3*time.Second)
	chb, _ := run(t, b)
	select {
	case c := <-chb:
		t.Fatalf("second candidate changed while the first leads: %+v", c)
	case <-time.After(time.Second):
	}
	if !a.Leading() || b.Leading() {
		t.Fatal("exactly one leader expected")
	}
	// The leader dies without releasing: the lease expires on the server and
	// the other candidate takes over with a higher epoch.
	stopA()
	second := waitChange(t, chb, true, 5*time.Second)
	if second.Epoch <= first.Epoch {
		t.Fatalf("epoch must grow across terms: %d then %d", first.Epoch, second.Epoch)
	}
}

// The lease's deadline passes while the bus is away and the first attempt
// after takes the lease again, as a new term: the owner must hear the old
// term end and the new one begin. Seen in chaos after a NATS restart: the
// arbiter kept stamping its commands with the old epoch, every one refused
// as "not the leader", and nothing moved for 80 s.
func TestTermRenewedAcrossAMissedDeadlineIsReported(t *testing.T) {
	s := bustest.Server(t)
	a := newLease(t, s, "a")
	cha, _ := run(t, a)
	first := waitChange(t, cha, true, 3*time.Second)
	// As after a bus outage longer than the lease: the local deadline has
	// passed and the term's record is gone from the stream.
	a.mu.Lock()
	if err := a.deleteTerm(context.Background()); err != nil {
		a.mu.Unlock()
		t.Fatal(err)
	}
	a.validUntil = time.Now().Add(-time.Second)
	a.mu.Unlock()
	ended := waitChange(t, cha, false, 3*time.Second)
	if ended.Epoch != first.Epoch {
		t.Fatalf("the end reported for epoch %d, want the old term's %d", ended.Epoch, first.Epoch)
	}
	second := waitChange(t, cha, true, 3*time.Second)
	if second.Epoch <= first.Epoch || second.Epoch != a.Epoch() {
		t.Fatalf("new term reported with epoch %d (lease's %d), want above %d", second.Epoch, a.Epoch(), first.Epoch)
	}
	env, c := claim(second.Epoch)
	if err := a.PublishCommand(context.Background(), env, c); err != nil {
		t.Fatalf("a command in the new term: %v", err)
	}
}

func TestStaleLeaderIsFencedByTheServer(t *testing.T) {
	s := bustest.Server(t)
	a := newLease(t, s, "a")
	cha, stopA := run(t, a)
	first := waitChange(t, cha, true, 3*time.Second)
	ctx := context.Background()
	env, c := claim(first.Epoch)
	if err := a.PublishCommand(ctx, env, c); err != nil {
		t.Fatalf("leader's command refused: %v", err)
	}

	// A stops renewing but its clock is stuck, so it still believes it
	// leads (a paused VM): only the server can stop it now.
	stopA()
	frozen := time.Now()
	a.mu.Lock()
	a.leading = true
	a.now = func() time.Time { return frozen }
	a.mu.Unlock()

	b := newLease(t, s, "b")
	chb, _ := run(t, b)
	waitChange(t, chb, true, 5*time.Second)

	env2, c2 := claim(first.Epoch)
	err := a.PublishCommand(ctx, env2, c2)
	if !errors.Is(err, ErrNotLeader) {
		t.Fatalf("stale leader's command: %v, want ErrNotLeader from the server's fence", err)
	}
	st, _ := a.js.Stream(ctx, bus.CommandsStream)
	msg, err := st.GetLastMsgForSubject(ctx, events.CommandSubject("lab", "n2", events.VerbClaim))
	if err != nil {
		t.Fatal(err)
	}
	if got, _, _ := events.Decode(msg.Data); got.ID != env.ID {
		t.Fatalf("the stale command was stored: last claim is %s", got.ID)
	}
}

func TestCommandsNeedTheLeadersEpoch(t *testing.T) {
	s := bustest.Server(t)
	a := newLease(t, s, "a")
	cha, _ := run(t, a)
	c := waitChange(t, cha, true, 3*time.Second)
	env, cmd := claim(c.Epoch + 1)
	if err := a.PublishCommand(context.Background(), env, cmd); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("command with a foreign epoch: %v", err)
	}
	b := newLease(t, s, "b")
	env, cmd = claim(c.Epoch)
	if err := b.PublishCommand(context.Background(), env, cmd); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("non-leader's command: %v", err)
	}
}

func TestConfigArithmetic(t *testing.T) {
	for _, c := range []Config{{TTL: 500 * time.Millisecond}, {TTL: 1500 * time.Millisecond}, {TTL: time.Second, RenewEvery: 800 * time.Millisecond, Margin: 300 * time.Millisecond}} {
		if _, err := New(c, &bus.Bus{}, slog.New(slog.DiscardHandler)); err == nil {
			t.Errorf("accepted %+v", c)
		}
	}
}

// forge writes a lease record as a client ignoring the protocol would: no
// condition, and no TTL (it would stay for the stream's max age, an hour).
func forge(t *testing.T, s *server.Server) uint64 {
	t.Helper()
	b := bustest.Connect(t, s, bus.Identity{Cluster: "lab", Service: "arbiter", Node: "mallory"})
	ack, err := b.JS.Publish(t.Context(), events.LeaseSubject("lab", events.ArbiterLease), []byte(`{"holder":"mallory","at":"2026-01-01T00:00:00Z"}`))
	if err != nil {
		t.Fatal(err)
	}
	return ack.Sequence
}

// A forged record does not depose the leader: its own record is still
// stored, so the forgery is no successor; it renews over it, keeps its term
// and its commands still pass the server's fence.
func TestForgedRecordDoesNotDepose(t *testing.T) {
	s := bustest.Server(t)
	a := newLease(t, s, "a")
	ch, _ := run(t, a)
	first := waitChange(t, ch, true, 3*time.Second)
	forged := forge(t, s)
	env, c := claim(first.Epoch)
	if err := a.PublishCommand(t.Context(), env, c); err != nil {
		t.Fatalf("command after a forged record: %v", err)
	}
	select {
	case c := <-ch:
		t.Fatalf("leadership changed after a forged record (seq %d): %+v", forged, c)
	case <-time.After(1500 * time.Millisecond): // several renewals
	}
	if !a.Leading() || a.Epoch() != first.Epoch {
		t.Fatalf("leading %v epoch %d, want leading in term %d", a.Leading(), a.Epoch(), first.Epoch)
	}
}

// A forged record left with no leader (or outliving one) blocks the lease
// only for the TTL, not for its own lifetime of an hour.
func TestStaleForgedRecordIsTakenOver(t *testing.T) {
	s := bustest.Server(t)
	forged := forge(t, s)
	start := time.Now()
	a := newLease(t, s, "a")
	ch, _ := run(t, a)
	c := waitChange(t, ch, true, 5*time.Second)
	if c.Epoch <= forged {
		t.Fatalf("term %d does not follow the forged record %d", c.Epoch, forged)
	}
	t.Logf("lease taken over %v after a forged record", time.Since(start).Round(time.Millisecond))
}

// TestMayHoldHandsTheLeaseBack: a replica told it may not hold stops
// commanding at once and stops renewing, so another takes the lease when
// the message expires; told it may, it campaigns again.
func TestMayHoldHandsTheLeaseBack(t *testing.T) {
	s := bustest.Server(t)
	var mu sync.Mutex
	may := true
	standby := newLease(t, s, "standby")
	standby.cfg.MayHold = func(bool) bool { mu.Lock(); defer mu.Unlock(); return may }
	sch, _ := run(t, standby)
	waitChange(t, sch, true, 5*time.Second)

	primary := newLease(t, s, "primary")
	pch, _ := run(t, primary)
	mu.Lock()
	may = false
	mu.Unlock()
	start := time.Now()
	waitChange(t, sch, false, 5*time.Second)
	if standby.Leading() {
		t.Fatal("still leading after handing back")
	}
	waitChange(t, pch, true, 5*time.Second)
	t.Logf("primary leads %v after the standby was told to hand back", time.Since(start).Round(time.Millisecond))
}
