package daemon_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/bus/bustest"
	"github.com/fanpbx/fan/pkg/platform/daemon"
	"github.com/fanpbx/fan/pkg/platform/porttest"
	"github.com/fanpbx/fan/pkg/platform/waittest"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
)

func startRuntime(t *testing.T, ctx context.Context, url, service, node string) (*daemon.Runtime, string) {
	t.Helper()
	addr := porttest.Addr(t)
	c := daemon.Common{Cluster: "lab", Node: node, Bus: bus.Config{URL: url}, HTTPListen: addr}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	rt, err := daemon.Start(ctx, c, service, "v1.4.0-3-gabc1234", slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	return rt, addr
}

func TestDiscoveryAnswersPingInfoStatsAndStatus(t *testing.T) {
	s := bustest.Server(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	p1, _ := startRuntime(t, ctx, s.ClientURL(), "prober", "n1")
	p2, _ := startRuntime(t, ctx, s.ClientURL(), "prober", "n2")
	arb, _ := startRuntime(t, ctx, s.ClientURL(), "arbiter", "ctl")
	p1.Loop("checks", time.Minute)

	nc, err := nats.Connect(s.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()

	// $SRV.PING is how `nats micro ls` finds services: every instance answers.
	inbox := nats.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.PublishRequest("$SRV.PING", inbox, nil); err != nil {
		t.Fatal(err)
	}
	found := map[string]micro.Ping{}
	for len(found) < 3 {
		m, err := sub.NextMsg(5 * time.Second)
		if err != nil {
			t.Fatalf("pings so far %v: %v", found, err)
		}
		var p micro.Ping
		if err := json.Unmarshal(m.Data, &p); err != nil {
			t.Fatal(err)
		}
		found[p.Name+"/"+p.Metadata["node"]] = p
	}
	for _, k := range []string{"fan-prober/n1", "fan-prober/n2", "fan-arbiter/ctl"} {
		p, ok := found[k]
		if !ok {
			t.Fatalf("no PING answer from %s: %v", k, found)
		}
		if p.Version != "1.4.0-3-gabc1234" || p.Metadata["fan_version"] != "v1.4.0-3-gabc1234" || p.Metadata["cluster"] != "lab" {
			t.Fatalf("%s identity %+v", k, p.ServiceIdentity)
		}
	}

	// INFO names the per-node status endpoint, outside the audit stream.
	m, err := nc.Request("$SRV.INFO.fan-prober."+found["fan-prober/n1"].ID, nil, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var info micro.Info
	if err := json.Unmarshal(m.Data, &info); err != nil {
		t.Fatal(err)
	}
	want := events.ServiceStatusSubject("lab", "prober", "n1")
	if len(info.Endpoints) != 1 || info.Endpoints[0].Subject != want || info.Endpoints[0].QueueGroup != "" {
		t.Fatalf("endpoints %+v, want one on %s without a queue group", info.Endpoints, want)
	}

	// The status endpoint answers for exactly that instance.
	m, err = nc.Request(want, nil, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var st daemon.Status
	if err := json.Unmarshal(m.Data, &st); err != nil {
		t.Fatal(err)
	}
	if st.Service != "prober" || st.Node != "n1" || !st.Ready || !st.BusConnected || !st.Healthy ||
		len(st.Loops) != 1 || st.Loops[0].Name != "checks" || st.Loops[0].Stale {
		t.Fatalf("status %+v", st)
	}

	// STATS carries the same status as endpoint data.
	m, err = nc.Request("$SRV.STATS.fan-arbiter", nil, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var stats micro.Stats
	if err := json.Unmarshal(m.Data, &stats); err != nil {
		t.Fatal(err)
	}
	if len(stats.Endpoints) != 1 || !strings.Contains(string(stats.Endpoints[0].Data), `"node":"ctl"`) {
		t.Fatalf("stats %+v", stats)
	}

	// A closed runtime leaves discovery: only n2 and the arbiter answer.
	p1.Close(ctx)
	if _, err := nc.Request(want, nil, 500*time.Millisecond); err == nil {
		t.Fatal("closed instance still answers its status endpoint")
	}
	m, err = nc.Request("$SRV.PING.fan-prober", nil, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var p micro.Ping
	if err := json.Unmarshal(m.Data, &p); err != nil || p.Metadata["node"] != "n2" {
		t.Fatalf("ping after close %s %v", m.Data, err)
	}
	p2.Close(ctx)
	arb.Close(ctx)
}

func TestHealthzFailsWhileALoopIsSilent(t *testing.T) {
	s := bustest.Server(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	rt, addr := startRuntime(t, ctx, s.ClientURL(), "ipmover", "n1")
	defer rt.Close(ctx)

	get := func() (int, string) {
		t.Helper()
		resp, err := http.Get("http://" + addr + "/healthz")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := get(); code != 200 {
		t.Fatalf("healthz %d %s", code, body)
	}
	lp := rt.Loop("reconcile", 50*time.Millisecond)
	// Not beating: the loop goes stale once its bound passes.
	// Polling an HTTP endpoint: there is no event to wait on.
	waittest.Succeeds(t, 10*time.Second, "healthz naming the silent loop", func() error {
		if code, body := get(); code != http.StatusServiceUnavailable || !strings.Contains(body, "silent loops: reconcile") {
			return fmt.Errorf("healthz stayed %d %s", code, body)
		}
		return nil
	})
	lp.Done()
	if code, body := get(); code != 200 {
		t.Fatalf("after Done: healthz %d %s", code, body)
	}

	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{`fan_build_info{cluster="lab",node="n1",service="ipmover",version="v1.4.0-3-gabc1234"} 1`, "fan_watchdog_pings_total 0"} {
		if !strings.Contains(string(b), want) {
			t.Fatalf("metrics lack %q", want)
		}
	}
}
