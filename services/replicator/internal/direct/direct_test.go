package direct_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/bus/bustest"
	"github.com/fanpbx/fan/services/replicator/internal/direct"
	"github.com/fanpbx/fan/services/replicator/internal/fstree"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

const cluster, group = "c1", "pbx"

// holder is a node serving one tree of files over a real server.
type holder struct {
	srv     *direct.Server
	root    string
	entries []fstree.Entry
	refused atomic.Int64
	content map[string][]byte
}

func startHolder(t *testing.T, nc *nats.Conn, files map[string][]byte) *holder {
	t.Helper()
	h := &holder{root: t.TempDir(), content: map[string][]byte{}}
	for rel, data := range files {
		p := filepath.Join(h.root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(data)
		hash := hex.EncodeToString(sum[:])
		h.content[hash] = data
		h.entries = append(h.entries, fstree.Entry{Path: rel, Kind: fstree.KindFile, Size: int64(len(data)), Hash: hash})
	}
	h.srv = direct.NewServer(nc, cluster, group, "n1", slog.New(slog.DiscardHandler), func(string, error) { h.refused.Add(1) }, nil)
	sc := &fstree.Scanner{Root: h.root}
	h.srv.Serve("voicemail", sc.OpenFile, h.entries)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = h.srv.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	// The subscription is made in Run: wait until it answers.
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, err := nc.Request(events.ContentSubject(cluster, "n1"), []byte("{}"), time.Second); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("server never answered")
		}
	}
	h.refused.Store(0)
	return h
}

func connect(t *testing.T) (*nats.Conn, *nats.Conn) {
	t.Helper()
	s := bustest.Server(t)
	a := bustest.Connect(t, s, bus.Identity{Cluster: cluster, Service: "replicator", Node: "n1"})
	b := bustest.Connect(t, s, bus.Identity{Cluster: cluster, Service: "replicator", Node: "n2"})
	return a.NC, b.NC
}

func random(t *testing.T, n int) []byte {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

func readAll(t *testing.T, f fstree.Fetcher, hash string) ([]byte, error) {
	t.Helper()
	rc, err := f(context.Background(), hash)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	return io.ReadAll(rc)
}

// TestFetchesSmallAndLargeContents: small contents come many to an
// answer, one larger than an answer in several, one under two paths
// twice, and the empty content without asking; every byte is the holder's.
func TestFetchesSmallAndLargeContents(t *testing.T) {
	ncA, ncB := connect(t)
	large := random(t, 3*int(ncB.MaxPayload())+12345)
	shared := random(t, 5000)
	files := map[string][]byte{
		"a/INBOX/msg0000.wav": large,
		"a/INBOX/msg0000.txt": random(t, 300),
		"a/INBOX/msg0001.txt": shared,
		"b/INBOX/msg0000.txt": shared,
		"b/INBOX/empty":       {},
	}
	for i := range 50 {
		files["c/"+strings.Repeat("x", i+1)] = random(t, 1000+i)
	}
	h := startHolder(t, ncA, files)
	sizes := map[string]int64{}
	var order []string
	for _, e := range h.entries {
		sizes[e.Hash] = e.Size
		order = append(order, e.Hash)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	fetched := prometheus.NewCounter(prometheus.CounterOpts{Name: "fetched"})
	f := direct.NewClient(ncB, cluster, group, fetched).Prefetch(ctx, "n1", "voicemail", sizes, order)
	var total int64
	for _, hash := range order {
		got, err := readAll(t, f, hash)
		if err != nil {
			t.Fatalf("%s: %v", hash, err)
		}
		if !bytes.Equal(got, h.content[hash]) {
			t.Fatalf("%s: %d bytes differ from the holder's %d", hash, len(got), len(h.content[hash]))
		}
		total += int64(len(got))
	}
	// The content under two paths was asked for once.
	if got, want := testutil.ToFloat64(fetched), float64(total-int64(len(shared))); got != want {
		t.Errorf("fetched %v bytes, want %v", got, want)
	}
	if n := h.refused.Load(); n != 0 {
		t.Errorf("%d requests refused", n)
	}
}

// TestWhatTheHolderDoesNotServeIsMissing: a content not in the served
// tree, a tree not served and a node that does not answer all fail as
// missing content, which the source turns into storing it.
func TestWhatTheHolderDoesNotServeIsMissing(t *testing.T) {
	ncA, ncB := connect(t)
	data := random(t, 2000)
	h := startHolder(t, ncA, map[string][]byte{"x": data})
	absent := strings.Repeat("ab", 32)
	var known string
	for k := range h.content {
		known = k
	}
	sizes := map[string]int64{absent: 10, known: int64(len(data))}
	cl := direct.NewClient(ncB, cluster, group, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	f := cl.Prefetch(ctx, "n1", "voicemail", sizes, []string{absent, known})
	if _, err := readAll(t, f, absent); !errors.Is(err, fstree.ErrMissingContent) {
		t.Errorf("content the holder lacks: want ErrMissingContent, got %v", err)
	}
	if got, err := readAll(t, f, known); err != nil || !bytes.Equal(got, data) {
		t.Errorf("the content it holds, beside one it lacks: %v", err)
	}
	f = cl.Prefetch(ctx, "n1", "asterisk-etc", sizes, []string{known})
	if _, err := readAll(t, f, known); !errors.Is(err, fstree.ErrMissingContent) {
		t.Errorf("tree not served: want ErrMissingContent, got %v", err)
	}
	h.srv.Withdraw("voicemail")
	f = cl.Prefetch(ctx, "n1", "voicemail", sizes, []string{known})
	if _, err := readAll(t, f, known); !errors.Is(err, fstree.ErrMissingContent) {
		t.Errorf("tree withdrawn (no longer source): want ErrMissingContent, got %v", err)
	}
	f = cl.Prefetch(ctx, "n3", "voicemail", sizes, []string{known})
	if _, err := readAll(t, f, known); !errors.Is(err, fstree.ErrMissingContent) {
		t.Errorf("node that does not answer: want ErrMissingContent, got %v", err)
	}
}

// TestHostileRequestsAreRefused sends what a peer with the right to ask
// could send to read beyond its due or to wedge the holder: each is
// refused (counted) with nothing of any file in the answer, and the
// holder still answers a good request afterwards.
func TestHostileRequestsAreRefused(t *testing.T) {
	ncA, ncB := connect(t)
	secret := random(t, 4000)
	h := startHolder(t, ncA, map[string][]byte{"INBOX/msg0000.wav": secret})
	var hash string
	for k := range h.content {
		hash = k
	}
	req := func(r events.ContentRequest) []byte {
		b, _ := json.Marshal(r)
		return b
	}
	many := make([]events.ContentRange, events.MaxContentRanges+1)
	for i := range many {
		many[i] = events.ContentRange{Hash: hash, Length: 1}
	}
	cases := map[string][]byte{
		"not JSON":             []byte("GET /etc/shadow"),
		"a path for a hash":    req(events.ContentRequest{Group: group, Tree: "voicemail", Ranges: []events.ContentRange{{Hash: "../../etc/shadow", Length: 10}}}),
		"another group":        req(events.ContentRequest{Group: "other", Tree: "voicemail", Ranges: []events.ContentRange{{Hash: hash, Length: 10}}}),
		"a tree with a dot":    req(events.ContentRequest{Group: group, Tree: "..", Ranges: []events.ContentRange{{Hash: hash, Length: 10}}}),
		"a negative offset":    req(events.ContentRequest{Group: group, Tree: "voicemail", Ranges: []events.ContentRange{{Hash: hash, Offset: -100, Length: 10}}}),
		"no length":            req(events.ContentRequest{Group: group, Tree: "voicemail", Ranges: []events.ContentRange{{Hash: hash}}}),
		"too many ranges":      req(events.ContentRequest{Group: group, Tree: "voicemail", Ranges: many}),
		"no ranges":            req(events.ContentRequest{Group: group, Tree: "voicemail"}),
		"an oversized request": append([]byte(`{"group":"pbx","tree":"voicemail","x":"`), append(bytes.Repeat([]byte("a"), events.MaxContentRequest), '"', '}')...),
	}
	for name, body := range cases {
		before := h.refused.Load()
		m, err := ncB.Request(events.ContentSubject(cluster, "n1"), body, 5*time.Second)
		if err != nil {
			t.Fatalf("%s: no answer: %v", name, err)
		}
		if m.Header.Get(direct.ErrorHeader) == "" || len(m.Data) != 0 {
			t.Errorf("%s: answered %d bytes without refusing", name, len(m.Data))
		}
		if h.refused.Load() != before+1 {
			t.Errorf("%s: not counted as refused", name)
		}
	}
	// An offset past the end and a length past it read nothing beyond the
	// file: the first is not held, the second is cut at the end.
	for _, c := range []struct {
		rg      events.ContentRange
		lengths string
		data    []byte
	}{
		{events.ContentRange{Hash: hash, Offset: 1 << 40, Length: 10}, "-", nil},
		{events.ContentRange{Hash: hash, Offset: 3990, Length: 1 << 30}, "10", secret[3990:]},
	} {
		m, err := ncB.Request(events.ContentSubject(cluster, "n1"), req(events.ContentRequest{Group: group, Tree: "voicemail",
			Ranges: []events.ContentRange{c.rg}}), 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if got := m.Header.Get(events.ContentLengthsHeader); got != c.lengths || !bytes.Equal(m.Data, c.data) {
			t.Errorf("range %d+%d: lengths %q, %d bytes", c.rg.Offset, c.rg.Length, got, len(m.Data))
		}
	}
	f := direct.NewClient(ncB, cluster, group, nil).Prefetch(context.Background(), "n1", "voicemail", map[string]int64{hash: int64(len(secret))}, []string{hash})
	if got, err := readAll(t, f, hash); err != nil || !bytes.Equal(got, secret) {
		t.Fatalf("a good request after the hostile ones: %v", err)
	}
}

// TestClientRefusesAnAnswerThatDoesNotAddUp: an answer whose lengths list
// does not match its body (a faulty or hostile holder) fails the fetch
// instead of handing misaligned bytes to the writer.
func TestClientRefusesAnAnswerThatDoesNotAddUp(t *testing.T) {
	ncA, ncB := connect(t)
	hash := strings.Repeat("cd", 32)
	sub, err := ncA.Subscribe(events.ContentSubject(cluster, "n1"), func(m *nats.Msg) {
		out := nats.NewMsg(m.Reply)
		out.Header.Set(events.ContentLengthsHeader, "100")
		out.Data = []byte("short")
		_ = m.RespondMsg(out)
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	_ = ncA.Flush()
	f := direct.NewClient(ncB, cluster, group, nil).Prefetch(context.Background(), "n1", "voicemail", map[string]int64{hash: 100}, []string{hash})
	if _, err := readAll(t, f, hash); !errors.Is(err, fstree.ErrMissingContent) {
		t.Fatalf("want the fetch to fail as missing, got %v", err)
	}
}
