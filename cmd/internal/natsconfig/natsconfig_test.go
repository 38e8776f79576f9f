package natsconfig

import (
	"bytes"
	"context"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/porttest"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// testCluster is one nats-server on loopback, two PBX nodes, a control
// host with a DNS site executor, an operator and an auditor.
func testCluster(t *testing.T, out string) Cluster {
	c := Cluster{
		Cluster:   "c1",
		NATS:      []Server{{Name: "nats-1", Host: "localhost", IPs: []string{"127.0.0.1"}, ClientPort: porttest.Port(t), Monitor: "-"}},
		Nodes:     []Host{{Name: "n1"}, {Name: "n2"}},
		Control:   []Host{{Name: "ctl1", DNSSites: []string{"siteA"}}},
		Operators: []string{"alice"},
		Auditors:  []string{"bob"},
		NATSDir:   Bundle(out, "nats-1"),
		StoreDir:  filepath.Join(out, "store"),
	}
	c.defaults()
	if err := c.validate(); err != nil {
		t.Fatal(err)
	}
	return c
}

func startServer(t *testing.T, c Cluster, out string) {
	t.Helper()
	opts, err := server.ProcessConfigFile(filepath.Join(Bundle(out, "nats-1"), serverConf))
	if err != nil {
		t.Fatalf("generated configuration: %v", err)
	}
	opts.NoSigs = true
	s, err := server.NewServer(opts)
	if err != nil {
		t.Fatalf("server: %v", err)
	}
	go s.Start()
	t.Cleanup(s.Shutdown)
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("server not ready")
	}
}

// busConfig is what a host's bundle gives its service (paths in the
// bundle rather than under fan_dir, as the test does not install them).
func busConfig(c Cluster, out, dir, role string) bus.Config {
	b := Bundle(out, dir)
	return bus.Config{
		URL:      "nats://localhost:" + itoa(c.NATS[0].ClientPort),
		NKeySeed: filepath.Join(b, SeedFile(role)),
		TLS:      bus.TLSConfig{CA: filepath.Join(b, caCert), Cert: filepath.Join(b, CertFile(role)), Key: filepath.Join(b, KeyFile(role))},
	}
}

func itoa(i int) string { return strconv.Itoa(i) }

func connectBus(t *testing.T, ctx context.Context, c Cluster, out, dir, role string) *bus.Bus {
	t.Helper()
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	b, err := bus.Connect(cctx, busConfig(c, out, dir, role), bus.Identity{Cluster: c.Cluster, Service: role, Node: dir}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatalf("%s@%s connect: %v", role, dir, err)
	}
	t.Cleanup(b.Close)
	return b
}

// raw is a plain connection with an identity, whose permission errors are
// collected to be waited on.
type raw struct {
	nc   *nats.Conn
	errs chan error
}

func connectRaw(t *testing.T, c Cluster, out, dir, role string) *raw {
	t.Helper()
	cfg := busConfig(c, out, dir, role)
	r := &raw{errs: make(chan error, 64)}
	nk, err := nats.NkeyOptionFromSeed(cfg.NKeySeed)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := (&gen{}).nkey(cfg.NKeySeed)
	if err != nil {
		t.Fatal(err)
	}
	r.nc, err = nats.Connect(cfg.URL, nk, nats.RootCAs(cfg.TLS.CA), nats.ClientCert(cfg.TLS.Cert, cfg.TLS.Key),
		nats.CustomInboxPrefix(events.InboxPrefix(pub)),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			select {
			case r.errs <- err:
			default:
			}
		}))
	if err != nil {
		t.Fatalf("%s@%s raw connect: %v", role, dir, err)
	}
	t.Cleanup(r.nc.Close)
	return r
}

// refused waits for the server's permissions violation naming subject.
func (r *raw) refused(t *testing.T, what, subject string) {
	t.Helper()
	deadline := time.After(5 * time.Second)
	for {
		select {
		case err := <-r.errs:
			if strings.Contains(err.Error(), "Permissions Violation") && strings.Contains(err.Error(), subject) {
				t.Logf("refused as it should be: %s: %v", what, err)
				return
			}
		case <-deadline:
			t.Errorf("%s (%s) was not refused", what, subject)
			return
		}
	}
}

func (r *raw) publish(t *testing.T, what, subject string) {
	t.Helper()
	if err := r.nc.Publish(subject, []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	_ = r.nc.Flush()
	r.refused(t, what, subject)
}

func TestGeneratedConfigEnforced(t *testing.T) {
	out := t.TempDir()
	c := testCluster(t, out)
	if _, err := Generate(c, Options{Out: out}); err != nil {
		t.Fatal(err)
	}
	startServer(t, c, out)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// A stranger without credentials is not let in.
	if nc, err := nats.Connect("nats://localhost:"+itoa(c.NATS[0].ClientPort), nats.RootCAs(filepath.Join(Bundle(out, "n1"), caCert))); err == nil {
		nc.Close()
		t.Error("a client without nkey and certificate connected")
	}

	// A service cannot create the streams; the admin provisions them.
	pr := connectRaw(t, c, out, "n1", "prober")
	pjs, _ := jetstream.New(pr.nc)
	sctx, scancel := context.WithTimeout(ctx, 2*time.Second)
	defer scancel()
	if _, err := pjs.CreateStream(sctx, jetstream.StreamConfig{Name: "X", Subjects: []string{"x.>"}}); err == nil {
		t.Error("the prober created a stream")
	}
	pr.refused(t, "prober creates a stream", "$JS.API.STREAM.CREATE.X")

	admin := connectBus(t, ctx, c, out, "admin", "admin")
	if err := admin.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	if err := admin.ProvisionObjectStores(ctx); err != nil {
		t.Fatal(err)
	}

	// Services find what the admin made without create rights.
	prober := connectBus(t, ctx, c, out, "n1", "prober")
	arbiter := connectBus(t, ctx, c, out, "ctl1", "arbiter")
	ipmover := connectBus(t, ctx, c, out, "n1", "ipmover")
	for _, b := range []*bus.Bus{prober, arbiter, ipmover} {
		if err := b.Provision(ctx); err != nil {
			t.Fatal(err)
		}
	}

	// The arbiter reads the trail with an ordered consumer; the prober's
	// own health transition reaches it.
	got := make(chan events.Envelope, 4)
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	go func() {
		_ = arbiter.Watch(wctx, bus.WatchOptions{Subjects: []string{events.AllHealth(c.Cluster)}, All: true},
			func(env events.Envelope, _ events.Decoded, _ uint64) { got <- env })
	}()
	ht := events.HealthTransition{Check: "pbx", TargetNode: "n1", Role: events.RoleSelf, From: events.HealthUp, To: events.HealthDown,
		Reason: "test", Consecutive: 3, Rise: 2, Fall: 3, Evidence: []events.Evidence{{At: time.Now(), OK: false, Error: "timeout", ErrorClass: events.ErrorTimeout}}}
	if _, err := prober.Emit(ctx, ht); err != nil {
		t.Fatalf("prober emits its own health: %v", err)
	}
	select {
	case env := <-got:
		if env.Source.Node != "n1" {
			t.Errorf("source %v", env.Source)
		}
	case <-ctx.Done():
		t.Fatal("the arbiter did not read the prober's health transition")
	}

	// The arbiter writes its state and commands; n1's executor reads and
	// acknowledges its own (the second is delivered only after the first
	// is acknowledged: one in flight).
	kv, err := arbiter.StateKV(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, events.ArbiterStateKey(c.Cluster), []byte(`{}`)); err != nil {
		t.Fatalf("arbiter writes its state: %v", err)
	}
	if _, err := kv.Put(ctx, events.GroupStatusKey(c.Cluster, "pbx"), []byte(`{"group":"pbx"}`)); err != nil {
		t.Fatalf("arbiter writes a group status: %v", err)
	}
	ikv, err := ipmover.StateKV(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ikv.Get(ctx, events.GroupStatusKey(c.Cluster, "pbx")); err != nil {
		t.Fatalf("ipmover reads a group status: %v", err)
	}
	w, err := ikv.Watch(ctx, events.GroupStatusKey(c.Cluster, "pbx"))
	if err != nil {
		t.Fatalf("ipmover watches a group status: %v", err)
	}
	select {
	case e := <-w.Updates():
		if e == nil {
			t.Log("watch: initial values done")
		}
	case <-ctx.Done():
		t.Fatal("no watch update")
	}
	_ = w.Stop()
	for i := range 2 {
		claim := events.ClaimIP{Group: "pbx", Node: "n1", Addresses: []string{"198.51.100.10/24"}, NotAfter: time.Now().Add(time.Minute)}
		if _, err := arbiter.Emit(ctx, claim, events.WithEpoch(uint64(i+1))); err != nil {
			t.Fatalf("arbiter commands n1: %v", err)
		}
	}
	cmds := make(chan string, 2)
	cctx, ccancel := context.WithCancel(ctx)
	go func() {
		_ = ipmover.ConsumeCommands(cctx, "n1", func(_ context.Context, env events.Envelope, _ events.Command, _ uint64) { cmds <- env.ID })
	}()
	for range 2 {
		select {
		case <-cmds:
		case <-ctx.Done():
			t.Fatal("n1's executor did not get both commands (consume or ack refused?)")
		}
	}
	ccancel()
	// The executor reads the lease's records to check epochs, each both
	// ways at once: directly (any replica) and through the stream's
	// leader. Either alone would make the reads below pass, so each path
	// is also tried on its own.
	leaseSubject := events.LeaseSubject(c.Cluster, events.ArbiterLease)
	ack, err := arbiter.JS.Publish(ctx, leaseSubject, []byte(`{"holder":"ctl1","at":"2026-01-01T00:00:00Z"}`))
	if err != nil {
		t.Fatalf("arbiter writes the lease: %v", err)
	}
	recs, err := ipmover.LeaseRecords(ctx, events.ArbiterLease)
	if err != nil {
		t.Fatalf("ipmover opens the lease records: %v", err)
	}
	if _, seq, found, err := recs.Last(ctx, nil); err != nil || !found || seq != ack.Sequence {
		t.Fatalf("ipmover reads the last lease record: seq %d found %v err %v, want %d", seq, found, err, ack.Sequence)
	}
	if _, found, err := recs.At(ctx, ack.Sequence); err != nil || !found {
		t.Fatalf("ipmover reads a lease record by sequence: found %v err %v", found, err)
	}
	cmdStream, err := ipmover.JS.Stream(ctx, bus.CommandsStream)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cmdStream.GetLastMsgForSubject(ctx, leaseSubject); err != nil {
		t.Fatalf("ipmover's direct get of the last lease record: %v", err)
	}
	if _, err := cmdStream.GetMsg(ctx, ack.Sequence); err != nil {
		t.Fatalf("ipmover's direct get of a lease record: %v", err)
	}
	for _, req := range []string{`{"last_by_subj":"` + leaseSubject + `"}`, `{"seq":` + strconv.FormatUint(ack.Sequence, 10) + `}`} {
		m, err := ipmover.NC.Request(events.JSStreamMsgGetSubject(bus.CommandsStream), []byte(req), 5*time.Second)
		if err != nil || !bytes.Contains(m.Data, []byte(`"seq":`+strconv.FormatUint(ack.Sequence, 10))) {
			t.Fatalf("ipmover's read %s through the leader: %v %s", req, err, msgData(m))
		}
	}

	// The replicator uses the object stores without create rights.
	repl := connectBus(t, ctx, c, out, "n1", "replicator")
	obs, err := repl.JS.ObjectStore(ctx, events.ReplManifestBucket)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := obs.PutBytes(ctx, "m1", []byte("manifest")); err != nil {
		t.Fatalf("replicator puts an object: %v", err)
	}
	if b, err := obs.GetBytes(ctx, "m1"); err != nil || string(b) != "manifest" {
		t.Fatalf("replicator gets an object: %q %v", b, err)
	}
	if err := obs.Delete(ctx, "m1"); err != nil {
		t.Fatalf("replicator deletes an object: %v", err)
	}

	// Direct transfer: n2's replicator answers content requests on its
	// own subject, and n1's asks it (the answer through allow_responses,
	// to n1's private inbox).
	serving := connectRaw(t, c, out, "n2", "replicator")
	if _, err := serving.nc.Subscribe(events.ContentSubject(c.Cluster, "n2"), func(m *nats.Msg) {
		_ = m.Respond([]byte("content"))
	}); err != nil {
		t.Fatal(err)
	}
	_ = serving.nc.Flush()
	asking := connectRaw(t, c, out, "n1", "replicator")
	if m, err := asking.nc.Request(events.ContentSubject(c.Cluster, "n2"), []byte(`{}`), 5*time.Second); err != nil || string(m.Data) != "content" {
		t.Fatalf("replicator@n1 asks n2's replicator for contents: %v", err)
	}
	pr.publish(t, "prober@n1 asks n2's replicator for voicemail", events.ContentSubject(c.Cluster, "n2"))
	if _, err := asking.nc.SubscribeSync(events.ContentSubject(c.Cluster, "n2")); err != nil {
		t.Fatal(err)
	}
	asking.refused(t, "replicator@n1 answers content requests meant for n2", events.ContentSubject(c.Cluster, "n2"))

	// What each identity is refused.
	pr.publish(t, "prober@n1 says n2 is down", events.HealthSubject(c.Cluster, "n2"))
	pr.publish(t, "prober@n1 beacons for n2", events.BeaconSubject(c.Cluster, "n2"))
	pr.publish(t, "prober@n1 sends a claim", events.CommandSubject(c.Cluster, "n1", events.VerbClaim))
	pr.publish(t, "prober@n1 writes the lease", events.LeaseSubject(c.Cluster, "arbiter"))
	pr.publish(t, "prober@n1 writes the arbiter's state", events.KVSubject(events.StateBucket, events.ArbiterStateKey(c.Cluster)))
	pr.publish(t, "prober@n1 writes a failback permit", events.PermitSubject(c.Cluster, "pbx"))
	pr.publish(t, "prober@n1 purges the audit stream", "$JS.API.STREAM.PURGE.FAN_EVENTS")
	if _, err := pr.nc.SubscribeSync("_INBOX.>"); err != nil {
		t.Fatal(err)
	}
	pr.refused(t, "prober@n1 reads every inbox", "_INBOX.>")

	im := connectRaw(t, c, out, "n1", "ipmover")
	im.publish(t, "ipmover@n1 reports for n2", events.CommandResultSubject(c.Cluster, "n2"))
	im.publish(t, "ipmover@n1 opens n2's command consumer",
		"$JS.API.CONSUMER.CREATE.FAN_CMD."+events.ExecutorConsumer(c.Cluster, "n2")+"."+events.NodeCommands(c.Cluster, "n2"))
	im.publish(t, "ipmover@n1 reads n2's commands", "$JS.API.CONSUMER.MSG.NEXT.FAN_CMD."+events.ExecutorConsumer(c.Cluster, "n2"))
	im.publish(t, "ipmover@n1 sends a release", events.CommandSubject(c.Cluster, "n2", events.VerbRelease))

	op := connectRaw(t, c, out, "alice", "operator")
	op.publish(t, "operator writes a group status", events.KVSubject(events.StateBucket, events.GroupStatusKey(c.Cluster, "pbx")))
	op.publish(t, "operator deletes the command stream", "$JS.API.STREAM.DELETE.FAN_CMD")
	op.publish(t, "operator alice asks as bob", events.OperatorRequestSubject(c.Cluster, "bob"))
	au := connectRaw(t, c, out, "bob", "auditor")
	au.publish(t, "auditor asks for a switchover", events.OperatorRequestSubject(c.Cluster, "bob"))

	ad := connectRaw(t, c, out, "admin", "admin")
	ad.publish(t, "admin purges the audit stream", "$JS.API.STREAM.PURGE.FAN_EVENTS")
	ad.publish(t, "admin deletes the audit stream", "$JS.API.STREAM.DELETE.FAN_EVENTS")
	ad.publish(t, "admin shortens the audit stream", "$JS.API.STREAM.UPDATE.FAN_EVENTS")

	// The stream itself refuses a purge too, whoever asks (belt and braces).
	st, err := admin.JS.Stream(ctx, events.EventsStream)
	if err != nil {
		t.Fatal(err)
	}
	if cfg := st.CachedInfo().Config; !cfg.DenyPurge || !cfg.DenyDelete {
		t.Errorf("audit stream deny purge %v delete %v", cfg.DenyPurge, cfg.DenyDelete)
	}
}

func TestGenerateIdempotentAndRenew(t *testing.T) {
	out := t.TempDir()
	c := testCluster(t, out)
	if _, err := Generate(c, Options{Out: out}); err != nil {
		t.Fatal(err)
	}
	read := func(p string) string {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	ca := read(filepath.Join(out, caDir, caCert))
	seed := read(filepath.Join(Bundle(out, "n1"), SeedFile("prober")))
	cert := read(filepath.Join(Bundle(out, "n1"), CertFile("prober")))

	res, err := Generate(c, Options{Out: out})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Created)+len(res.Renewed)+len(res.Written) != 0 {
		t.Errorf("a second run changed %v %v %v", res.Created, res.Renewed, res.Written)
	}

	// A new node and operator: added, nothing else changes but the server config.
	c.Nodes = append(c.Nodes, Host{Name: "n3"})
	c.Operators = append(c.Operators, "carol")
	c.defaults()
	res, err = Generate(c, Options{Out: out})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range res.Created {
		if !strings.Contains(f, "/n3/") && !strings.Contains(f, "/carol/") {
			t.Errorf("adding n3 and carol created %s", f)
		}
	}
	if !strings.Contains(read(filepath.Join(Bundle(out, "nats-1"), serverConf)), "prober@n3") {
		t.Error("the server config has no user for n3's prober")
	}
	if read(filepath.Join(out, caDir, caCert)) != ca || read(filepath.Join(Bundle(out, "n1"), SeedFile("prober"))) != seed {
		t.Error("CA or seed changed")
	}

	res, err = Generate(c, Options{Out: out, Renew: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Renewed) == 0 || read(filepath.Join(Bundle(out, "n1"), CertFile("prober"))) == cert {
		t.Error("-renew reissued nothing")
	}
	if read(filepath.Join(out, caDir, caCert)) != ca || read(filepath.Join(Bundle(out, "n1"), SeedFile("prober"))) != seed {
		t.Error("-renew changed the CA or a seed")
	}
	newCert, err := parseCert([]byte(read(filepath.Join(Bundle(out, "n1"), CertFile("prober")))))
	if err != nil {
		t.Fatal(err)
	}
	caCertParsed, _ := parseCert([]byte(ca))
	if err := newCert.CheckSignatureFrom(caCertParsed); err != nil {
		t.Errorf("renewed certificate not from the same CA: %v", err)
	}
}

// Every secret Generate writes (the CA's key, each identity's key and nkey
// seed) is readable by its owner only, whatever the umask, even where a
// crashed earlier run left a world-readable temporary file under the name an
// older release wrote through.
func TestGeneratedSecretsAreOwnerOnly(t *testing.T) {
	old := syscall.Umask(0)
	defer syscall.Umask(old)
	out := t.TempDir()
	if err := os.MkdirAll(filepath.Join(out, caDir), 0o755); err != nil {
		t.Fatal(err)
	}
	leftover := filepath.Join(out, caDir, caKey) + ".tmp"
	if err := os.WriteFile(leftover, []byte("left by a crash"), 0o644); err != nil {
		t.Fatal(err)
	}
	c := testCluster(t, out)
	if _, err := Generate(c, Options{Out: out}); err != nil {
		t.Fatal(err)
	}
	secrets := 0
	err := filepath.WalkDir(out, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || p == leftover {
			return err
		}
		if strings.Contains(d.Name(), ".tmp") {
			t.Errorf("%s: a temporary file outlived the run", p)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if !bytes.Contains(b, []byte("PRIVATE KEY")) && !bytes.HasPrefix(b, []byte("SU")) {
			return nil
		}
		secrets++
		fi, err := d.Info()
		if err != nil {
			return err
		}
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("%s holds a secret with mode %v, want 0600", p, fi.Mode().Perm())
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if secrets < 3 {
		t.Fatalf("found %d secrets in the output, want the CA key and every identity's", secrets)
	}
}

func msgData(m *nats.Msg) []byte {
	if m == nil {
		return nil
	}
	return m.Data
}
