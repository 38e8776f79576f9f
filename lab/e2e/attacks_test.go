package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fanpbx/fan/lab/bench"
	"github.com/fanpbx/fan/lab/leaders"
	"github.com/fanpbx/fan/lab/netlab"
	"github.com/fanpbx/fan/lab/stack"
	"github.com/fanpbx/fan/pkg/events"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
)

// Outcomes of one forgery. Only outcomeApplied is a failure.
const (
	outcomeAuth      = "refused by server: auth failure"
	outcomePerm      = "refused by server: permissions violation"
	outcomeJetStream = "refused by JetStream"
	outcomeNoAck     = "refused: never stored (no ack)"
	outcomeDropped   = "stored, dropped by fan"
	outcomeRefusedFn = "refused by fan (reply)"
	outcomeApplied   = "APPLIED"
)

// attacker is one identity's connection to the secure lab's bus.
type attacker struct {
	name  string
	nc    *nats.Conn
	js    jetstream.JetStream
	mu    sync.Mutex
	perms []string // permissions violations the server reported
}

func (a *attacker) violations() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.perms)
}

// dial connects as the identity whose files are bundle/<role>.*; role ""
// connects with the CA only (no certificate, no nkey).
func dial(st *stack.Stack, l *netlab.Lab, name, bundle, role string) (*attacker, error) {
	a := &attacker{name: name}
	b := st.Bundle(bundle)
	opts := []nats.Option{nats.RootCAs(filepath.Join(st.Bundle(stack.LabOperator), "ca.pem")),
		nats.Timeout(2 * time.Second), nats.NoReconnect(),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			if errors.Is(err, nats.ErrPermissionViolation) || strings.Contains(strings.ToLower(err.Error()), "permissions violation") {
				a.mu.Lock()
				a.perms = append(a.perms, err.Error())
				a.mu.Unlock()
			}
		})}
	if role != "" {
		nk, err := nats.NkeyOptionFromSeed(filepath.Join(b, role+".nk"))
		if err != nil {
			return nil, err
		}
		seed, err := os.ReadFile(filepath.Join(b, role+".nk"))
		if err != nil {
			return nil, err
		}
		kp, err := nkeys.FromSeed(bytes.TrimSpace(seed))
		if err != nil {
			return nil, err
		}
		pub, err := kp.PublicKey()
		if err != nil {
			return nil, err
		}
		// Replies come to the identity's own inbox, as bus.Connect does.
		opts = append(opts, nats.CustomInboxPrefix(events.InboxPrefix(pub)))
		opts = append(opts, nk, nats.ClientCert(filepath.Join(b, role+"-cert.pem"), filepath.Join(b, role+"-key.pem")))
	}
	url := strings.Replace(st.NATSURLFor(netlab.ControlHost), "nats://", "tls://", 1)
	err := l.Do(netlab.ControlHost, func() error {
		var err error
		a.nc, err = nats.Connect(url, opts...)
		return err
	})
	if err != nil {
		return a, err
	}
	a.js, err = jetstream.New(a.nc)
	return a, err
}

// try runs op and says how the bus answered: a permissions violation the
// server reported while op ran, a JetStream error, no answer, or stored.
func (a *attacker) try(ctx context.Context, op func(ctx context.Context) error) (string, error) {
	before := a.violations()
	ctx, cancel := context.WithTimeout(ctx, 1500*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- op(ctx) }()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case err := <-done:
			if a.violations() > before {
				return outcomePerm, err
			}
			var apiErr *jetstream.APIError
			switch {
			case err == nil:
				return outcomeDropped, nil
			case errors.As(err, &apiErr), errors.Is(err, nats.ErrJetStreamNotEnabledForAccount), errors.Is(err, nats.ErrStreamNotFound):
				return outcomeJetStream, err
			case errors.Is(err, errRefusedByFan):
				return outcomeRefusedFn, err
			default:
				return outcomeNoAck, err
			}
		case <-tick.C:
			if a.violations() > before {
				cancel()
				<-done
				return outcomePerm, nil
			}
		}
	}
}

var errRefusedByFan = errors.New("refused by fan")

// TestAttacks runs the colocated lab (three NATS servers) on the bus
// `fanctl nats-config` generates and
// tries, with every identity in turn, every forgery in its attacks table; none
// may change who holds the address, shorten the audit trail or be recorded
// as someone else. A genuine switchover and back by the operator then
// proves the permissions still let fan work.
func TestAttacks(t *testing.T) {
	began := time.Now()
	// The production bus: three NATS servers (one beside each PBX node's
	// services, one on the witness), every service under the permissions
	// `fanctl nats-config` derives from pkg/events, TLS everywhere.
	ctx, l, st, p := startLab(t, 4*time.Minute, stack.Options{SecureBus: true, Topology: stack.TopologyColocated,
		LeaderPlacement: true, StandbyArbiters: true})
	// Three servers electing their first leaders: the first holder is the
	// node whose prober was heard healthy first. The attacks below assume
	// n1 holds; the operator moves the address there if it is not.
	c, err := bench.NewClient(l)
	if err != nil {
		t.Fatal(err)
	}
	first, err := c.Holder(ctx, 90*time.Second)
	c.Close()
	if err != nil {
		t.Fatalf("initial placement on the secure bus: %v", err)
	}
	if first != "n1" {
		if out, err := st.Fanctl(ctx, "switchover", "--to", "n1", "--group", "pbx", "--reason", "attack test: start on n1"); err != nil {
			t.Fatalf("fanctl switchover --to n1: %v\n%s", err, out)
		}
	}
	if _, err := st.WaitAnswer(ctx, p, "n1", 30*time.Second); err != nil {
		t.Fatalf("n1 holding on the secure bus: %v", err)
	}
	t.Logf("secure lab up with n1 holding in %v", time.Since(began).Round(time.Millisecond))

	const cluster = "lab"
	vip := l.FloatingIP()
	admin, err := dial(st, l, "admin", stack.LabAdmin, "admin")
	if err != nil {
		t.Fatalf("admin: %v", err)
	}
	defer admin.nc.Close()
	// The arbiter's steward works under the generated permissions: every
	// raft leader ends up on the witness's server.
	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	if _, err := leaders.WaitAllOn(wctx, admin.js, st.ServerName(stack.WitnessHost)); err != nil {
		t.Fatalf("raft leaders under the generated permissions: %v", err)
	}
	wcancel()
	trail := func() uint64 {
		s, err := admin.js.Stream(ctx, events.EventsStream)
		if err != nil {
			t.Fatalf("audit trail: %v", err)
		}
		return s.CachedInfo().State.Msgs
	}
	holds := func(node string) bool {
		out, err := l.Exec(ctx, node, "ip", "-o", "addr", "show", "dev", "eth0")
		if err != nil {
			t.Fatal(err)
		}
		return strings.Contains(string(out), " "+vip.String())
	}
	// one holder: n1 has the address, n2 does not, and the client's ARP
	// entry names n1.
	oneHolder := func() error {
		if !holds("n1") || holds("n2") {
			return fmt.Errorf("address %s: n1 holds %v, n2 holds %v", vip, holds("n1"), holds("n2"))
		}
		if _, err := st.WaitAnswer(ctx, p, "n1", 2*time.Second); err != nil {
			return fmt.Errorf("floating address: %w", err)
		}
		if mac, _, _ := l.Neigh(netlab.ClientHost, vip.Addr()); mac != l.MAC("n1") {
			return fmt.Errorf("client's ARP entry for %s is %q, want n1's %s", vip, mac, l.MAC("n1"))
		}
		return nil
	}
	if err := oneHolder(); err != nil {
		t.Fatal(err)
	}

	env := func(src events.Source, pl events.Payload, opts ...events.Option) []byte {
		e, err := events.New(src, cluster, pl, opts...)
		if err != nil {
			t.Fatalf("build %T: %v", pl, err)
		}
		b, err := e.Encode()
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	arb := events.Source{Service: "arbiter", Node: netlab.ControlHost}
	claim := func(epoch uint64) (string, []byte) {
		pl := events.ClaimIP{Group: "pbx", Node: "n2", Addresses: []string{vip.String()}, NotAfter: time.Now().Add(time.Minute)}
		e, err := events.New(arb, cluster, pl, events.WithEpoch(epoch))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := e.Encode()
		return events.Subject(e, pl), b
	}
	healthN1 := env(events.Source{Service: "prober", Node: "n1"}, events.HealthTransition{
		Check: "asterisk", TargetNode: "n1", Role: events.RoleSelf, From: events.HealthUp, To: events.HealthDown,
		Reason: "forged", Consecutive: 3, Rise: 2, Fall: 3,
		Evidence: []events.Evidence{{OK: false, At: time.Now(), Error: "forged"}, {OK: false, At: time.Now(), Error: "forged"}},
	})
	request := func(operator, comment, reason string) []byte {
		b, _ := json.Marshal(events.OperatorRequest{Verb: events.OpSwitchover, Group: "pbx", Node: "n2",
			Operator: operator, Comment: comment, Reason: reason})
		return b
	}
	pub := func(a *attacker, subj string, data []byte) func(context.Context) error {
		return func(ctx context.Context) error {
			_, err := a.js.Publish(ctx, subj, data)
			return err
		}
	}
	// operatorRequest sends on subj and treats a refusal in the arbiter's
	// reply as fan dropping it.
	operatorRequest := func(a *attacker, subj string, data []byte) func(context.Context) error {
		return func(ctx context.Context) error {
			m, err := a.nc.RequestWithContext(ctx, subj, data)
			if err != nil {
				return err
			}
			var r events.OperatorReply
			if err := json.Unmarshal(m.Data, &r); err != nil {
				return fmt.Errorf("reply %q: %w", m.Data, err)
			}
			if !r.Accepted {
				return fmt.Errorf("%w: %s", errRefusedByFan, r.Message)
			}
			return nil
		}
	}

	type row struct{ attempt, identity, outcome, detail string }
	var rows []row
	counts := map[string]int{}
	identities := []struct{ name, bundle, role string }{
		{"no credentials", stack.LabOperator, ""},
		{"n2 prober", "n2", "prober"},
		{"n2 ipmover", "n2", "ipmover"},
		{"operator " + stack.LabOperator, stack.LabOperator, "operator"},
		{"auditor " + stack.LabAuditor, stack.LabAuditor, "auditor"},
		{"status page " + stack.LabViewer, stack.LabViewer, "viewer"},
	}
	long := strings.Repeat("x", 70000)
	for _, id := range identities {
		a, err := dial(st, l, id.name, id.bundle, id.role)
		if err != nil {
			if id.role != "" {
				t.Fatalf("%s could not connect: %v", id.name, err)
			}
			rows = append(rows, row{"connect", id.name, outcomeAuth, err.Error()})
			counts[outcomeAuth]++
			continue
		}
		if id.role == "" {
			t.Errorf("a client without credentials connected")
		}
		attacks := []struct {
			name string
			op   func(context.Context) error
		}{
			{"health for n1 on n2's subject", pub(a, events.HealthSubject(cluster, "n2"), healthN1)},
			{"forged command.claim_ip", func(ctx context.Context) error { s, b := claim(1); return pub(a, s, b)(ctx) }},
			{"claim with epoch 2^64-1", func(ctx context.Context) error { s, b := claim(math.MaxUint64); return pub(a, s, b)(ctx) }},
			{"forged lease record", func(ctx context.Context) error {
				b, _ := json.Marshal(events.LeaseRecord{Holder: "mallory", At: time.Now()})
				return pub(a, events.LeaseSubject(cluster, events.ArbiterLease), b)(ctx)
			}},
			{"garbage in the arbiter's state key", pub(a, events.KVSubject(events.StateBucket, events.ArbiterStateKey(cluster)), []byte("\x00garbage{"))},
			{"purge the audit stream", func(ctx context.Context) error {
				// The purge request itself, not after a stream info
				// the identity may not be allowed either.
				legacy, err := a.nc.JetStream(nats.MaxWait(time.Second))
				if err != nil {
					return err
				}
				return legacy.PurgeStream(events.EventsStream)
			}},
			{"delete the audit stream", func(ctx context.Context) error { return a.js.DeleteStream(ctx, events.EventsStream) }},
			{"operator request as someone else", func(ctx context.Context) error {
				victim := stack.LabOperator
				if id.role == "operator" {
					victim = "ceo"
				}
				return operatorRequest(a, events.OperatorRequestSubject(cluster, victim), request(victim, "", "forged"))(ctx)
			}},
			{"70,000-character reason", operatorRequest(a, events.OperatorRequestSubject(cluster, stack.LabOperator), request(stack.LabOperator, "", long))},
		}
		for _, at := range attacks {
			n := trail()
			outcome, err := a.try(ctx, at.op)
			detail := ""
			if err != nil {
				detail = err.Error()
			}
			if m := trail(); m < n {
				outcome = outcomeApplied
				detail = fmt.Sprintf("audit trail went from %d to %d messages", n, m)
			} else if err := oneHolder(); err != nil {
				outcome = outcomeApplied
				detail = err.Error()
			}
			if outcome == outcomeApplied {
				t.Errorf("%s as %s was applied: %s", at.name, id.name, detail)
			}
			rows = append(rows, row{at.name, id.name, outcome, detail})
			counts[outcome]++
			if a.nc.IsClosed() {
				// The server closes a connection after too many
				// violations: dial again for the next attempt.
				a2, err := dial(st, l, id.name, id.bundle, id.role)
				if err != nil {
					t.Fatalf("%s reconnect: %v", id.name, err)
				}
				a = a2
			}
		}
		a.nc.Close()
	}

	// Stored forgeries must stay without effect for a while: the arbiter
	// reacts to health within its detection budget, the lease to its TTL.
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		if err := oneHolder(); err != nil {
			t.Errorf("after the attacks: %v", err)
			break
		}
		time.Sleep(250 * time.Millisecond)
	}

	var b strings.Builder
	fmt.Fprintf(&b, "\n%-36s %-18s %s\n", "ATTEMPT", "IDENTITY", "OUTCOME")
	for _, r := range rows {
		d := r.detail
		if len(d) > 80 {
			d = d[:80] + "..."
		}
		fmt.Fprintf(&b, "%-36s %-18s %s  %s\n", r.attempt, r.identity, r.outcome, d)
	}
	for o, n := range counts {
		fmt.Fprintf(&b, "%s: %d\n", o, n)
	}
	t.Log(b.String())

	// A genuine switchover and back by the operator, the first one with a
	// comment claiming to be someone else: both recorded as the operator.
	for _, to := range []string{"n2", "n1"} {
		args := []string{"switchover", "--to", to, "--group", "pbx", "--reason", "attack test: genuine move"}
		if to == "n2" {
			args = append(args, "--as", "ceo@finance")
		}
		if out, err := st.Fanctl(ctx, args...); err != nil {
			t.Fatalf("fanctl switchover --to %s: %v\n%s", to, err, out)
		}
		if _, err := st.WaitAnswer(ctx, p, to, 20*time.Second); err != nil {
			t.Fatalf("switchover to %s: %v", to, err)
		}
	}
	evs, err := st.Events(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var actions, commented int
	for _, e := range evs {
		a, ok := e.Payload.(*events.OperatorAction)
		if !ok {
			continue
		}
		actions++
		if a.Comment == "ceo@finance" {
			commented++
		}
		if a.Operator != stack.LabOperator {
			t.Errorf("operator action %s recorded as %q, want %s: %+v", e.Env.ID, a.Operator, stack.LabOperator, a)
		}
	}
	if commented == 0 {
		t.Errorf("no operator action carries the --as text as its comment")
	}
	if actions < 2 {
		t.Errorf("%d operator actions in the trail, want at least the 2 switchovers", actions)
	}
	t.Logf("TestAttacks took %v", time.Since(began).Round(time.Millisecond))
}
