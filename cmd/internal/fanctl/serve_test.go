package fanctl_test

import (
	"testing"

	"github.com/fanpbx/fan/cmd/internal/fanctl"
	"github.com/fanpbx/fan/pkg/platform/config"
	"github.com/fanpbx/fan/pkg/platform/config/configtest"
)

const serveValid = `
url: nats://127.0.0.1:4222
cluster: lab
serve:
  listen: 127.0.0.1:9110
  path_prefix: /fan/
  token_file: /etc/fan/page.token
  session_ttl: 8h
  timeline: 2h
  timeline_max: 1000
  explain_lookback: 24h
  refresh: 2s
  max_clients: 32
`

// Every absurd value of the status page's section is refused with its key.
func TestServeConfigBounds(t *testing.T) {
	configtest.Refuses(t, []byte(serveValid), func(b []byte) error {
		var c fanctl.Config
		return config.Parse("fanctl.yaml", b, &c)
	}, []configtest.Case{
		{Key: "serve.listen", Value: "nowhere"},
		{Key: "serve.listen", Value: "127.0.0.1:70000"},
		{Key: "serve.path_prefix", Value: "fan"},
		{Key: "serve.path_prefix", Value: "/fan"},
		{Key: "serve.path_prefix", Value: "/a/../b/"},
		{Key: "serve.path_prefix", Value: "/a b/"},
		{Key: "serve.path_prefix", Value: "//"},
		{Key: "serve.session_ttl", Value: "1s"},
		{Key: "serve.session_ttl", Value: "1000h"},
		{Key: "serve.timeline", Value: "-1h"},
		{Key: "serve.timeline", Value: "10000h"},
		{Key: "serve.timeline_max", Value: 5},
		{Key: "serve.timeline_max", Value: 1000000},
		{Key: "serve.explain_lookback", Value: "1s"},
		{Key: "serve.refresh", Value: "1ms"},
		{Key: "serve.refresh", Value: "2h"},
		{Key: "serve.max_clients", Value: -1},
		{Key: "serve.max_clients", Value: 100000},
	})
}
