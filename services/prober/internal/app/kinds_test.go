package app

import (
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/config"
	"github.com/fanpbx/fan/pkg/platform/daemon"
)

const kindsYAML = `cluster: lab
node: n1
bus:
  url: nats://127.0.0.1:4222
checks:
  - {name: pbx, kind: ami, address: "127.0.0.1:5038", username: fan, secret: s, interval: 200ms, timeout: 150ms, rise: 2, fall: 3}
  - {name: sip, kind: sip, address: "198.51.100.12:5060", transport: tcp, codes: ["2xx", "401"], role: peer, target_node: n2, interval: 200ms, timeout: 150ms, rise: 2, fall: 3}
  - {name: vip, kind: sip, address: "198.51.100.10:5060", role: vip, target_node: pbx, interval: 200ms, timeout: 150ms, rise: 2, fall: 3}
  - {name: web, kind: http, address: "http://192.0.2.80/health", body: "ok", interval: 1s, timeout: 500ms, rise: 1, fall: 2}
  - {name: ns, kind: dns, address: "192.0.2.53:53", query: voip.test, interval: 1s, timeout: 500ms, rise: 1, fall: 2}
  - {name: gw, kind: icmp, address: "192.0.2.1", interval: 1s, timeout: 500ms, rise: 1, fall: 2}
  - {name: port, kind: tcp, address: "192.0.2.80:443", interval: 1s, timeout: 500ms, rise: 1, fall: 2}
  - {name: cli, kind: exec, command: [asterisk, -rx, "core show uptime"], interval: 5s, timeout: 3s, rise: 1, fall: 2}
groups:
  - {name: webfarm, min_up: 2, checks: [web, port, gw]}
`

func TestEveryKindValidates(t *testing.T) {
	var c Config
	if err := config.Parse("kinds.yaml", []byte(kindsYAML), &c); err != nil {
		t.Fatalf("valid config refused: %v", err)
	}
	sip := c.Checks[1]
	if sip.Role != events.RolePeer || sip.TargetNode != "n2" || sip.Transport != "tcp" || !sip.codes.Has(401) || sip.codes.Has(404) {
		t.Fatalf("peer sip check %+v", sip)
	}
	if sip.DecisiveMargin.D() != DefaultDecisiveMargin || c.Checks[2].DecisiveMargin != 0 {
		t.Fatalf("decisive_margin %v on the peer check, %v on the vip check: want the default on peer checks only", sip.DecisiveMargin, c.Checks[2].DecisiveMargin)
	}
	if vip := c.Checks[2]; vip.Transport != "udp" || vip.Retransmit.D() != 50*time.Millisecond || !vip.codes.Has(404) || vip.codes.Has(503) {
		t.Fatalf("vip sip defaults %+v: want udp, T1 = timeout/3, any non-5xx", vip)
	}
	if c.Checks[0].LoginTimeout.D() != 3*time.Second || c.Checks[4].QueryType != "SOA" || c.Checks[5].ICMPMode != "auto" {
		t.Fatalf("defaults: %+v", c.Checks)
	}
	if g := c.Groups[0]; g.Role != events.RoleSelf || g.TargetNode != "n1" {
		t.Fatalf("group defaults %+v", g)
	}
	path := filepath.Join(t.TempDir(), "prober.yaml")
	if err := os.WriteFile(path, []byte(kindsYAML), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := daemon.Run([]string{"--check-config", path}, "fan-prober", "t", "", Build); got != 0 {
		t.Fatalf("--check-config of a valid file exited %d", got)
	}
}

func TestKindConfigErrorsNameTheKeyAndFile(t *testing.T) {
	cases := map[string]struct{ from, to, key string }{
		"sip transport":        {"transport: tcp", "transport: sctp", "checks[1].transport"},
		"sip address not ip":   {`address: "198.51.100.12:5060"`, `address: "pbx.example:5060"`, "checks[1].address"},
		"bad code":             {`codes: ["2xx", "401"]`, `codes: ["2xy"]`, "checks[1].codes"},
		"http not a url":       {`address: "http://192.0.2.80/health"`, `address: "192.0.2.80"`, "checks[3].address"},
		"bad body regexp":      {`body: "ok"`, `body: "("`, "checks[3].body"},
		"dns without query":    {"query: voip.test, ", "", "checks[4].query"},
		"dns type":             {"query: voip.test,", "query: voip.test, query_type: BOGUS,", "checks[4].query_type"},
		"icmp mode":            {`address: "192.0.2.1",`, `address: "192.0.2.1", icmp_mode: magic,`, "checks[5].icmp_mode"},
		"exec without command": {`command: [asterisk, -rx, "core show uptime"], `, "", "checks[7].command"},
		"key on wrong kind":    {`kind: tcp, address: "192.0.2.80:443",`, `kind: tcp, address: "192.0.2.80:443", body: x,`, "checks[6].body"},
		"login timeout short":  {"secret: s,", "secret: s, login_timeout: 1s,", "checks[0].login_timeout"},
		"group min_up":         {"min_up: 2", "min_up: 4", "groups[0].min_up"},
		"group unknown member": {"checks: [web, port, gw]", "checks: [web, nope]", "groups[0].checks[1]"},
		"group name taken":     {"name: webfarm", "name: web", "groups[0].name"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if !strings.Contains(kindsYAML, tc.from) {
				t.Fatalf("fixture lacks %q", tc.from)
			}
			path := filepath.Join(t.TempDir(), "prober.yaml")
			if err := os.WriteFile(path, []byte(strings.Replace(kindsYAML, tc.from, tc.to, 1)), 0o644); err != nil {
				t.Fatal(err)
			}
			_, err := Build(daemon.Options{ConfigPath: path, Logger: slog.New(slog.DiscardHandler)})
			if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), tc.key) {
				t.Fatalf("error %v should name %s and %s", err, path, tc.key)
			}
			if got := daemon.Run([]string{"--check-config", path}, "fan-prober", "t", "", Build); got == 0 {
				t.Fatal("--check-config exited 0")
			}
		})
	}
}

// A quorum group is published as a health transition of its own, named after
// the group, carrying every member's latest result; it follows "at least N of
// M" as members cross their own rise and fall. Members here are real HTTP
// and TCP peers.
func TestQuorumGroupTransitions(t *testing.T) {
	var webDown atomic.Bool
	web := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if webDown.Load() {
			http.Error(w, "maintenance", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprint(w, "ok")
	}))
	defer web.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	portAddr := ln.Addr().String()
	ln2, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln2.Close()
	fast := func(name, kind, addr string) CheckConfig {
		return CheckConfig{Name: name, Kind: kind, Address: addr, Interval: config.Duration(50 * time.Millisecond),
			Timeout: config.Duration(40 * time.Millisecond), Rise: 1, Fall: 2}
	}
	h := runProber(t, []CheckConfig{
		fast("web", "http", web.URL+"/"), fast("port", "tcp", portAddr), fast("other", "tcp", ln2.Addr().String()),
	}, []GroupConfig{{Name: "farm", MinUp: 2, Checks: []string{"web", "port", "other"}}})

	group := func(within time.Duration) *events.HealthTransition {
		t.Helper()
		deadline := time.After(within)
		for {
			select {
			case p := <-h.got:
				if ht, ok := p.(*events.HealthTransition); ok && ht.Check == "farm" {
					return ht
				}
			case <-deadline:
				return nil
			}
		}
	}
	up := group(5 * time.Second)
	if up == nil || up.To != events.HealthUp || up.Role != events.RoleSelf || up.TargetNode != "n1" {
		t.Fatalf("group up: %+v", up)
	}
	ln.Close() // one member down: 2 of 3 still up, the group holds
	webDown.Store(true)
	down := group(5 * time.Second)
	if down == nil || down.To != events.HealthDown || len(down.Evidence) != 3 {
		t.Fatalf("group down: %+v", down)
	}
	if !strings.Contains(down.Reason, "1 of 3 up, need 2") || !strings.Contains(down.Reason, "web down") || !strings.Contains(down.Reason, "port down") {
		t.Fatalf("reason %q", down.Reason)
	}
	if down.Evidence[0].OK || down.Evidence[0].ErrorClass != events.ErrorUnhealth || !strings.Contains(down.Evidence[0].Error, "web is down") ||
		down.Evidence[1].ErrorClass != events.ErrorRefused || !down.Evidence[2].OK {
		t.Fatalf("evidence %+v", down.Evidence)
	}
	webDown.Store(false)
	if back := group(5 * time.Second); back == nil || back.To != events.HealthUp {
		t.Fatalf("group back: %+v", back)
	}
}
