package app

import (
	"log/slog"
	"testing"

	"github.com/fanpbx/fan/pkg/platform/config/configtest"
)

const boundsValidIP = `
cluster: lab
node: n1
bus: {url: "nats://127.0.0.1:4222"}
interface: eth0
groups: [{name: pbx, prefixes: [192.0.2.10/24]}]
state_file: /var/lib/fan/ipmover/state.json
ami: {address: "127.0.0.1:5038", username: fan, secret: s}
gateway:
  routes: [{to: 0.0.0.0/0, via: 192.0.2.1}]
`

const boundsValidDNS = `
cluster: lab
node: dns1
bus: {url: "nats://127.0.0.1:4222"}
executor: dns
state_file: /var/lib/fan/ipmover/state.json
dns:
  group: web
  zone: voip.test.
  name: sip.voip.test.
  types: [A]
  sites: {site-a: {a: [192.0.2.10]}, site-b: {a: [203.0.113.20]}}
  primary: 127.0.0.1:53
  key: {name: k, secret: c2VjcmV0c2VjcmV0c2VjcmV0}
`

const boundsValidDispatcher = `
cluster: lab
node: kam1
bus: {url: "nats://127.0.0.1:4222"}
executor: dispatcher
dispatcher:
  group: pbx
  url: http://127.0.0.1:5071/RPC
  nodes: {n1: "sip:192.0.2.11:5060"}
`

// Every absurd value the ipmover's file can hold is refused with its key,
// for each executor (negative dns.timeout, answer.timeout and verify.timeout
// and a TSIG secret that is not base64 used to pass).
func TestConfigBounds(t *testing.T) {
	load := func(b []byte) error {
		_, err := Parse("ipmover.yaml", b, slog.New(slog.DiscardHandler), "test")
		return err
	}
	configtest.Refuses(t, []byte(boundsValidIP), load, append(configtest.CommonCases(), []configtest.Case{
		{Key: "answer.timeout", Value: "-1s"},
		{Key: "answer.timeout", Value: "1000h"},
		{Key: "verify.timeout", Value: "-1s"},
		{Key: "verify.every", Value: "-1s"},
		{Key: "verify.port", Value: 70000},
		{Key: "calls.sip_port", Value: 70000},
		{Key: "calls.sip_port", Value: -1},
		{Key: "calls.keep_for", Value: "-1s"},
		{Key: "calls.keep_for", Value: "30s"},
		{Key: "calls.keep_for", Value: "13h"},
		{Key: "reconcile_period", Value: "-1s"},
		{Key: "claim.probe_wait", Value: "1h"},
		{Key: "claim.release_wait", Value: "1h"},
		{Key: "conflict.confirm_timeout", Value: "-1s"},
		{Key: "conflict.min_interval", Value: "-1s"},
		{Key: "bus_loss.release_after", Value: "-1s"},
		{Key: "bus_loss.check_every", Value: "-1s"},
		{Key: "bus_loss.heartbeat_interval", Value: "1000h"},
		{Key: "bus_loss.arbiter_silent_after", Value: "-1s"},
		{Key: "announce.first_count", Value: 1000000},
		{Key: "announce.second_count", Value: -1},
		{Key: "announce.first_interval", Value: "-1s"},
		{Key: "announce.refresh", Value: "1000h"},
		{Key: "ami.address", Value: "127.0.0.1:99999"},
		{Key: "gateway.routes[0].metric", Value: -1},
	}...))
	configtest.Refuses(t, []byte(boundsValidDNS), load, []configtest.Case{
		{Key: "dns.timeout", Value: "-1s"},
		{Key: "dns.timeout", Value: "1000h"},
		{Key: "dns.verify_timeout", Value: "-1s"},
		{Key: "dns.verify_interval", Value: "-1s"},
		{Key: "dns.fudge", Value: "-1s"},
		{Key: "dns.ttl", Value: "-30s"},
		{Key: "dns.key.secret", Value: "not base64!"},
		{Key: "dns.primary", Value: "127.0.0.1:99999"},
	})
	configtest.Refuses(t, []byte(boundsValidDispatcher), load, []configtest.Case{
		{Key: "dispatcher.timeout", Value: "-1s"},
		{Key: "dispatcher.reload_retry", Value: "-1s"},
		{Key: "dispatcher.resync", Value: "-1s"},
		{Key: "dispatcher.set", Value: -1},
		{Key: "dispatcher.mode", Value: "sometimes"},
	})
}
