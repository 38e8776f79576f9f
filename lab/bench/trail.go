package bench

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/nats-io/nats.go/jetstream"
)

// TrailResult is what fan writes to the bus's streams per PBX node: over a
// steady window (every check up, heartbeats, probe results, beacons), and
// per failover (the transitions, decisions, commands and results that
// explain it, plus what the failover adds to the live stream).
type TrailResult struct {
	Nodes               int
	Steady              time.Duration
	SteadyAudit         uint64 // bytes added to the audit stream in the steady window
	SteadyLive          uint64 // bytes added to the live stream in the steady window
	Failovers           int
	AuditPerFailover    float64
	AuditPerNodeDay     float64 // steady rate, per node, per day
	LivePerNodeDay      float64
	AuditMaxBytes       int64
	LiveMaxBytes        int64
	LiveMaxAge          time.Duration
	AuditPerNodeDayAt24 float64 // with 24 failovers a day added
}

// Line prints the result as the benchmark's output line.
func (r TrailResult) Line() string {
	return fmt.Sprintf("trail nodes=%d steady_s=%.0f failovers=%d audit_bytes_per_node_day=%.0f live_bytes_per_node_day=%.0f "+
		"audit_bytes_per_failover=%.0f audit_bytes_per_node_day_with_24_failovers=%.0f audit_max_bytes=%d live_max_bytes=%d live_max_age=%s",
		r.Nodes, r.Steady.Seconds(), r.Failovers, r.AuditPerNodeDay, r.LivePerNodeDay,
		r.AuditPerFailover, r.AuditPerNodeDayAt24, r.AuditMaxBytes, r.LiveMaxBytes, r.LiveMaxAge)
}

// streamBytes reads a stream's size and limits; a missing stream is empty.
func streamBytes(ctx context.Context, js jetstream.JetStream, name string) (uint64, jetstream.StreamConfig, bool, error) {
	st, err := js.Stream(ctx, name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return 0, jetstream.StreamConfig{}, false, nil
	}
	if err != nil {
		return 0, jetstream.StreamConfig{}, false, fmt.Errorf("stream %s: %w", name, err)
	}
	info := st.CachedInfo()
	return info.State.Bytes, info.Config, true, nil
}

type streamSizes struct {
	audit, live uint64
	auditCfg    jetstream.StreamConfig
	liveCfg     jetstream.StreamConfig
}

func (f *Fan) sizes(ctx context.Context) (streamSizes, error) {
	_, js, err := f.bus()
	if err != nil {
		return streamSizes{}, err
	}
	var s streamSizes
	if s.audit, s.auditCfg, _, err = streamBytes(ctx, js, events.EventsStream); err != nil {
		return s, err
	}
	s.live, s.liveCfg, _, err = streamBytes(ctx, js, events.LiveStream)
	return s, err
}

// Trail measures what fan writes to its streams at the lab's check rates:
// the steady window first (after every node is up and one holds the
// address), then failovers of the pbx-death kind. Per node per day is the
// steady rate scaled to a day and divided among the PBX nodes.
func Trail(ctx context.Context, f *Fan, c *Client, nodes int, steady time.Duration, failovers int) (TrailResult, error) {
	r := TrailResult{Nodes: nodes, Steady: steady, Failovers: failovers}
	holder, err := c.Holder(ctx, 60*time.Second)
	if err != nil {
		return r, err
	}
	// Every standby up and heard before the window opens: start-up's
	// transitions and announcements are not the steady rate.
	for _, n := range f.St.Lab.Nodes() {
		if n.Name == holder {
			continue
		}
		if err := waitReady(ctx, f, n.Name, 60*time.Second); err != nil {
			return r, err
		}
	}
	before, err := f.sizes(ctx)
	if err != nil {
		return r, err
	}
	start := time.Now()
	select {
	case <-ctx.Done():
		return r, ctx.Err()
	case <-time.After(steady):
	}
	after, err := f.sizes(ctx)
	if err != nil {
		return r, err
	}
	took := time.Since(start)
	r.SteadyAudit, r.SteadyLive = after.audit-before.audit, after.live-before.live
	perDay := func(b uint64) float64 { return float64(b) / took.Seconds() * 86400 / float64(nodes) }
	r.AuditPerNodeDay, r.LivePerNodeDay = perDay(r.SteadyAudit), perDay(r.SteadyLive)
	r.AuditMaxBytes, r.LiveMaxBytes, r.LiveMaxAge = after.auditCfg.MaxBytes, after.liveCfg.MaxBytes, after.liveCfg.MaxAge
	if failovers > 0 {
		fstart := time.Now()
		if _, err := Run(ctx, f, c, PBXDeath, failovers, nil); err != nil {
			return r, err
		}
		end, err := f.sizes(ctx)
		if err != nil {
			return r, err
		}
		// The steady rate went on during the failovers: take it out.
		steadyShare := float64(r.SteadyAudit) / took.Seconds() * time.Since(fstart).Seconds()
		r.AuditPerFailover = (float64(end.audit-after.audit) - steadyShare) / float64(failovers)
		r.AuditPerNodeDayAt24 = r.AuditPerNodeDay + 24*r.AuditPerFailover/float64(nodes)
	}
	return r, nil
}
