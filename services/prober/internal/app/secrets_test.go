package app

import (
	"context"
	"fmt"
	"github.com/fanpbx/fan/pkg/platform/logtest"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/bus/bustest"
	"github.com/fanpbx/fan/pkg/platform/config"
	"github.com/fanpbx/fan/pkg/platform/daemon"
	"github.com/nats-io/nats.go/jetstream"
)

// The attack: credentials planted in an HTTP check's userinfo
// and query and in an exec check's arguments (one marked by secret_args
// index, one by prefix, one only recognisable by its name, and echoed back
// by the program). A real prober runs against an embedded JetStream until
// every check has gone up or down at least once; then the whole audit
// stream, byte by byte, and the whole debug log must hold none of them.
func TestSecretsNeverLeave(t *testing.T) {
	const plant = "hunter2"
	ok := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("token") != plant+"-q" {
			w.WriteHeader(http.StatusForbidden)
		}
	}))
	defer ok.Close()
	sick := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer sick.Close()
	// A port nothing listens on: the client's own error quotes the URL.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := l.Addr().String()
	l.Close()

	withCreds := func(base string) string {
		return strings.Replace(base, "http://", "http://admin:"+plant+"-u@", 1) + "/status?token=" + plant + "-q&api_key=" + plant + "-k&site=a"
	}
	// The timeout is long enough that a loaded machine still gets the
	// answers the redaction is checked on (a 503, an exit status), not a
	// timeout in their place.
	every, timeout := config.Duration(2*time.Second), config.Duration(1500*time.Millisecond)
	checks := []CheckConfig{
		{Name: "web-up", Kind: "http", Address: withCreds(ok.URL), Interval: every, Timeout: timeout, Rise: 1, Fall: 1},
		{Name: "web-sick", Kind: "http", Address: withCreds(sick.URL), Interval: every, Timeout: timeout, Rise: 1, Fall: 1},
		{Name: "web-dead", Kind: "http", Address: withCreds("http://" + closed), Interval: every, Timeout: timeout, Rise: 1, Fall: 1},
		{Name: "db", Kind: "exec", Interval: every, Timeout: timeout, Rise: 1, Fall: 1,
			Command: []string{"/bin/sh", "-c", `echo "cannot log in with $*" >&2; exit 1`, "sh",
				"--db-password=" + plant + "-a", "--key", plant + "-b", plant + "-c", "--secret=" + plant + "-d"},
			SecretArgs: []string{"--key", "7"}},
	}

	s := bustest.Server(t)
	cfg := Config{
		Common:            daemon.Common{Cluster: "lab", Node: "n1", Bus: bus.Config{URL: s.ClientURL()}},
		HeartbeatInterval: config.Duration(100 * time.Millisecond),
		ResultsEvery:      config.Duration(time.Second),
		Checks:            checks,
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	var logs logtest.Buffer
	log := slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- New(cfg, log, "test").Run(ctx) }()

	w := bustest.Connect(t, s, bus.Identity{Cluster: "lab", Service: "test", Node: "w"})
	want := map[string]events.Health{"web-up": events.HealthUp, "web-sick": events.HealthDown, "web-dead": events.HealthDown, "db": events.HealthDown}
	seen := map[string]bool{}
	wctx, wcancel := context.WithTimeout(ctx, 20*time.Second)
	_ = w.Watch(wctx, bus.WatchOptions{Subjects: []string{events.ClusterEvents("lab")}, All: true},
		func(_ events.Envelope, p events.Decoded, _ uint64) {
			if ht, ok := p.(*events.HealthTransition); ok && want[ht.Check] == ht.To {
				seen[ht.Check] = true
				if len(seen) == len(want) {
					wcancel()
				}
			}
		})
	wcancel()
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("prober run: %v", err)
	}
	if len(seen) != len(want) {
		t.Fatalf("transitions seen: %v, want every check's: %v", seen, want)
	}

	// The whole audit stream and live stream (probe results, heartbeats), raw.
	var trail strings.Builder
	var msgs uint64
	for _, name := range []string{events.EventsStream, events.LiveStream} {
		st, err := w.JS.Stream(context.Background(), name)
		if err != nil {
			t.Fatal(err)
		}
		info, err := st.Info(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		msgs += info.State.Msgs
		for seq := info.State.FirstSeq; seq <= info.State.LastSeq; seq++ {
			m, err := st.GetMsg(context.Background(), seq)
			if err != nil {
				if err == jetstream.ErrMsgNotFound {
					continue
				}
				t.Fatal(err)
			}
			fmt.Fprintf(&trail, "%s %s\n", m.Subject, m.Data)
		}
	}
	for name, text := range map[string]string{"streams": trail.String(), "log": logs.String()} {
		if n := strings.Count(text, plant); n > 0 {
			i := strings.Index(text, plant)
			t.Errorf("%s holds the planted secret %d times, first: …%s…", name, n, text[max(0, i-200):min(len(text), i+50)])
		}
	}
	// The redaction must not hide what an operator needs: the targets are
	// there, with their credentials masked.
	for _, must := range []string{"admin:REDACTED@", "token=REDACTED", "--db-password=REDACTED", "--key REDACTED REDACTED", "--secret=REDACTED", "site=a", "status 503", "exit status 1"} {
		if !strings.Contains(trail.String(), must) {
			t.Errorf("the streams lack %q", must)
		}
	}
	t.Logf("audit and live streams: %d messages, %d bytes; log %d bytes; no %q in either",
		msgs, trail.Len(), len(logs.String()), plant)
}
