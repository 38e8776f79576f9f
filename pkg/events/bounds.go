package events

import (
	"fmt"
	"math"
	"time"
)

// Bounds every payload's Validate applies to its numbers and texts, so that
// no single event (forged, corrupted or from a misconfigured producer) can
// keep a node "heard", a permit open or a list growing for longer or larger
// than these. The services' configuration ranges sit inside them: a
// well-configured producer is never refused. docs/bounds.md lists them all.
const (
	// MinHeartbeatInterval and MaxHeartbeatInterval bound NodeHeartbeat's
	// interval_ms. The arbiter counts a node silent after 3 x the advertised
	// interval, so one heartbeat keeps a dead node heard for at most 30 min
	// (the prober's heartbeat_interval is at most 1m, the HTTP endpoint's
	// interval at most 10m).
	MinHeartbeatInterval = 100 * time.Millisecond
	MaxHeartbeatInterval = 10 * time.Minute
	// MinBeaconInterval and MaxBeaconInterval bound a presence beacon's and
	// an arbiter presence's interval_ms (the prober's presence_interval).
	MinBeaconInterval = 10 * time.Millisecond
	MaxBeaconInterval = 10 * time.Second
	// MaxRiseFall bounds rise, fall and a transition's evidence list.
	MaxRiseFall = 100
	// MaxPermitSpan bounds a failback permit's validity (the scheduler's
	// one-off windows are at most this long).
	MaxPermitSpan = 31 * 24 * time.Hour
	// MaxTextLen bounds free text: reasons, errors, messages, targets.
	MaxTextLen = 2048
	// MaxShortLen bounds short labels: kinds, versions, window names, modules.
	MaxShortLen = 128
	// MaxListLen bounds lists and maps carried in one payload (checks in a
	// heartbeat, addresses and causes in a decision, figures in a result).
	MaxListLen = 512
	// MaxDurationMS bounds measured durations and lags (one week).
	MaxDurationMS = float64(7 * 24 * time.Hour / time.Millisecond)
	// MaxLagMS bounds a replication lag either way (clocks may disagree):
	// ten years.
	MaxLagMS = float64(10 * 365 * 24 * time.Hour / time.Millisecond)
	// MaxCount bounds channel, call and load figures reported by a node.
	MaxCount = 1_000_000
	// MaxCommandTTL bounds how far after its sending a command's deadline
	// may lie (the arbiter's command_ttl and claim_timeout are at most this).
	MaxCommandTTL = 10 * time.Minute
	// MaxClockSkew bounds how far an executor's clock may lag the arbiter's
	// (the arbiter's clock_skew is at most this).
	MaxClockSkew = time.Minute
	// MaxCommandReach is the furthest ahead of its receipt a command's
	// deadline can lie when it comes from a configured arbiter. Executors
	// refuse one beyond it: a deadline far ahead would keep a command
	// executable in its queue long after the decision behind it stopped
	// holding.
	MaxCommandReach = MaxCommandTTL + MaxClockSkew
)

// textIn refuses text longer than max bytes.
func textIn(field, v string, max int) error {
	if len(v) > max {
		return fmt.Errorf("%w: %s is %d bytes, at most %d", ErrInvalidField, field, len(v), max)
	}
	return nil
}

// floatIn refuses NaN, infinities and values outside [lo, hi].
func floatIn(field string, v, lo, hi float64) error {
	if math.IsNaN(v) || v < lo || v > hi {
		return fmt.Errorf("%w: %s %v out of %v..%v", ErrInvalidField, field, v, lo, hi)
	}
	return nil
}

// intIn refuses integers outside [lo, hi].
func intIn[T ~int | ~int64 | ~uint64](field string, v, lo, hi T) error {
	if v < lo || v > hi {
		return fmt.Errorf("%w: %s %d out of %d..%d", ErrInvalidField, field, v, lo, hi)
	}
	return nil
}

// listIn refuses lists longer than MaxListLen (or max when smaller).
func listIn(field string, n, max int) error {
	if n > max {
		return fmt.Errorf("%w: %s has %d entries, at most %d", ErrInvalidField, field, n, max)
	}
	return nil
}

// firstErr returns the first non-nil error.
func firstErr(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// ms is d in whole milliseconds, the unit interval_ms fields use.
func ms(d time.Duration) int64 { return d.Milliseconds() }

// ValidHeartbeatInterval checks an advertised heartbeat interval in ms
// (the HTTP heartbeat endpoint applies it to bodies before building events).
func ValidHeartbeatInterval(v int64) error {
	return intIn("interval_ms", v, ms(MinHeartbeatInterval), ms(MaxHeartbeatInterval))
}

// ValidBeaconInterval checks a beacon's or arbiter presence's interval in ms.
func ValidBeaconInterval(v int64) error {
	return intIn("interval_ms", v, ms(MinBeaconInterval), ms(MaxBeaconInterval))
}
