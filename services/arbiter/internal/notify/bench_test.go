package notify

import (
	"net/http/httptest"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/platform/config"
)

// BenchmarkOfferWhileAHookHangs is what the arbiter's notify watch pays
// per event while a hook hangs and its queue is full (every offer drops
// the oldest): offer-p50-ns and offer-p99-ns. Nothing on the decision path
// calls Offer; this bounds how far the notify watch itself can fall behind.
func BenchmarkOfferWhileAHookHangs(b *testing.B) {
	dir := b.TempDir()
	hang := filepath.Join(dir, "hang.sh")
	writeScript(b, hang, `sleep 300`)
	h := start(b, Config{Hooks: []HookConfig{{Name: "hangs", Command: []string{hang}, Timeout: config.Duration(5 * time.Minute)}}}, true, idle)
	lat := make([]time.Duration, 0, b.N)
	ev := event(1, "pbx")
	b.ResetTimer()
	for range b.N {
		t := time.Now()
		h.n.Offer(ev)
		lat = append(lat, time.Since(t))
	}
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds()), "offer-p50-ns")
	b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds()), "offer-p99-ns")
}

// BenchmarkCommandHook is one event through a command hook that does
// nothing (fork, exec of /bin/sh, the event on stdin, wait):
// command-p50-ms, command-p99-ms.
func BenchmarkCommandHook(b *testing.B) {
	sh := filepath.Join(b.TempDir(), "true.sh")
	writeScript(b, sh, `cat > /dev/null`)
	lat := make([]time.Duration, 0, b.N)
	for range b.N {
		t := time.Now()
		if _, err := runCommand(b.Context(), []string{sh}, sampleEvent(), 10*time.Second); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(t))
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "command-p50-ms")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "command-p99-ms")
}

// BenchmarkWebhook is one event POSTed, signed, to a local receiver that
// verifies the signature: webhook-p50-ms, webhook-p99-ms.
func BenchmarkWebhook(b *testing.B) {
	rc := &receiver{}
	srv := httptest.NewServer(rc)
	defer srv.Close()
	retries := 0
	w := newWebhook(srv.URL, 1, 5*time.Second, &retries)
	lat := make([]time.Duration, 0, b.N)
	for range b.N {
		t := time.Now()
		if _, err := w.deliver(b.Context(), sampleEvent()); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(t))
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "webhook-p50-ms")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "webhook-p99-ms")
}
