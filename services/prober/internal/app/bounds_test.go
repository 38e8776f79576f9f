package app

import (
	"strings"
	"testing"

	"github.com/fanpbx/fan/pkg/platform/config"
	"github.com/fanpbx/fan/pkg/platform/config/configtest"
)

const boundsValid = `
cluster: lab
node: n1
bus: {url: "nats://127.0.0.1:4222"}
http_listen: 127.0.0.1:9101
checks:
  - {name: pbx, kind: tcp, address: "127.0.0.1:5060", interval: 1s, timeout: 500ms, rise: 2, fall: 3}
  - {name: sip, kind: sip, address: "127.0.0.1:5060", interval: 1s, timeout: 500ms, rise: 2, fall: 3}
  - {name: web, kind: http, address: "http://127.0.0.1:8080/", interval: 1s, timeout: 500ms, rise: 1, fall: 1}
  - {name: db, kind: exec, command: [/bin/true, --password=x], secret_args: ["--password="], interval: 1s, timeout: 500ms, rise: 1, fall: 1}
  - {name: peer, kind: sip, role: peer, target_node: n2, address: "127.0.0.1:5061", interval: 1s, timeout: 500ms, rise: 2, fall: 3}
`

// Every absurd value the prober's file can hold is refused by -check-config
// with its key (heartbeat_interval: -1s used to pass and then panic at start).
func TestConfigBounds(t *testing.T) {
	configtest.Refuses(t, []byte(boundsValid), func(b []byte) error {
		var c Config
		return config.Parse("prober.yaml", b, &c)
	}, append(configtest.CommonCases(), []configtest.Case{
		{Key: "heartbeat_interval", Value: "-1s"},
		{Key: "heartbeat_interval", Value: "1ms"},
		{Key: "heartbeat_interval", Value: "1h"},
		{Key: "presence_interval", Value: "-1s"},
		{Key: "presence_interval", Value: "1h"},
		{Key: "results_every", Value: "-1s"},
		{Key: "results_every", Value: "1000h"},
		{Key: "checks[0].interval", Value: "-1s"},
		{Key: "checks[0].interval", Value: "1000h"},
		{Key: "checks[0].timeout", Value: "-1s"},
		{Key: "checks[0].rise", Value: -1},
		{Key: "checks[0].rise", Value: 1000000},
		{Key: "checks[0].fall", Value: 1000000},
		{Key: "checks[0].jitter", Value: "-1s"},
		{Key: "checks[0].address", Value: "127.0.0.1:99999"},
		{Key: "checks[0].decisive_margin", Value: "10ms"}, // a self check's verdict is never hurried
		{Key: "checks[4].decisive_margin", Value: "500us"},
		{Key: "checks[4].decisive_margin", Value: "1s"},
		{Key: "checks[1].retransmit", Value: "-1s"},
		{Key: "checks[1].retransmit", Value: "1h"},
		{Key: "checks[3].secret_args", Value: []any{"99"}},
		{Key: "checks[3].secret_args", Value: []any{""}},
		{Key: "checks[2].body", Value: strings.Repeat("a", 5000)},
		{Key: "checks[1].codes", Value: strings.Split(strings.Repeat("2xx ", 65), " ")[:65]},
	}...))
}
