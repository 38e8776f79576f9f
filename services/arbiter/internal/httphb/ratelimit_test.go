package httphb

import (
	"net/netip"
	"testing"
	"time"
)

// The token bucket per source, on a fake clock: a burst, then the rate;
// sources apart; a run of refusals logged once; the table bounded.
func TestLimiter(t *testing.T) {
	now := time.Unix(0, 0)
	l := newLimiter(2, 3, 2, func() time.Time { return now })
	a, b, c := netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.2"), netip.MustParseAddr("192.0.2.3")
	for i := 0; i < 3; i++ {
		if v := l.allow(a); v != allowed {
			t.Fatalf("burst request %d: %v", i, v)
		}
	}
	if v := l.allow(a); v != limitedFirst {
		t.Fatalf("past the burst: %v, want limitedFirst", v)
	}
	if v := l.allow(a); v != limitedAgain {
		t.Fatalf("still past the burst: %v, want limitedAgain", v)
	}
	if v := l.allow(b); v != allowed {
		t.Fatalf("another source: %v", v)
	}
	if v := l.allow(c); v != tableFull {
		t.Fatalf("a third source with two tracked, both mid-burst: %v, want tableFull", v)
	}
	now = now.Add(500 * time.Millisecond) // one token at 2/s
	if v := l.allow(a); v != allowed {
		t.Fatalf("after a refill: %v", v)
	}
	now = now.Add(10 * time.Second) // every bucket full again: forgotten on demand
	if v := l.allow(c); v != allowed {
		t.Fatalf("a new source once the others refilled: %v", v)
	}
}

func TestBearerScheme(t *testing.T) {
	for h, want := range map[string]string{"Bearer x": "x", "bearer x": "x", "BEARER   x ": "x", " Bearer x": "x"} {
		if got, ok := bearer(h); !ok || got != want {
			t.Errorf("bearer(%q) = %q %v", h, got, ok)
		}
	}
	for _, h := range []string{"", "Bearer", "Basic x", "Bearerx y", "x"} {
		if got, ok := bearer(h); ok {
			t.Errorf("bearer(%q) = %q, accepted", h, got)
		}
	}
}
