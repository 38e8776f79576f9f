package app

import (
	"testing"

	"github.com/fanpbx/fan/pkg/platform/config"
	"github.com/fanpbx/fan/pkg/platform/config/configtest"
)

const boundsValid = base + `
trees: [{name: etc, path: /etc/asterisk}]
astdb:
  enabled: true
  ami: {address: "127.0.0.1:5038", username: fan, secret: s}
`

// Every absurd timing or count the replicator's file can hold is refused
// with its key.
func TestConfigBounds(t *testing.T) {
	configtest.Refuses(t, []byte(boundsValid), func(b []byte) error {
		var c Config
		return config.Parse("replicator.yaml", b, &c)
	}, append(configtest.CommonCases(), []configtest.Case{
		{Key: "debounce", Value: "-1s"},
		{Key: "debounce", Value: "1000h"},
		{Key: "scan_interval", Value: "-1s"},
		{Key: "gc_interval", Value: "-1s"},
		{Key: "gc_grace", Value: "100000h"},
		{Key: "workers", Value: -1},
		{Key: "store_pass_mib", Value: -1},
		{Key: "store_pass_mib", Value: 1 << 21},
		{Key: "workers", Value: 1000000},
		{Key: "safety.max_delete_share", Value: -0.5},
		{Key: "safety.allow_deletes", Value: -1},
		{Key: "astdb.interval", Value: "-1s"},
		{Key: "astdb.reconcile_interval", Value: "1s"},
		{Key: "astdb.reconcile_interval", Value: "2h"},
		{Key: "astdb.event_buffer", Value: -1},
		{Key: "astdb.ami.address", Value: "127.0.0.1:99999"},
		{Key: "calls.reconcile_interval", Value: "1s"},
		{Key: "calls.reconcile_interval", Value: "2h"},
		{Key: "calls.summary_interval", Value: "10ms"},
		{Key: "calls.summary_interval", Value: "2m"},
		{Key: "calls.event_buffer", Value: -1},
		{Key: "calls.event_buffer", Value: 1 << 21},
		{Key: "calls.orphan_grace", Value: "-1s"},
		{Key: "calls.orphan_grace", Value: "30s"},
		{Key: "calls.orphan_grace", Value: "2h"},
		{Key: "calls.ami.address", Value: "127.0.0.1:99999"},
	}...))
}
