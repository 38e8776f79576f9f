package fanctl_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fanpbx/fan/cmd/internal/fanctl"
	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/waittest"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

// nkeyUser is one identity of a test bus: its seed file and public key.
type nkeyUser struct{ seed, pub string }

func newNkeyUser(t *testing.T) nkeyUser {
	t.Helper()
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	seed, _ := kp.Seed()
	pub, _ := kp.PublicKey()
	path := filepath.Join(t.TempDir(), "user.nk")
	if err := os.WriteFile(path, seed, 0o600); err != nil {
		t.Fatal(err)
	}
	return nkeyUser{seed: path, pub: pub}
}

// serverPerms are the permissions pkg/events gives role, as nats-server
// enforces them (what fanctl nats-config writes).
func serverPerms(t *testing.T, role events.BusRole, pub string, drop ...string) *server.Permissions {
	t.Helper()
	p, err := events.Identity{Cluster: "lab", Role: role, Name: string(role), PublicKey: pub}.Permissions()
	if err != nil {
		t.Fatal(err)
	}
	allow := slices.DeleteFunc(p.Publish.Allow, func(s string) bool { return slices.Contains(drop, s) })
	sp := &server.Permissions{
		Publish:   &server.SubjectPermission{Allow: allow, Deny: p.Publish.Deny},
		Subscribe: &server.SubjectPermission{Allow: p.Subscribe.Allow, Deny: p.Subscribe.Deny},
	}
	if p.AllowResponses {
		sp.Response = &server.ResponsePermission{MaxMsgs: 1}
	}
	return sp
}

// permBus is a JetStream server whose users have fan's permissions: the
// admin, an admin without the snapshot subjects, an operator, and a
// service-like writer with no restriction that stands for the services
// filling the trail.
type permBus struct {
	admin, adminNoSnap, operator, writer nkeyUser
}

func newPermBus(t *testing.T) *permBus {
	return &permBus{admin: newNkeyUser(t), adminNoSnap: newNkeyUser(t), operator: newNkeyUser(t), writer: newNkeyUser(t)}
}

// start runs a server on a fresh store.
func (pb *permBus) start(t *testing.T) *server.Server {
	t.Helper()
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(), NoLog: true, NoSigs: true,
		Nkeys: []*server.NkeyUser{
			{Nkey: pb.admin.pub, Permissions: serverPerms(t, events.RoleAdmin, pb.admin.pub)},
			{Nkey: pb.adminNoSnap.pub, Permissions: serverPerms(t, events.RoleAdmin, pb.adminNoSnap.pub, events.JSSnapshotSubjects)},
			{Nkey: pb.operator.pub, Permissions: serverPerms(t, events.RoleOperator, pb.operator.pub)},
			{Nkey: pb.writer.pub},
		}})
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server not ready")
	}
	t.Cleanup(s.Shutdown)
	return s
}

func fanctlAs(t *testing.T, s *server.Server, u nkeyUser, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := fanctl.Main(append([]string{"--url", s.ClientURL(), "--nkey", u.seed, "--cluster", "lab", "--timeout", "5s"}, args...), &out, &errb, "t")
	return code, out.String(), errb.String()
}

// TestBackupAndRestoreKeepTheTrail: the admin backs the audit stream up,
// the bus loses its store, and the admin restores it into the new one
// before provisioning: every record is back with its id, subject and time,
// fanctl explain follows a decision to its cause, and the stream goes on
// taking records. A restore over an existing stream is refused; an
// operator can take no backup and make no restore, and neither can an
// admin whose server configuration lacks the snapshot subjects.
func TestBackupAndRestoreKeepTheTrail(t *testing.T) {
	pb := newPermBus(t)
	s := pb.start(t)
	if code, _, errs := fanctlAs(t, s, pb.admin, "provision", "--replicas", "1"); code != 0 {
		t.Fatalf("provision: exit %d: %s", code, errs)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	w, err := bus.Connect(ctx, bus.Config{URL: s.ClientURL(), NKeySeed: pb.writer.seed}, bus.Identity{Cluster: "lab", Service: "prober", Node: "n1"}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	down := emitDown(t, w)
	aw, err := bus.Connect(ctx, bus.Config{URL: s.ClientURL(), NKeySeed: pb.writer.seed}, bus.Identity{Cluster: "lab", Service: "arbiter", Node: "ctl"}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	decision, err := aw.Emit(ctx, events.ArbiterDecision{Group: "pbx", Action: events.ActionFailover, From: "n1", To: "n2",
		Reason: "holder n1 reports pbx down", CausedBy: []string{down.ID}}, events.CausedBy(down))
	if err != nil {
		t.Fatal(err)
	}
	// Enough records that the snapshot takes several chunks, each of which
	// the client must acknowledge (what a permission could deny).
	const holds = 400
	noise := make([]byte, 300)
	for range holds {
		_, _ = rand.Read(noise)
		if _, err := aw.Emit(ctx, events.ArbiterDecision{Group: "pbx", Action: events.ActionHold, From: "n2", To: "n2",
			Reason: base64.StdEncoding.EncodeToString(noise), CausedBy: []string{down.ID}}); err != nil {
			t.Fatal(err)
		}
	}
	// Commands, as the arbiter publishes them: with their deadline as a
	// per-message TTL in the command stream, copied into the audit stream.
	const commands = 3
	for range commands {
		env, err := events.New(aw.Source(), "lab", events.ClaimIP{Group: "pbx", Node: "n2", Addresses: []string{"198.51.100.10/24"},
			NotAfter: time.Now().Add(time.Second)}, events.WithEpoch(1), events.CausedBy(decision))
		if err != nil {
			t.Fatal(err)
		}
		m := nats.NewMsg(events.CommandSubject("lab", "n2", events.VerbClaim))
		if m.Data, err = env.Encode(); err != nil {
			t.Fatal(err)
		}
		m.Header.Set("Nats-TTL", "1s")
		m.Header.Set("Nats-Msg-Id", env.ID)
		if _, err := aw.JS.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	records := holds + 2 + commands
	// Copied, and past their deadline: a restore must not drop them.
	waittest.Succeeds(t, 10*time.Second, fmt.Sprintf("%d records in the audit stream", records), func() error {
		st, err := aw.JS.Stream(ctx, bus.EventsStream)
		if err != nil {
			t.Fatal(err)
		}
		if n := st.CachedInfo().State.Msgs; n != uint64(records) {
			return fmt.Errorf("the audit stream holds %d", n)
		}
		return nil
	})
	time.Sleep(1100 * time.Millisecond)
	w.Close()
	aw.Close()
	trail := func(s *server.Server) string {
		t.Helper()
		code, out, errs := fanctlAs(t, s, pb.operator, "events", "--since", "all", "--json")
		if code != 0 {
			t.Fatalf("events: exit %d: %s", code, errs)
		}
		return out
	}
	before := trail(s)

	file := filepath.Join(t.TempDir(), "FAN_EVENTS.snap")
	for _, u := range []nkeyUser{pb.operator, pb.adminNoSnap} {
		if code, out, errs := fanctlAs(t, s, u, "backup", "--out", file); code == 0 {
			t.Fatalf("a backup without the snapshot subjects succeeded: %s", out)
		} else if !strings.Contains(errs, "Permissions Violation") {
			t.Fatalf("a backup without the snapshot subjects failed, but not on them: %s", errs)
		} else if _, err := os.Stat(file); err == nil {
			t.Fatalf("a failed backup left a file (%s)", errs)
		}
	}
	code, out, errs := fanctlAs(t, s, pb.admin, "backup", "--out", file)
	if code != 0 || !strings.Contains(out, fmt.Sprintf("FAN_EVENTS: %d messages, sequences 1..%d,", records, records)) {
		t.Fatalf("backup: exit %d %q %s", code, out, errs)
	}

	// The bus loses its store: a new server, empty.
	s.Shutdown()
	s2 := pb.start(t)
	for _, u := range []nkeyUser{pb.operator, pb.adminNoSnap} {
		if code, _, errs := fanctlAs(t, s2, u, "restore", file); code == 0 || !strings.Contains(errs, "Permissions Violation") {
			t.Fatalf("a restore without the snapshot subjects: exit %d: %s", code, errs)
		}
	}
	notBackup := filepath.Join(t.TempDir(), "x.snap")
	if err := os.WriteFile(notBackup, []byte("{\"format\":\"something else\"}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if code, _, errs := fanctlAs(t, s2, pb.admin, "restore", notBackup); code != 1 || !strings.Contains(errs, "not a fanctl backup") {
		t.Fatalf("restore of a file that is no backup: exit %d: %s", code, errs)
	}
	code, out, errs = fanctlAs(t, s2, pb.admin, "restore", file)
	if code != 0 || !strings.Contains(out, fmt.Sprintf("FAN_EVENTS restored: %d messages, sequences 1..%d,", records, records)) {
		t.Fatalf("restore: exit %d %q %s", code, out, errs)
	}
	if code, _, errs := fanctlAs(t, s2, pb.admin, "provision", "--replicas", "1"); code != 0 {
		t.Fatalf("provision after the restore: exit %d: %s", code, errs)
	}
	if after := trail(s2); after != before {
		t.Fatalf("the restored trail differs:\n%s\nwant\n%s", after, before)
	}
	code, out, errs = fanctlAs(t, s2, pb.operator, "explain", decision.ID)
	if code != 0 || !strings.Contains(out, "FAILOVER n1->n2") || !strings.Contains(out, "n1 pbx[self] up->down") {
		t.Fatalf("explain of a restored decision: exit %d\n%s%s", code, out, errs)
	}
	if code, _, errs := fanctlAs(t, s2, pb.admin, "restore", file); code != 1 || !strings.Contains(errs, "FAN_EVENTS exists on this bus") {
		t.Fatalf("a restore over the existing stream: exit %d: %s", code, errs)
	}
	// The restored stream takes new records after the old ones.
	w2, err := bus.Connect(ctx, bus.Config{URL: s2.ClientURL(), NKeySeed: pb.writer.seed}, bus.Identity{Cluster: "lab", Service: "prober", Node: "n1"}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer w2.Close()
	up, err := w2.Emit(ctx, events.HealthTransition{Check: "pbx", TargetNode: "n1", Role: events.RoleSelf, From: events.HealthDown,
		To: events.HealthUp, Reason: "2 consecutive successes", Consecutive: 2, Rise: 2, Fall: 3,
		Evidence: []events.Evidence{{At: time.Now(), OK: true}}})
	if err != nil {
		t.Fatal(err)
	}
	if after := trail(s2); !strings.HasPrefix(after, before) || !strings.Contains(after[len(before):], up.ID) {
		t.Fatalf("the new record is not after the restored ones:\n%s", after)
	}
}
