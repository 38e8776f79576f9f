package bus_test

import (
	"strings"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/config"
)

func TestConfigValidation(t *testing.T) {
	cases := map[string]bus.Config{
		"no url":      {},
		"creds+nkey":  {URL: "nats://x:4222", Creds: "a", NKeySeed: "b"},
		"cert no key": {URL: "nats://x:4222", TLS: bus.TLSConfig{Cert: "c"}},
		// Bounds: each refused naming its key (docs/bounds.md).
		"ping -1s":            {URL: "nats://127.0.0.1:4222", PingInterval: config.Duration(-time.Second)},
		"max age -1h":         {URL: "nats://127.0.0.1:4222", EventsMaxAge: config.Duration(-time.Hour)},
		"17 servers":          {URL: strings.Repeat("nats://127.0.0.1:4222,", 16) + "nats://127.0.0.1:4222"},
		"server without host": {URL: "nats://:4222"},
		"audit too small":     {URL: "nats://127.0.0.1:4222", Limits: bus.Limits{EventsMiB: 63}},
		"live too big":        {URL: "nats://127.0.0.1:4222", Limits: bus.Limits{LiveMiB: 1<<16 + 1}},
		"negative state":      {URL: "nats://127.0.0.1:4222", Limits: bus.Limits{StateMiB: -1}},
		"commands small":      {URL: "nats://127.0.0.1:4222", Limits: bus.Limits{CommandsMiB: 15}},
		"live age short":      {URL: "nats://127.0.0.1:4222", Limits: bus.Limits{LiveMaxAge: config.Duration(9 * time.Minute)}},
		"live age long":       {URL: "nats://127.0.0.1:4222", Limits: bus.Limits{LiveMaxAge: config.Duration(169 * time.Hour)}},
	}
	for name, c := range cases {
		if err := c.Validate(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	ok := bus.Config{URL: "nats://127.0.0.1:4222", Limits: bus.Limits{EventsMiB: 64, LiveMiB: 1 << 16, LiveMaxAge: config.Duration(168 * time.Hour)}}
	if err := ok.Validate(); err != nil {
		t.Errorf("limits at their bounds refused: %v", err)
	}
	var d bus.Config
	d.Defaults()
	if d.Limits.TotalMiB() != bus.DefaultEventsMiB+bus.DefaultLiveMiB+bus.DefaultCommandsMiB+bus.DefaultStateMiB+bus.DefaultCallsMiB || d.Limits.LiveMaxAge.D() != bus.DefaultLiveMaxAge {
		t.Errorf("default limits %+v", d.Limits)
	}
}
