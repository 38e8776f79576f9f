package bus

import (
	"sync"
	"time"
)

// Refusal log lines are rationed per reason: a burst, then one a second.
// Anyone with publish rights on one subject (or, for content requests, a
// replicator's) can send malformed messages as fast as the bus carries
// them; each is still counted (fan_events_refused_total), but the log
// keeps its first lines and then one a second saying how many it left out,
// so a flood fills a counter and not the disk.
const (
	refusalBurst = 10
	refusalEvery = time.Second
)

type refusalLog struct {
	mu      sync.Mutex
	now     func() time.Time
	reasons map[string]*refusalBucket
}

type refusalBucket struct {
	tokens     float64
	at         time.Time
	suppressed int
}

// allow says whether a refusal for reason may be logged now, and how many
// lines for it were left out since the last one logged.
func (l *refusalLog) allow(reason string) (bool, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	if l.now != nil {
		now = l.now()
	}
	if l.reasons == nil {
		l.reasons = map[string]*refusalBucket{}
	}
	b := l.reasons[reason]
	if b == nil {
		b = &refusalBucket{tokens: refusalBurst, at: now}
		l.reasons[reason] = b
	}
	b.tokens = min(refusalBurst, b.tokens+now.Sub(b.at).Seconds()/refusalEvery.Seconds())
	b.at = now
	if b.tokens < 1 {
		b.suppressed++
		return false, 0
	}
	b.tokens--
	left := b.suppressed
	b.suppressed = 0
	return true, left
}
