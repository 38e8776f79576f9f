package app

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/platform/porttest"
	"github.com/fanpbx/fan/pkg/platform/waittest"

	"github.com/fanpbx/fan/pkg/platform/bus"
)

// TestStreamUsageIsExported: the arbiter's /metrics carries every stream's
// size and byte limit, which the disk alert compares.
func TestStreamUsageIsExported(t *testing.T) {
	l := newLab(t, "n1")
	addr := porttest.Addr(t)
	l.arbiterWith("ctlA", func(c *Config) { c.HTTPListen = addr })
	want := []string{
		fmt.Sprintf(`fan_stream_max_bytes{stream="%s"} %g`, bus.EventsStream, float64(bus.DefaultEventsMiB<<20)),
		fmt.Sprintf(`fan_stream_max_bytes{stream="%s"} %g`, bus.LiveStream, float64(bus.DefaultLiveMiB<<20)),
		fmt.Sprintf(`fan_stream_bytes{stream="%s"}`, bus.EventsStream),
		fmt.Sprintf(`fan_stream_bytes{stream="%s"}`, bus.LiveStream),
	}
	waittest.Until(t, 10*time.Second, "stream usage on /metrics", func() bool {
		code, m := httpGet(t, "http://"+addr+"/metrics")
		if code != 200 {
			return false
		}
		for _, w := range want {
			if !strings.Contains(m, w) {
				return false
			}
		}
		return true
	})
}
