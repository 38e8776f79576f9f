package app

import (
	"testing"

	"github.com/fanpbx/fan/pkg/platform/config"
	"github.com/fanpbx/fan/pkg/platform/config/configtest"
)

const boundsValid = `
cluster: lab
node: ctl1
bus: {url: "nats://127.0.0.1:4222"}
groups:
  - name: pbx
    windows:
      - name: nightly
        weekly: [{days: [daily], from: "02:00", to: "04:00"}]
        once: [{from: "2026-01-01T00:00:00Z", to: "2026-01-02T00:00:00Z"}]
`

// Every absurd value the scheduler's file can hold is refused with its key.
func TestConfigBounds(t *testing.T) {
	configtest.Refuses(t, []byte(boundsValid), func(b []byte) error {
		var c Config
		return config.Parse("scheduler.yaml", b, &c)
	}, append(configtest.CommonCases(), []configtest.Case{
		{Key: "tick_every", Value: "-1s"},
		{Key: "tick_every", Value: "1000h"},
		{Key: "plan_ahead", Value: -1},
		{Key: "plan_ahead", Value: 1000000},
		{Key: "groups[0].windows[0].once[0].to", Value: "2027-01-01T00:00:00Z"},
		{Key: "groups[0].windows[0].once[0].to", Value: "2025-01-01T00:00:00Z"},
		{Key: "groups[0].windows[0].weekly[0].from", Value: "25:00"},
		{Key: "groups[0].windows[0].time_zone", Value: "Mars/Olympus"},
	}...))
}
