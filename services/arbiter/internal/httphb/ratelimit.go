package httphb

import (
	"net/netip"
	"sync"
	"time"
)

// limiter is a token bucket per source address: each source may make Burst
// requests at once and Rate a second after that. Checked before the token,
// so a flood of guesses is refused as cheaply as a flood of anything.
type limiter struct {
	rate  float64 // tokens a second
	burst float64
	max   int // sources tracked at most
	now   func() time.Time

	mu      sync.Mutex
	sources map[netip.Addr]*bucket
}

type bucket struct {
	tokens float64
	at     time.Time
	// limited says the source is being refused: only its first refusal is
	// logged until it is allowed again, so a flood cannot flood the log.
	limited bool
}

func newLimiter(rate float64, burst, max int, now func() time.Time) *limiter {
	return &limiter{rate: rate, burst: float64(burst), max: max, now: now, sources: map[netip.Addr]*bucket{}}
}

// verdict is what allow decided.
type verdict int

const (
	allowed verdict = iota
	limitedFirst
	limitedAgain
	tableFull
)

// allow takes one token of src's bucket.
func (l *limiter) allow(src netip.Addr) verdict {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	b, ok := l.sources[src]
	if !ok {
		if len(l.sources) >= l.max {
			l.sweep(now)
		}
		if len(l.sources) >= l.max {
			// Every tracked source is mid-burst: refusing a new one is the
			// only choice that keeps both the memory and the limit.
			return tableFull
		}
		b = &bucket{tokens: l.burst, at: now}
		l.sources[src] = b
	}
	b.tokens = min(l.burst, b.tokens+now.Sub(b.at).Seconds()*l.rate)
	b.at = now
	if b.tokens < 1 {
		if b.limited {
			return limitedAgain
		}
		b.limited = true
		return limitedFirst
	}
	b.tokens--
	b.limited = false
	return allowed
}

// sweep forgets sources whose bucket has refilled: a new bucket would be
// the same.
func (l *limiter) sweep(now time.Time) {
	for a, b := range l.sources {
		if b.tokens+now.Sub(b.at).Seconds()*l.rate >= l.burst {
			delete(l.sources, a)
		}
	}
}
