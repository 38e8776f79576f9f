package app

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/fanpbx/fan/pkg/platform/config"
	"github.com/fanpbx/fan/pkg/platform/config/configtest"
)

const boundsValid = `
cluster: lab
node: ctl1
bus: {url: "nats://127.0.0.1:4222"}
lease_ttl: 3s
groups:
  - name: pbx
    addresses: [198.51.100.10/24]
    nodes: [n1, n2]
    health_check: pbx
http_heartbeat:
  listen: 127.0.0.1:8080
  token: 0123456789abcdef0123
  nodes: [legacy1]
notify:
  hooks:
    - name: page
      command: [/usr/local/bin/page, --urgent]
`

// Every absurd value the arbiter's file can hold is refused with its key
// (lease_ttl: 100000h used to pass).
func TestConfigBounds(t *testing.T) {
	configtest.Refuses(t, []byte(boundsValid), func(b []byte) error {
		var c Config
		return config.Parse("arbiter.yaml", b, &c)
	}, append(configtest.CommonCases(), []configtest.Case{
		{Key: "lease_ttl", Value: "100000h"},
		{Key: "lease_ttl", Value: "-3s"},
		{Key: "lease_ttl", Value: "1500ms"},
		{Key: "restore_within", Value: "-1s"},
		{Key: "restore_within", Value: "1h"},
		{Key: "policy.silent_after", Value: "-1s"},
		{Key: "policy.silent_after", Value: "1000h"},
		{Key: "policy.presence_misses", Value: -1},
		{Key: "policy.presence_misses", Value: 1000000},
		{Key: "policy.presence_grace", Value: "-1s"},
		{Key: "policy.tick_every", Value: "-1s"},
		{Key: "policy.claim_timeout", Value: "-1s"},
		{Key: "policy.claim_timeout", Value: "1000h"},
		{Key: "policy.command_ttl", Value: "1000h"},
		{Key: "policy.hold_down", Value: "-1s"},
		{Key: "policy.retry_backoff", Value: "-1s"},
		{Key: "policy.settle_after", Value: "1000h"},
		{Key: "policy.clock_skew", Value: "-1s"},
		{Key: "policy.max_moves_per_hour", Value: -5},
		{Key: "registry.offline_after", Value: "-1s"},
		{Key: "registry.offline_after", Value: "100000h"},
		{Key: "registry.sweep_every", Value: "-1s"},
		{Key: "replicas", Value: manyReplicas(maxReplicas + 1)},
		{Key: "replicas", Value: []any{"ctl2", "n1"}},
		{Key: "replicas", Value: []any{"ctl1", "ctl1"}, Want: "replicas[1]"},
		{Key: "replicas", Value: []any{"ctl1", "n.1"}, Want: "replicas[1]"},
		{Key: "groups[0].addresses", Value: []any{"198.51.100.10"}},
		{Key: "groups[0].failback.stable_for", Value: "-1s"},
		{Key: "groups[0].failback.force_before", Value: "100000h"},
		{Key: "groups[0].failback.drain_max_channels", Value: -7},
		{Key: "groups[0].weights.confirm", Value: 1000000},
		{Key: "http_heartbeat.listen", Value: "127.0.0.1:99999"},
		{Key: "http_heartbeat.max_body", Value: -1},
		{Key: "http_heartbeat.max_body", Value: 1 << 30},
		{Key: "http_heartbeat.interval", Value: "-1s"},
		{Key: "http_heartbeat.interval", Value: "100000h"},
		{Key: "http_heartbeat.token", Value: "short"},
		{Key: "http_heartbeat.listen", Value: "0.0.0.0:8443", Want: "http_heartbeat.tls"},
		{Key: "http_heartbeat.tls", Value: map[string]any{"cert": "/nonexistent.crt"}},
		{Key: "http_heartbeat.tls", Value: map[string]any{"cert": "/nonexistent.crt", "key": "/nonexistent.key"}},
		{Key: "http_heartbeat.rate_limit", Value: map[string]any{"per_second": -1}, Want: "http_heartbeat.rate_limit.per_second"},
		{Key: "http_heartbeat.rate_limit", Value: map[string]any{"per_second": 0.001}, Want: "http_heartbeat.rate_limit.per_second"},
		{Key: "http_heartbeat.rate_limit", Value: map[string]any{"burst": 1000000}, Want: "http_heartbeat.rate_limit.burst"},
		{Key: "http_heartbeat.rate_limit", Value: map[string]any{"max_sources": -1}, Want: "http_heartbeat.rate_limit.max_sources"},
		{Key: "http_heartbeat.conns_per_source", Value: -1},
		{Key: "http_heartbeat.max_conns", Value: 1 << 20},
		{Key: "notify.queue", Value: -1},
		{Key: "notify.queue", Value: 1 << 20},
		{Key: "notify.catch_up", Value: "-1s"},
		{Key: "notify.catch_up", Value: "100000h"},
		{Key: "notify.hooks", Value: hooks(map[string]any{}), Want: "notify.hooks[0].name"},
		{Key: "notify.hooks", Value: hooks(map[string]any{"name": "x"}), Want: "notify.hooks[0].command"},
		{Key: "notify.hooks", Value: hooks(map[string]any{"name": "x", "command": []any{"page.sh"}}), Want: "notify.hooks[0].command"},
		{Key: "notify.hooks", Value: hooks(map[string]any{"name": "x", "command": []any{"/bin/true"}, "timeout": "100000h"}), Want: "notify.hooks[0].timeout"},
		{Key: "notify.hooks", Value: hooks(map[string]any{"name": "x", "command": []any{"/bin/true"}, "timeout": "-1s"}), Want: "notify.hooks[0].timeout"},
		{Key: "notify.hooks", Value: hooks(map[string]any{"name": "x", "command": []any{"/bin/true"}, "groups": []any{"nope"}}), Want: "notify.hooks[0].groups"},
		{Key: "notify.hooks", Value: hooks(map[string]any{"name": "x", "command": []any{"/bin/true"}, "events": []any{"everything"}}), Want: "notify.hooks[0].events"},
		{Key: "notify.hooks", Value: hooks(map[string]any{"name": "x", "command": []any{"/bin/true"}, "webhook": webhook(nil)}), Want: "notify.hooks[0].command"},
		{Key: "notify.hooks", Value: hooks(map[string]any{"name": "x", "command": []any{"/bin/true"}}, map[string]any{"name": "x", "command": []any{"/bin/true"}}), Want: "notify.hooks[1].name"},
		{Key: "notify.hooks", Value: hooks(map[string]any{"name": "x", "webhook": webhook(map[string]any{"url": "http://203.0.113.7/fan"})}), Want: "notify.hooks[0].webhook.url"},
		{Key: "notify.hooks", Value: hooks(map[string]any{"name": "x", "webhook": webhook(map[string]any{"url": "ftp://203.0.113.7/fan"})}), Want: "notify.hooks[0].webhook.url"},
		{Key: "notify.hooks", Value: hooks(map[string]any{"name": "x", "webhook": webhook(map[string]any{"secret_file": ""})}), Want: "notify.hooks[0].webhook.secret_file"},
		{Key: "notify.hooks", Value: hooks(map[string]any{"name": "x", "webhook": webhook(map[string]any{"max_tries": 1000})}), Want: "notify.hooks[0].webhook.max_tries"},
		{Key: "notify.hooks", Value: hooks(map[string]any{"name": "x", "webhook": webhook(map[string]any{"max_tries": -1})}), Want: "notify.hooks[0].webhook.max_tries"},
		{Key: "notify.hooks", Value: hooks(map[string]any{"name": "x", "webhook": webhook(map[string]any{"backoff": "-1s"})}), Want: "notify.hooks[0].webhook.backoff"},
		{Key: "notify.hooks", Value: hooks(map[string]any{"name": "x", "webhook": webhook(map[string]any{"max_backoff": "100000h"})}), Want: "notify.hooks[0].webhook.max_backoff"},
		{Key: "notify.hooks", Value: hooks(map[string]any{"name": "x", "webhook": webhook(map[string]any{"backoff": "10s", "max_backoff": "1s"})}), Want: "notify.hooks[0].webhook.max_backoff"},
	}...))
}

func hooks(h ...map[string]any) []any {
	out := make([]any, len(h))
	for i, m := range h {
		out[i] = m
	}
	return out
}

// webhook is a valid webhook section with some keys replaced.
func webhook(with map[string]any) map[string]any {
	w := map[string]any{"url": "https://hooks.example.org/fan", "secret_file": "/etc/fan/notify.secret"}
	for k, v := range with {
		w[k] = v
	}
	return w
}

// A thousand nodes in groups of two or three are accepted (the scale
// benchmark's layout); more groups or more members than the bounds are
// refused under the key groups.
func TestGroupCountBounds(t *testing.T) {
	cfg := func(groups, size int) []byte {
		var b strings.Builder
		b.WriteString("cluster: lab\nnode: ctl1\nbus: {url: \"nats://127.0.0.1:4222\"}\ngroups:\n")
		for g := range groups {
			fmt.Fprintf(&b, "  - {name: g%d, addresses: [198.51.100.10/24], health_check: pbx, nodes: [", g)
			for n := range size {
				if n > 0 {
					b.WriteString(", ")
				}
				fmt.Fprintf(&b, "n%d", g*size+n)
			}
			b.WriteString("]}\n")
		}
		return []byte(b.String())
	}
	parse := func(b []byte) error {
		var c Config
		return config.Parse("arbiter.yaml", b, &c)
	}
	if err := parse(cfg(500, 2)); err != nil {
		t.Fatalf("1,000 nodes in 500 groups of two: %v", err)
	}
	if err := parse(cfg(maxGroups, 4)); err != nil {
		t.Fatalf("%d groups of four: %v", maxGroups, err)
	}
	for name, b := range map[string][]byte{"groups": cfg(maxGroups+1, 2), "members": cfg(maxGroups, 5)} {
		err := parse(b)
		var fe *config.FieldError
		if !errors.As(err, &fe) || fe.Key != "groups" {
			t.Errorf("too many %s: %v, want refused under key groups", name, err)
		}
	}
}

// manyReplicas is a replicas list of n names, this replica's (ctl1) first.
func manyReplicas(n int) []any {
	out := []any{"ctl1"}
	for i := 2; i <= n; i++ {
		out = append(out, fmt.Sprintf("ctl%d", i))
	}
	return out
}

// The replicas the shipped shape names, this one's among them, are accepted.
func TestReplicasAccepted(t *testing.T) {
	b := strings.Replace(boundsValid, "lease_ttl: 3s\n", "lease_ttl: 3s\nreplicas: [pbx-a, pbx-b, ctl1]\n", 1)
	var c Config
	if err := config.Parse("arbiter.yaml", []byte(b), &c); err != nil {
		t.Fatal(err)
	}
	if len(c.Replicas) != 3 {
		t.Fatalf("replicas %v", c.Replicas)
	}
}
