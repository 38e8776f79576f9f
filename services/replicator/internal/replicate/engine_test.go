package replicate_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fanpbx/fan/lab/amipeer"
	"github.com/fanpbx/fan/pkg/ami"
	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/bus/bustest"
	"github.com/fanpbx/fan/pkg/platform/daemon"
	"github.com/fanpbx/fan/pkg/platform/waittest"
	"github.com/fanpbx/fan/services/replicator/internal/fstree"
	"github.com/fanpbx/fan/services/replicator/internal/replicate"
	"github.com/fanpbx/fan/services/replicator/internal/store"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/prometheus/client_golang/prometheus"
)

const (
	cluster = "lab"
	group   = "pbx"
)

type node struct {
	name, root, state string
	peer              *amipeer.Peer
}

// cluster runs one embedded JetStream and one replicator per node.
type lab struct {
	t   testing.TB
	srv *server.Server
	ctl *bus.Bus
	ctx context.Context

	// patient lets benchmarks wait minutes instead of seconds.
	patient bool

	mu  sync.Mutex
	evs []events.Envelope
	pls []events.Payload
}

func newLab(t testing.TB) *lab {
	t.Helper()
	srv := bustest.Server(t)
	ctl := bustest.Connect(t, srv, bus.Identity{Cluster: cluster, Service: "test", Node: "ctl"})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	t.Cleanup(cancel)
	l := &lab{t: t, srv: srv, ctl: ctl, ctx: ctx}
	wctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = ctl.Watch(wctx, bus.WatchOptions{Subjects: []string{events.ClusterEvents(cluster)}, All: true},
			func(env events.Envelope, p events.Decoded, _ uint64) {
				l.mu.Lock()
				l.evs = append(l.evs, env)
				l.pls = append(l.pls, p)
				l.mu.Unlock()
			})
	}()
	t.Cleanup(func() { stop(); <-done })
	return l
}

func (l *lab) start(n *node, extra ...func(*replicate.Config)) context.CancelFunc {
	t := l.t
	t.Helper()
	b := bustest.Connect(t, l.srv, bus.Identity{Cluster: cluster, Service: "replicator", Node: n.name})
	st, err := store.Open(l.ctx, b.JS, 1)
	if err != nil {
		t.Fatal(err)
	}
	ex, err := fstree.NewExcluder([]string{"tmp/"})
	if err != nil {
		t.Fatal(err)
	}
	cfg := replicate.Config{
		Cluster: cluster, Group: group, Node: n.name, StateDir: n.state,
		Trees:    []replicate.Tree{{Name: "voicemail", Root: n.root, Exclude: ex}},
		Debounce: 10 * time.Millisecond, ScanInterval: 500 * time.Millisecond,
		MaxDeleteShare: 0.10, AllowDeletes: 2, Workers: 4, Owner: os.Geteuid() == 0,
	}
	if n.peer != nil {
		sess := ami.NewSession(ami.Config{Addr: n.peer.Addr(), Username: "fan", Secret: "s"}, nil)
		t.Cleanup(func() { sess.Close() })
		cfg.Trees = append(cfg.Trees, replicate.Tree{Name: "astdb", AMI: sess, Families: []string{"registrar"}, Poll: 100 * time.Millisecond})
	}
	for _, f := range extra {
		f(&cfg)
	}
	level := slog.LevelWarn
	if os.Getenv("FAN_TEST_DEBUG") != "" {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})).With("node", n.name)
	e, err := replicate.New(cfg, b, st, prometheus.NewRegistry(), log)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(l.ctx)
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("%s: run: %v", n.name, err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// holderStore connects as n1 (the holder, played by a test) and opens
// the store.
func (l *lab) holderStore() *store.Store {
	l.t.Helper()
	b := bustest.Connect(l.t, l.srv, bus.Identity{Cluster: cluster, Service: "replicator", Node: "n1"})
	st, err := store.Open(l.ctx, b.JS, 1)
	if err != nil {
		l.t.Fatal(err)
	}
	return st
}

// publishAsN1 publishes a manifest (or a progress manifest) of the
// voicemail tree as n1, the holder in epoch 1, straight into the store.
func (l *lab) publishAsN1(st *store.Store, progress bool, gen uint64, es []fstree.Entry) {
	l.t.Helper()
	m := &fstree.Manifest{Cluster: cluster, Group: group, Tree: "voicemail", Node: "n1", Epoch: 1, Generation: gen,
		Created: time.Now(), Changed: time.Now(), Digest: fstree.Digest(es), Entries: es}
	put := st.PutManifest
	if progress {
		put = st.PutProgress
	}
	if err := put(l.ctx, m); err != nil {
		l.t.Fatal(err)
	}
}

// setHolder writes the group status as the arbiter leader would.
func (l *lab) setHolder(holder string, epoch uint64) {
	l.t.Helper()
	kv, err := l.ctl.StateKV(l.ctx)
	if err != nil {
		l.t.Fatal(err)
	}
	b, _ := json.Marshal(events.GroupStatus{Group: group, Holder: holder, Epoch: epoch, UpdatedAt: time.Now()})
	if _, err := kv.Put(l.ctx, events.GroupStatusKey(cluster, group), b); err != nil {
		l.t.Fatal(err)
	}
}

// patience is how long a wait may take: within, or minutes in a
// benchmark, whose trees are much larger than a test's.
func (l *lab) patience(within time.Duration) time.Duration {
	if l.patient {
		return 15 * time.Minute
	}
	return within
}

// find returns the first event (after index from) matching fn.
func (l *lab) find(from int, fn func(events.Envelope, events.Payload) bool) (events.Envelope, events.Payload, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i := from; i < len(l.evs); i++ {
		if fn(l.evs[i], l.pls[i]) {
			return l.evs[i], l.pls[i], i
		}
	}
	return events.Envelope{}, nil, -1
}

func (l *lab) mark() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.evs)
}

// waitCaughtUp waits for a status from source about peer, caught up in epoch, after mark.
func (l *lab) waitCaughtUp(from int, source, peer, tree string, epoch uint64) *events.ReplicationStatus {
	l.t.Helper()
	var got *events.ReplicationStatus
	waittest.Succeeds(l.t, l.patience(20*time.Second), fmt.Sprintf("%s reports %s caught up on %s in epoch %d", source, peer, tree, epoch), func() error {
		_, p, i := l.find(from, func(env events.Envelope, p events.Payload) bool {
			s, ok := p.(*events.ReplicationStatus)
			return ok && s.Node == source && s.Peer == peer && s.Tree == tree && s.CaughtUp && env.Epoch == epoch
		})
		if i < 0 {
			return fmt.Errorf("no such status")
		}
		got = p.(*events.ReplicationStatus)
		return nil
	})
	return got
}

// same compares two trees entry by entry: kind, content, mode, owner and
// file mtimes (what Apply promises), through the tree's exclusions.
func same(a, b string) error {
	ex, _ := fstree.NewExcluder([]string{"tmp/"})
	ea, err := (&fstree.Scanner{Root: a, Exclude: ex}).Scan(context.Background())
	if err != nil {
		return err
	}
	eb, err := (&fstree.Scanner{Root: b, Exclude: ex}).Scan(context.Background())
	if err != nil {
		return err
	}
	if len(ea.Entries) != len(eb.Entries) {
		return fmt.Errorf("%d entries vs %d", len(ea.Entries), len(eb.Entries))
	}
	for i := range ea.Entries {
		x, y := ea.Entries[i], eb.Entries[i]
		if x.Kind == fstree.KindDir {
			x.MTime, y.MTime = 0, 0
		}
		if x != y {
			return fmt.Errorf("entry differs:\n %+v\n %+v", x, y)
		}
	}
	return nil
}

func write(t testing.TB, root, rel string, data []byte) {
	t.Helper()
	p := filepath.Join(root, rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, data, 0o640); err != nil {
		t.Fatal(err)
	}
}

func random(n int) []byte {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return b
}

func newNode(t testing.TB, name string) *node {
	d := t.TempDir()
	return &node{name: name, root: filepath.Join(d, "voicemail"), state: filepath.Join(d, "state")}
}

// TestDirectionFollowsTheEpoch walks the whole life of a pair: initial sync
// of many small files and a large one, changes of every kind, a failover
// that flips the direction, the reverse sync a failback waits for, a node
// of an older epoch that never pushes, and the safety valve.
// preserve carries owners and setuid, setgid and sticky bits as the
// holder has them (preserve_owner, preserve_special_bits), which the
// default policy does not.
func preserve(c *replicate.Config) {
	for i := range c.Trees {
		c.Trees[i].Policy.PreserveOwner, c.Trees[i].Policy.PreserveSpecialBits = true, true
	}
}

func TestDirectionFollowsTheEpoch(t *testing.T) {
	l := newLab(t)
	n1, n2 := newNode(t, "n1"), newNode(t, "n2")
	for i := range 300 {
		write(t, n1.root, fmt.Sprintf("default/%d/INBOX/msg%04d.txt", 1000+i%10, i), []byte(fmt.Sprintf("callerid=%d\n", i)))
	}
	big := random(6<<20 + 12345)
	write(t, n1.root, "default/1000/INBOX/msg9999.wav", big)
	write(t, n1.root, "default/1000/tmp/recording.wav", []byte("in progress"))
	write(t, n1.root, "default/1000/INBOX/.lock-1234", nil)
	if err := os.Symlink("../1001", filepath.Join(n1.root, "default/alias")); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(n1.root, "default/1001"), 0o2770); err != nil {
		t.Fatal(err)
	}
	if os.Geteuid() == 0 {
		if err := os.Chown(filepath.Join(n1.root, "default/1002/INBOX/msg0002.txt"), 1234, 5678); err != nil {
			t.Fatal(err)
		}
	}
	old := time.Date(2020, 1, 2, 3, 4, 5, 600, time.UTC)
	if err := os.Chtimes(filepath.Join(n1.root, "default/1003/INBOX/msg0003.txt"), old, old); err != nil {
		t.Fatal(err)
	}

	mark := l.mark()
	l.start(n1, preserve)
	stop2 := l.start(n2, preserve)
	l.setHolder("n1", 1)

	// Initial sync, confirmed by the target before "caught up" is claimed.
	st := l.waitCaughtUp(mark, "n1", "n2", "voicemail", 1)
	if err := same(n1.root, n2.root); err != nil {
		t.Fatalf("after caught up: %v", err)
	}
	if st.Files < 301 || st.Bytes < int64(len(big)) {
		t.Errorf("first pass reported %d files, %d bytes", st.Files, st.Bytes)
	}
	if _, _, i := l.find(mark, func(env events.Envelope, p events.Payload) bool {
		a, ok := p.(*events.ReplicationApplied)
		return ok && a.Node == "n2" && a.Generation == st.Generation
	}); i < 0 {
		t.Fatal("caught up reported without the target's confirmation")
	}
	for _, p := range []string{"default/1000/tmp/recording.wav", "default/1000/INBOX/.lock-1234"} {
		if _, err := os.Lstat(filepath.Join(n2.root, p)); !os.IsNotExist(err) {
			t.Errorf("excluded %s reached the target (%v)", p, err)
		}
	}

	// Create, modify, rename, delete.
	write(t, n1.root, "default/1005/INBOX/msg0400.txt", []byte("new"))
	write(t, n1.root, "default/1001/INBOX/msg0001.txt", []byte("modified"))
	if err := os.Rename(filepath.Join(n1.root, "default/1004/INBOX/msg0004.txt"), filepath.Join(n1.root, "default/1004/Old/msg0000.txt")); err != nil {
		// Old/ does not exist yet: create it, as app_voicemail would.
		write(t, n1.root, "default/1004/Old/.keep", nil)
		if err := os.Rename(filepath.Join(n1.root, "default/1004/INBOX/msg0004.txt"), filepath.Join(n1.root, "default/1004/Old/msg0000.txt")); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Remove(filepath.Join(n1.root, "default/1006/INBOX/msg0006.txt")); err != nil {
		t.Fatal(err)
	}
	waittest.Succeeds(l.t, l.patience(10*time.Second), "changes replicated", func() error { return same(n1.root, n2.root) })

	// A crash of the target and a restart converge too (its state is on disk).
	stop2()
	write(t, n1.root, "default/1007/INBOX/msg0500.txt", []byte("while n2 was down"))
	mark = l.mark()
	stop2 = l.start(n2, preserve)
	l.waitCaughtUp(mark, "n1", "n2", "voicemail", 1)
	// "Caught up" is with the source's last pass; the write above may reach
	// n1's replicator (a file notification, then a debounced pass) after n2
	// confirmed the pass before it (seen under load), so converge, then.
	waittest.Succeeds(l.t, l.patience(10*time.Second), "converged after target restart", func() error { return same(n1.root, n2.root) })

	// Failover: n2 holds in epoch 2. A message left on n2 during the outage
	// flows back to n1 before any failback, and n2 says so for peer n1.
	mark = l.mark()
	l.setHolder("n2", 2)
	// Let n2 take the source role before anything is written there: this
	// test is about direction. The moment before it does (a KV watch away)
	// is what a target's fresh check of the source's tenure narrows.
	waittest.Succeeds(l.t, l.patience(10*time.Second), "n2 acts as the source in epoch 2", func() error {
		if _, _, i := l.find(mark, func(env events.Envelope, p events.Payload) bool {
			s, ok := p.(*events.ReplicationStatus)
			return ok && s.Node == "n2" && env.Epoch == 2
		}); i < 0 {
			return fmt.Errorf("no status from n2 in epoch 2")
		}
		return nil
	})
	write(t, n2.root, "default/1000/INBOX/msg0700.wav", random(64<<10))
	write(t, n2.root, "default/1000/INBOX/msg0700.txt", []byte("left on the standby"))
	// n1, holder of the older epoch, writes too: it must never push.
	write(t, n1.root, "default/1000/INBOX/msg0800.txt", []byte("written on the old primary"))
	waittest.Succeeds(l.t, l.patience(10*time.Second), "reverse sync", func() error {
		if _, err := os.Stat(filepath.Join(n1.root, "default/1000/INBOX/msg0700.txt")); err != nil {
			return err
		}
		return same(n2.root, n1.root)
	})
	l.waitCaughtUp(mark, "n2", "n1", "voicemail", 2)
	if _, err := os.Stat(filepath.Join(n2.root, "default/1000/INBOX/msg0800.txt")); !os.IsNotExist(err) {
		t.Fatalf("a node of an older epoch pushed a file (%v)", err)
	}
	if _, _, i := l.find(mark, func(env events.Envelope, p events.Payload) bool {
		s, ok := p.(*events.ReplicationStatus)
		return ok && s.Node == "n1" && env.Epoch >= 2
	}); i >= 0 {
		t.Fatal("n1 reported as a source in epoch 2")
	}
	// n1's own unreplicated message was not lost: it was preserved as a conflict.
	_, p, i := l.find(mark, func(_ events.Envelope, p events.Payload) bool {
		c, ok := p.(*events.ReplicationConflict)
		return ok && c.Node == "n1"
	})
	if i < 0 {
		t.Fatal("no conflict reported for the old primary's local message")
	}
	c := p.(*events.ReplicationConflict)
	if got, err := os.ReadFile(c.Files[0].PreservedAs); err != nil || string(got) != "written on the old primary" || c.Files[0].Path != "default/1000/INBOX/msg0800.txt" {
		t.Fatalf("conflict %+v: preserved copy %q, %v", c.Files[0], got, err)
	}

	// Safety valve: the source loses half its files at once (its
	// replicator is down meanwhile, so no pass sees a part of it: the valve
	// judges each pass, and deletions spread over passes under the share
	// each are applied); the target deletes nothing and raises an alarm,
	// and the source does not claim caught up.
	stop2()
	for i := range 150 {
		_ = os.Remove(filepath.Join(n2.root, fmt.Sprintf("default/%d/INBOX/msg%04d.txt", 1000+i%10, i)))
	}
	mark = l.mark()
	l.start(n2, preserve)
	waittest.Succeeds(l.t, l.patience(10*time.Second), "safety valve alarm", func() error {
		if _, _, i := l.find(mark, func(_ events.Envelope, p events.Payload) bool {
			a, ok := p.(*events.ReplicationAlarm)
			return ok && a.Node == "n1" && a.Reason == events.AlarmSafetyValve && a.Deletes >= 140
		}); i < 0 {
			return fmt.Errorf("no alarm")
		}
		return nil
	})
	if _, err := os.Stat(filepath.Join(n1.root, "default/1000/INBOX/msg0000.txt")); err != nil {
		t.Fatalf("target deleted despite the valve: %v", err)
	}
	waittest.Succeeds(l.t, l.patience(10*time.Second), "not caught up while the valve holds", func() error {
		if _, _, i := l.find(mark, func(_ events.Envelope, p events.Payload) bool {
			s, ok := p.(*events.ReplicationStatus)
			return ok && s.Node == "n2" && s.Peer == "n1" && !s.CaughtUp && strings.Contains(s.Error, "safety valve")
		}); i < 0 {
			return fmt.Errorf("no such status")
		}
		return nil
	})
	if _, _, i := l.find(mark, func(_ events.Envelope, p events.Payload) bool {
		s, ok := p.(*events.ReplicationStatus)
		return ok && s.Node == "n2" && s.Peer == "n1" && s.CaughtUp
	}); i >= 0 {
		t.Fatal("caught up reported while the target refused the pass")
	}
}

// TestEmptySourceIsNotPublished: a source tree that disappears (unmounted)
// or empties is never read as "delete everything".
func TestEmptySourceIsNotPublished(t *testing.T) {
	l := newLab(t)
	n1, n2 := newNode(t, "n1"), newNode(t, "n2")
	for i := range 5 {
		write(t, n1.root, fmt.Sprintf("f%d", i), []byte{byte(i)})
	}
	mark := l.mark()
	l.start(n1)
	l.start(n2)
	l.setHolder("n1", 1)
	l.waitCaughtUp(mark, "n1", "n2", "voicemail", 1)

	mark = l.mark()
	moved := n1.root + ".unmounted"
	if err := os.Rename(n1.root, moved); err != nil {
		t.Fatal(err)
	}
	waittest.Succeeds(l.t, l.patience(10*time.Second), "missing source alarm", func() error {
		if _, _, i := l.find(mark, func(_ events.Envelope, p events.Payload) bool {
			a, ok := p.(*events.ReplicationAlarm)
			return ok && a.Node == "n1" && a.Reason == events.AlarmSourceMissing
		}); i < 0 {
			return fmt.Errorf("no alarm")
		}
		return nil
	})
	if err := os.Mkdir(n1.root, 0o755); err != nil { // an empty mount point
		t.Fatal(err)
	}
	waittest.Succeeds(l.t, l.patience(10*time.Second), "empty source alarm", func() error {
		if _, _, i := l.find(mark, func(_ events.Envelope, p events.Payload) bool {
			a, ok := p.(*events.ReplicationAlarm)
			return ok && a.Node == "n1" && a.Reason == events.AlarmSourceEmpty
		}); i < 0 {
			return fmt.Errorf("no alarm")
		}
		return nil
	})
	if err := same(moved, n2.root); err != nil {
		t.Fatalf("target changed after its source vanished: %v", err)
	}
}

// TestProgressManifests: while the holder still uploads, a target applies
// its progress manifest of the current epoch: what is stored so far is
// written, nothing is deleted, a message's .txt waits for its audio, and
// nothing is confirmed. Only the full manifest earns a confirmation, and a
// progress manifest older than the full one is never applied.
func TestProgressManifests(t *testing.T) {
	l := newLab(t)
	n2 := newNode(t, "n2")
	write(t, n2.root, "default/1000/INBOX/local.txt", []byte("only on n2"))
	// n1, the holder, is played by the test, straight into the store.
	st := l.holderStore()
	mark := l.mark()
	l.start(n2)
	l.setHolder("n1", 1)

	src := t.TempDir()
	wav, txt := random(300<<10), []byte("callerid=1\n")
	write(t, src, "default/1000/INBOX/msg0000.wav", wav)
	write(t, src, "default/1000/INBOX/msg0000.txt", txt)
	ex, _ := fstree.NewExcluder([]string{"tmp/"})
	scan := func() []fstree.Entry {
		r, err := (&fstree.Scanner{Root: src, Exclude: ex}).Scan(l.ctx)
		if err != nil {
			t.Fatal(err)
		}
		return r.Entries
	}
	publish := func(progress bool, gen uint64, es []fstree.Entry) { l.publishAsN1(st, progress, gen, es) }
	store1 := func(data []byte) {
		if _, err := st.Put(l.ctx, store.HashOf(data), bytes.NewReader(data)); err != nil {
			t.Fatal(err)
		}
	}
	n2path := func(rel string) string { return filepath.Join(n2.root, rel) }

	// Only the audio is stored so far, and the .txt is too (but its
	// message's audio is what decides).
	store1(wav)
	publish(true, 100, fstree.StoredPart(scan(), st.Has))
	waittest.Succeeds(l.t, l.patience(10*time.Second), "progress applied", func() error {
		_, err := os.Stat(n2path("default/1000/INBOX/msg0000.wav"))
		return err
	})
	if _, err := os.Stat(n2path("default/1000/INBOX/local.txt")); err != nil {
		t.Fatalf("a progress manifest deleted a file: %v", err)
	}
	write(t, src, "default/1000/INBOX/msg0001.wav", wav[:1000])
	write(t, src, "default/1000/INBOX/msg0001.txt", []byte("waits for its audio"))
	store1([]byte("waits for its audio"))
	store1(txt)
	part := fstree.StoredPart(scan(), func(h string) bool { return st.Has(h) && h != store.HashOf(wav[:1000]) })
	publish(true, 110, part)
	waittest.Succeeds(l.t, l.patience(10*time.Second), "second progress applied", func() error {
		_, err := os.Stat(n2path("default/1000/INBOX/msg0000.txt"))
		return err
	})
	if _, err := os.Stat(n2path("default/1000/INBOX/msg0001.txt")); !os.IsNotExist(err) {
		t.Fatalf("a .txt arrived before its audio (%v)", err)
	}
	if _, _, i := l.find(mark, func(_ events.Envelope, p events.Payload) bool {
		_, ok := p.(*events.ReplicationApplied)
		return ok
	}); i >= 0 {
		t.Fatal("a progress manifest was confirmed")
	}

	// The full manifest: applied, deletions included, and confirmed.
	store1(wav[:1000])
	full := scan()
	publish(false, 200, full)
	waittest.Succeeds(l.t, l.patience(10*time.Second), "full manifest confirmed", func() error {
		if _, _, i := l.find(mark, func(_ events.Envelope, p events.Payload) bool {
			a, ok := p.(*events.ReplicationApplied)
			return ok && a.Node == "n2" && a.Generation == 200 && a.Error == ""
		}); i < 0 {
			return fmt.Errorf("no confirmation")
		}
		return nil
	})
	if err := same(src, n2.root); err != nil {
		t.Fatalf("after the full manifest: %v", err)
	}

	// A progress manifest older than the full one (left from a pass whose
	// full manifest is out) is never applied; a newer one is.
	stale := []byte("stale")
	store1(stale)
	write(t, src, "default/1000/INBOX/stale.txt", stale)
	publish(true, 150, scan())
	if err := os.Remove(filepath.Join(src, "default/1000/INBOX/stale.txt")); err != nil {
		t.Fatal(err)
	}
	fresh := []byte("fresh")
	store1(fresh)
	write(t, src, "default/1000/INBOX/fresh.txt", fresh)
	publish(true, 250, scan())
	waittest.Succeeds(l.t, l.patience(10*time.Second), "newer progress applied", func() error {
		_, err := os.Stat(n2path("default/1000/INBOX/fresh.txt"))
		return err
	})
	if _, err := os.Stat(n2path("default/1000/INBOX/stale.txt")); !os.IsNotExist(err) {
		t.Fatalf("a progress manifest older than the full one was applied (%v)", err)
	}
}

// TestRegistrationsFollowTheHolder: PJSIP contacts in AstDB reach the
// standby's running Asterisk through AMI, and go the other way after a failover.
func TestRegistrationsFollowTheHolder(t *testing.T) {
	l := newLab(t)
	n1, n2 := newNode(t, "n1"), newNode(t, "n2")
	for _, n := range []*node{n1, n2} {
		p, err := amipeer.Start(amipeer.Config{Username: "fan", Secret: "s"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		n.peer = p
		if err := os.MkdirAll(n.root, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	contact := `{"endpoint":"6001","uri":"sip:6001@127.0.0.1:5370","expiration_time":"1796000734","reg_server":""}`
	key := "contact/6001;@1af1a3a283d770c64aeed4e8e68d1b9f"
	n1.peer.DBPut("registrar", key, contact)
	n1.peer.DBPut("other", "x", "not carried")
	n2.peer.DBPut("registrar", "contact/stale;@00", "{}")
	mark := l.mark()
	l.start(n1)
	l.start(n2)
	l.setHolder("n1", 1)
	l.waitCaughtUp(mark, "n1", "n2", "astdb", 1)
	db := n2.peer.DB()
	if db["/registrar/"+key] != contact {
		t.Fatalf("standby's AstDB: %v", db)
	}
	if _, ok := db["/other/x"]; ok {
		t.Fatal("a family not configured was carried")
	}
	if _, ok := db["/registrar/contact/stale;@00"]; ok {
		t.Fatal("a contact the holder does not have stayed on the standby")
	}
	// After a failover, a phone that registers with n2 reaches n1 too.
	mark = l.mark()
	l.setHolder("n2", 2)
	n2.peer.DBPut("registrar", "contact/6002;@ff", `{"endpoint":"6002"}`)
	l.waitCaughtUp(mark, "n2", "n1", "astdb", 2)
	waittest.Succeeds(l.t, l.patience(5*time.Second), "contact carried back", func() error {
		if v := n1.peer.DB()["/registrar/contact/6002;@ff"]; v != `{"endpoint":"6002"}` {
			return fmt.Errorf("n1 has %q", v)
		}
		return nil
	})
}

var _ = bytes.Equal

// A target that cannot read the group status does not apply; it says so
// (source_unconfirmed), retries with backoff, applies once it can read it
// again, and past ConfirmWithin ends Run with an error so that systemd
// restarts the service.
func TestUnconfirmedSourceIsBounded(t *testing.T) {
	l := newLab(t)
	n2 := newNode(t, "n2")
	l.setHolder("n1", 1)
	st, err := store.Open(l.ctx, l.ctl.JS, 1)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := l.ctl.StateKV(l.ctx)
	if err != nil {
		t.Fatal(err)
	}
	putManifest := func(gen uint64) {
		t.Helper()
		m := &fstree.Manifest{Cluster: cluster, Group: group, Tree: "voicemail", Node: "n1", Epoch: 1,
			Generation: gen, Created: time.Now().UTC(), Changed: time.Now().UTC(), Digest: fstree.Digest(nil)}
		if err := st.PutManifest(l.ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	applied := func(from int, gen uint64) func() error {
		return func() error {
			if _, _, i := l.find(from, func(_ events.Envelope, p events.Payload) bool {
				a, ok := p.(*events.ReplicationApplied)
				return ok && a.Node == "n2" && a.Generation == gen && a.Error == ""
			}); i < 0 {
				return fmt.Errorf("generation %d not applied", gen)
			}
			return nil
		}
	}

	conds := daemon.NewConditions(slog.New(slog.DiscardHandler))
	b := bustest.Connect(t, l.srv, bus.Identity{Cluster: cluster, Service: "replicator", Node: "n2"})
	nst, err := store.Open(l.ctx, b.JS, 1)
	if err != nil {
		t.Fatal(err)
	}
	e, err := replicate.New(replicate.Config{
		Cluster: cluster, Group: group, Node: "n2", StateDir: n2.state,
		Trees:    []replicate.Tree{{Name: "voicemail", Root: n2.root}},
		Debounce: 10 * time.Millisecond, ScanInterval: time.Hour, MaxDeleteShare: 0.10, AllowDeletes: 2,
		Conditions: conds, ConfirmWithin: 3 * time.Second,
	}, b, nst, prometheus.NewRegistry(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(l.ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()

	mark := l.mark()
	putManifest(1)
	waittest.Succeeds(l.t, l.patience(10*time.Second), "first manifest applied", applied(mark, 1))

	// The status unreadable: the next manifest is held back, and said so.
	if err := kv.Delete(l.ctx, events.GroupStatusKey(cluster, group)); err != nil {
		t.Fatal(err)
	}
	mark = l.mark()
	putManifest(2)
	waittest.Succeeds(l.t, l.patience(10*time.Second), "source_unconfirmed raised", func() error {
		if !conds.Is(replicate.CondSourceUnconfirmed) {
			return fmt.Errorf("not raised: %v", conds.Raised())
		}
		return nil
	})
	if err := applied(mark, 2)(); err == nil {
		t.Fatal("applied a manifest whose source it could not confirm")
	}
	// Readable again: the retry applies it and the condition clears.
	l.setHolder("n1", 1)
	waittest.Succeeds(l.t, l.patience(10*time.Second), "applied after the status came back", applied(mark, 2))
	waittest.Succeeds(l.t, l.patience(10*time.Second), "source_unconfirmed cleared", func() error {
		if conds.Is(replicate.CondSourceUnconfirmed) {
			return fmt.Errorf("still raised")
		}
		return nil
	})

	// Unreadable for longer than ConfirmWithin: Run ends with the reason.
	if err := kv.Delete(l.ctx, events.GroupStatusKey(cluster, group)); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	putManifest(3)
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), replicate.CondSourceUnconfirmed) {
			t.Fatalf("run ended with %v, want the source_unconfirmed bound", err)
		}
		t.Logf("gave up after %s: %v", time.Since(began).Round(time.Millisecond), err)
	case <-time.After(30 * time.Second):
		t.Fatal("still running after 30 s with the group status unreadable")
	}
}
