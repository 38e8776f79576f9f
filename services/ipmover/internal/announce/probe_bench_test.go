package announce

import (
	"net/netip"
	"testing"
	"time"
)

// BenchmarkProbe measures what the ARP probe before an unfenced claim costs
// on the critical path: with a live holder it returns on the first answer;
// with none it waits out the full wait (probe_wait, 100 ms by default),
// which is why a failover's claim, naming its previous holder fenced,
// skips it. Run:
//
//	go test -run '^$' -bench Probe -benchtime 20x ./internal/announce
func BenchmarkProbe(b *testing.B) {
	n := newLAN(b)
	held := netip.MustParseAddr("192.0.2.50")
	free := netip.MustParseAddr("192.0.2.51")
	n.pair.B.IP(b, "addr", "add", held.String()+"/24", "dev", "peer0")
	const wait = 100 * time.Millisecond
	for _, tc := range []struct {
		name string
		ip   netip.Addr
		want bool
	}{{"answered", held, true}, {"nobody", free, false}} {
		b.Run(tc.name, func(b *testing.B) {
			for b.Loop() {
				_, found, err := n.link.Probe(b.Context(), tc.ip, wait)
				if err != nil || found != tc.want {
					b.Fatalf("Probe(%v) = %v, %v", tc.ip, found, err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/1000/float64(b.N), "ms/probe")
		})
	}
}
