package registry

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"
)

// BenchmarkRegistryWrites is the registry's share of following 1,000 nodes
// at one heartbeat a second: each op is one compare-and-set write of one
// node's record (read, modify, conditional update) on an embedded
// JetStream over loopback TCP. writer-share is the fraction of one
// writer's second that 1,000 such writes take (the arbiter runs four
// writers, so it has four times that headroom); p99-ns is one write.
func BenchmarkRegistryWrites(b *testing.B) {
	reg, _ := newRegistry(b, time.Minute)
	ctx := context.Background()
	const nodes = 1000
	at := t0
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := range b.N {
		at = at.Add(time.Millisecond)
		env, hb := heartbeat(fmt.Sprintf("n%d", i%nodes), uint64(i), at)
		start := time.Now()
		if err := reg.Heartbeat(ctx, env, hb, at); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(start))
	}
	b.StopTimer()
	slices.Sort(lat)
	perOp := float64(b.Elapsed().Nanoseconds()) / float64(b.N)
	b.ReportMetric(perOp*nodes/1e9, "writer-share")
	b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds()), "p99-ns")
}
