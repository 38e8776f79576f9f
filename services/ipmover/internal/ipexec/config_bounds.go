package ipexec

import (
	"fmt"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/config"
	"github.com/fanpbx/fan/services/ipmover/internal/keeper"
)

// Ranges of the ipmover's keys (README "Configuration"). Zero means the
// default everywhere a default exists; the defaults lie inside the ranges.
const (
	maxGroups = 64
	maxRoutes = 64
	// maxBurst bounds an announcement burst's packet count.
	maxBurst = 100
)

// validateBounds refuses out-of-range values of the IP executor's keys
// before defaults are derived from them (negative timeouts used to pass).
func (c *Config) validateBounds() error {
	a, v, cl, cf, bl := c.Announce, c.Verify, c.Claim, c.Conflict, c.BusLoss
	errs := []error{
		config.CountIn("groups", len(c.Groups), 0, maxGroups),
		config.DurationOrZero("reconcile_period", c.ReconcilePeriod.D(), 100*time.Millisecond, time.Minute),
		config.DurationOrZero("answer.timeout", c.Answer.Timeout.D(), 100*time.Millisecond, 5*time.Minute),
		config.CountIn("answer.modules", len(c.Answer.Modules), 0, 64),
		config.DurationOrZero("verify.timeout", v.Timeout.D(), 100*time.Millisecond, time.Minute),
		config.DurationOrZero("verify.every", v.Every.D(), 10*time.Millisecond, 10*time.Second),
		config.IntIn("verify.port", v.Port, 0, 65535),
		config.IntIn("calls.sip_port", c.Calls.SIPPort, 0, 65535),
		config.DurationOrZero("calls.keep_for", c.Calls.KeepFor.D(), keeper.MinKeepFor, keeper.MaxKeepFor),
		// Negative disables probing and the release wait (README).
		config.DurationIn("claim.probe_wait", cl.ProbeWait.D(), -1<<62, 5*time.Second),
		config.DurationIn("claim.release_wait", cl.ReleaseWait.D(), -1<<62, 10*time.Second),
		config.DurationOrZero("conflict.confirm_timeout", cf.ConfirmTimeout.D(), 10*time.Millisecond, time.Minute),
		config.DurationOrZero("conflict.min_interval", cf.MinInterval.D(), 10*time.Millisecond, time.Hour),
		config.DurationOrZero("bus_loss.release_after", bl.ReleaseAfter.D(), 100*time.Millisecond, time.Hour),
		config.DurationOrZero("bus_loss.check_every", bl.CheckEvery.D(), 10*time.Millisecond, time.Minute),
		config.DurationOrZero("bus_loss.heartbeat_interval", bl.HeartbeatInterval.D(), events.MinHeartbeatInterval, events.MaxHeartbeatInterval),
		config.DurationOrZero("bus_loss.arbiter_silent_after", bl.ArbiterSilentAfter.D(), 100*time.Millisecond, time.Hour),
		config.IntIn("announce.first_count", a.FirstCount, 0, maxBurst),
		config.IntIn("announce.second_count", a.SecondCount, 0, maxBurst),
		config.DurationIn("announce.first_interval", a.FirstInterval.D(), 0, 10*time.Second),
		config.DurationIn("announce.second_interval", a.SecondInterval.D(), 0, 10*time.Second),
		config.DurationIn("announce.second_delay", a.SecondDelay.D(), 0, 5*time.Minute),
		config.DurationIn("announce.refresh", a.Refresh.D(), 0, time.Hour),
		config.CountIn("gateway.routes", len(c.Gateway.Routes), 0, maxRoutes),
	}
	for i, r := range c.Gateway.Routes {
		errs = append(errs, config.IntIn(fmt.Sprintf("gateway.routes[%d].metric", i), r.Metric, 0, 1<<31-1))
	}
	if c.AMI.Address != "" {
		errs = append(errs, config.HostPort("ami.address", c.AMI.Address, false))
	}
	return config.Join(errs...)
}
