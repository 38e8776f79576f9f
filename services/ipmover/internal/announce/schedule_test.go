package announce

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"
)

func TestDefaultConfig(t *testing.T) {
	c := DefaultConfig()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	want := []time.Duration{
		0, 200 * time.Millisecond, 400 * time.Millisecond, 600 * time.Millisecond, 800 * time.Millisecond,
		5 * time.Second, 5200 * time.Millisecond, 5400 * time.Millisecond, 5600 * time.Millisecond, 5800 * time.Millisecond,
	}
	if got := c.burstOffsets(); !slices.Equal(got, want) {
		t.Errorf("default offsets %v, want %v", got, want)
	}
	if c.Refresh != time.Minute {
		t.Errorf("refresh %v, want 60s", c.Refresh)
	}
}

func TestBurstOffsetsMergeOverlap(t *testing.T) {
	c := Config{FirstCount: 3, FirstInterval: 100, SecondDelay: 150, SecondCount: 2, SecondInterval: 100}
	want := []time.Duration{0, 100, 150, 200, 250}
	if got := c.burstOffsets(); !slices.Equal(got, want) {
		t.Errorf("offsets %v, want %v", got, want)
	}
}

func TestConfigValidate(t *testing.T) {
	bad := map[string]Config{
		"no first packet":       {FirstCount: 0, FirstInterval: time.Second},
		"negative interval":     {FirstCount: 2, FirstInterval: -1},
		"burst without spacing": {FirstCount: 3},
		"negative second count": {FirstCount: 1, SecondCount: -1},
		"negative refresh":      {FirstCount: 1, Refresh: -time.Second},
	}
	for name, c := range bad {
		if err := c.Validate(); err == nil {
			t.Errorf("%s: Validate accepted %+v", name, c)
		}
	}
	if err := (Config{FirstCount: 1}).Validate(); err != nil {
		t.Errorf("single packet, nothing else: %v", err)
	}
}

type sent struct {
	ip   netip.Addr
	kind string // "request", "reply", "na"
	at   time.Time
}

// fakeTx records packets; it can fail, and signals each send.
type fakeTx struct {
	mu    sync.Mutex
	start time.Time
	log   []sent
	fail  error
	each  chan struct{}
}

func newFakeTx() *fakeTx { return &fakeTx{start: time.Now(), each: make(chan struct{}, 1000)} }

func (f *fakeTx) record(ip netip.Addr, kind string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail != nil {
		return f.fail
	}
	now := time.Now()
	f.log = append(f.log, sent{ip: ip, kind: kind, at: now})
	f.each <- struct{}{}
	return nil
}

func (f *fakeTx) SendGARP(ip netip.Addr, reply bool) error {
	if reply {
		return f.record(ip, "reply")
	}
	return f.record(ip, "request")
}

func (f *fakeTx) SendNA(ip netip.Addr) error { return f.record(ip, "na") }

func (f *fakeTx) sent() []sent {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.log)
}

func (f *fakeTx) waitSent(t *testing.T, n int) {
	t.Helper()
	for range n {
		select {
		case <-f.each:
		case <-time.After(10 * time.Second):
			t.Fatalf("only %d of %d packets sent", len(f.sent()), n)
		}
	}
}

func kinds(s []sent) []string {
	out := make([]string, len(s))
	for i, p := range s {
		out[i] = p.kind
	}
	return out
}

func TestFirstPacketBeforeStartReturns(t *testing.T) {
	tx := newFakeTx()
	// Everything after the first packet is far away: anything sent by the
	// time Start returns was sent synchronously.
	a, err := New(tx, Config{FirstCount: 2, FirstInterval: time.Hour}, nil)
	if err != nil {
		t.Fatal(err)
	}
	stop, err := a.Start(t.Context(), netip.MustParseAddr("192.0.2.10"))
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	if got := kinds(tx.sent()); !slices.Equal(got, []string{"request"}) {
		t.Fatalf("sent by the time Start returned: %v, want one request", got)
	}
	if a.Active() != 1 {
		t.Errorf("Active = %d, want 1", a.Active())
	}
}

func TestScheduleOrderTimingAndStop(t *testing.T) {
	cfg := Config{
		FirstCount: 3, FirstInterval: 20 * time.Millisecond,
		SecondDelay: 120 * time.Millisecond, SecondCount: 2, SecondInterval: 10 * time.Millisecond,
		Refresh: 50 * time.Millisecond,
	}
	tx := newFakeTx()
	a, err := New(tx, cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	stop, err := a.Start(t.Context(), netip.MustParseAddr("192.0.2.10"))
	if err != nil {
		t.Fatal(err)
	}
	// 3 + 2 burst packets, then two refreshes of a request and a reply each.
	tx.waitSent(t, 5+4)
	stop()
	got := tx.sent()
	if a.Active() != 0 {
		t.Errorf("Active = %d after stop", a.Active())
	}

	wantKinds := []string{"request", "reply", "request", "reply", "request", "request", "reply", "request", "reply"}
	if k := kinds(got[:9]); !slices.Equal(k, wantKinds) {
		t.Errorf("kinds %v, want %v", k, wantKinds)
	}
	// Timers may fire late under load, never early.
	offsets := cfg.burstOffsets()
	for i, off := range offsets {
		if d := got[i].at.Sub(start); d < off {
			t.Errorf("packet %d at %v, before its offset %v", i, d, off)
		}
	}
	last := offsets[len(offsets)-1]
	for r := range 2 {
		min := last + time.Duration(r+1)*cfg.Refresh
		for _, p := range got[5+2*r : 7+2*r] {
			if d := p.at.Sub(start); d < min {
				t.Errorf("refresh %d at %v, before %v", r+1, d, min)
			}
		}
	}
	// stop waits for the schedule, so nothing follows it.
	after := len(tx.sent())
	if after != len(got) {
		t.Errorf("%d packets sent after stop returned", after-len(got))
	}
}

func TestScheduleIPv6SendsAdvertisements(t *testing.T) {
	tx := newFakeTx()
	a, err := New(tx, Config{FirstCount: 3, FirstInterval: time.Millisecond}, nil)
	if err != nil {
		t.Fatal(err)
	}
	stop, err := a.Start(t.Context(), netip.MustParseAddr("2001:db8::10"))
	if err != nil {
		t.Fatal(err)
	}
	tx.waitSent(t, 3)
	stop()
	if k := kinds(tx.sent()); !slices.Equal(k, []string{"na", "na", "na"}) {
		t.Errorf("kinds %v, want three advertisements", k)
	}
}

func TestScheduleEndsWithContext(t *testing.T) {
	tx := newFakeTx()
	a, err := New(tx, Config{FirstCount: 1, Refresh: time.Millisecond}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	stop, err := a.Start(ctx, netip.MustParseAddr("198.51.100.7"))
	if err != nil {
		t.Fatal(err)
	}
	tx.waitSent(t, 3)
	cancel()
	stop() // returns only once the goroutine has ended
	if a.Active() != 0 {
		t.Errorf("Active = %d after cancel", a.Active())
	}
}

func TestFirstPacketFailureStartsNothing(t *testing.T) {
	tx := newFakeTx()
	tx.fail = errors.New("link down")
	a, err := New(tx, Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	stop, err := a.Start(t.Context(), netip.MustParseAddr("203.0.113.9"))
	if err == nil || stop != nil {
		t.Fatalf("Start = (stop %v, err %v), want an error and no schedule", stop != nil, err)
	}
	if a.Active() != 0 || a.Started() != 0 {
		t.Errorf("Active %d Started %d after a failed start", a.Active(), a.Started())
	}
	if a.Config() != DefaultConfig() {
		t.Errorf("zero Config did not become DefaultConfig: %+v", a.Config())
	}
}
