package app

import (
	"testing"
	"time"

	"github.com/fanpbx/fan/lab/amipeer"
	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/config"
	"github.com/fanpbx/fan/pkg/platform/daemon/metricstest"
)

// TestMetricsFollowTheChecks: against the AMI peer, /metrics shows the
// check up with its runs and durations, then, once the PBX fails, the
// failures by class and the check down.
func TestMetricsFollowTheChecks(t *testing.T) {
	peer, err := amipeer.Start(amipeer.Config{Username: "fan", Secret: "right"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { peer.Close() })
	addr := metricstest.Listen(t)
	runProberWith(t, []CheckConfig{{Name: "pbx", Kind: "ami", Address: peer.Addr(), Username: "fan", Secret: "right",
		Interval: config.Duration(100 * time.Millisecond), Timeout: config.Duration(80 * time.Millisecond), Rise: 1, Fall: 2}}, nil,
		func(c *Config) { c.HTTPListen = addr })
	const within = 10 * time.Second
	state := func(s events.Health) string {
		return `fan_prober_check_state{check="pbx",role="self",state="` + string(s) + `",target_node="n1"}`
	}
	metricstest.WaitFor(t, addr, state(events.HealthUp), metricstest.Is(1), within)
	metricstest.WaitFor(t, addr, state(events.HealthDown), metricstest.Is(0), within)
	runs := metricstest.WaitFor(t, addr, `fan_prober_check_runs_total{check="pbx",target_node="n1"}`, metricstest.AtLeast(1), within)
	metricstest.WaitFor(t, addr, `fan_prober_check_duration_seconds_count{check="pbx",target_node="n1"}`, metricstest.AtLeast(runs), within)
	metricstest.WaitFor(t, addr, `fan_prober_check_duration_seconds_sum{check="pbx",target_node="n1"}`, func(v float64) bool { return v > 0 }, within)

	if err := peer.SetMode(amipeer.ModeFailing); err != nil {
		t.Fatal(err)
	}
	metricstest.WaitFor(t, addr, `fan_prober_check_failures_total{check="pbx",class="`+string(events.ErrorUnhealth)+`",target_node="n1"}`,
		metricstest.AtLeast(2), within)
	metricstest.WaitFor(t, addr, state(events.HealthDown), metricstest.Is(1), within)
	metricstest.WaitFor(t, addr, state(events.HealthUp), metricstest.Is(0), within)
}
