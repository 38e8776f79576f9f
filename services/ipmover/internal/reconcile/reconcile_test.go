package reconcile

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"
)

var (
	pA   = netip.MustParsePrefix("192.0.2.10/24")
	pB   = netip.MustParsePrefix("198.51.100.10/24")
	p6   = netip.MustParsePrefix("2001:db8::10/64")
	node = netip.MustParsePrefix("203.0.113.5/24") // the node's own address: never managed
)

type fakeAddrs struct {
	mu         sync.Mutex
	on         map[netip.Prefix]bool
	failAdd    error
	failDel    error
	failList   error
	adds, dels int
}

func newFakeAddrs(present ...netip.Prefix) *fakeAddrs {
	f := &fakeAddrs{on: map[netip.Prefix]bool{}}
	for _, p := range present {
		f.on[p] = true
	}
	return f
}

func (f *fakeAddrs) Replace(p netip.Prefix) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failAdd != nil {
		return f.failAdd
	}
	f.adds++
	f.on[p] = true
	return nil
}

func (f *fakeAddrs) Delete(p netip.Prefix) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failDel != nil {
		return f.failDel
	}
	f.dels++
	delete(f.on, p)
	return nil
}

func (f *fakeAddrs) Present(want []netip.Prefix) ([]netip.Prefix, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failList != nil {
		return nil, f.failList
	}
	var out []netip.Prefix
	for _, p := range want {
		if f.on[p] {
			out = append(out, p)
		}
	}
	return out, nil
}

// vanish is someone else deleting the address behind our back.
func (f *fakeAddrs) vanish(p netip.Prefix) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.on, p)
}

func (f *fakeAddrs) has(p netip.Prefix) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.on[p]
}

type fakeAnn struct {
	mu      sync.Mutex
	starts  []netip.Addr
	running map[netip.Addr]int
	fail    error
}

func newFakeAnn() *fakeAnn { return &fakeAnn{running: map[netip.Addr]int{}} }

func (f *fakeAnn) Start(_ context.Context, ip netip.Addr) (func(), error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail != nil {
		return nil, f.fail
	}
	f.starts = append(f.starts, ip)
	f.running[ip]++
	var once sync.Once
	return func() {
		once.Do(func() {
			f.mu.Lock()
			defer f.mu.Unlock()
			f.running[ip]--
		})
	}, nil
}

func (f *fakeAnn) started(ip netip.Addr) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, s := range f.starts {
		if s == ip {
			n++
		}
	}
	return n
}

func (f *fakeAnn) runningFor(ip netip.Addr) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.running[ip]
}

type recorder struct {
	mu sync.Mutex
	cs []Change
	ch chan Change
}

func newRecorder() *recorder { return &recorder{ch: make(chan Change, 100)} }

func (r *recorder) on(c Change) {
	r.mu.Lock()
	r.cs = append(r.cs, c)
	r.mu.Unlock()
	r.ch <- c
}

func (r *recorder) kinds() []Kind {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]Kind, len(r.cs))
	for i, c := range r.cs {
		out[i] = c.Kind
	}
	return out
}

func (r *recorder) reset() {
	r.mu.Lock()
	r.cs = nil
	r.mu.Unlock()
	for len(r.ch) > 0 {
		<-r.ch
	}
}

func (r *recorder) wait(t *testing.T, k Kind, p netip.Prefix) Change {
	t.Helper()
	timeout := time.After(5 * time.Second)
	for {
		select {
		case c := <-r.ch:
			if c.Kind == k && c.Prefix == p {
				return c
			}
		case <-timeout:
			t.Fatalf("no %s change for %v; saw %v", k, p, r.kinds())
		}
	}
}

type rig struct {
	addrs *fakeAddrs
	ann   *fakeAnn
	rec   *recorder
	loop  *Loop
}

func newRig(cfg Config, present ...netip.Prefix) *rig {
	r := &rig{addrs: newFakeAddrs(present...), ann: newFakeAnn(), rec: newRecorder()}
	cfg.OnChange = r.rec.on
	r.loop = New(r.addrs, r.ann, cfg)
	return r
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestDesiredAddressAddedAndAnnounced(t *testing.T) {
	r := newRig(Config{}, node)
	must(t, r.loop.SetDesired("pbx", []string{pA.String(), p6.String()}, true))
	must(t, r.loop.Reconcile(t.Context()))

	if !r.addrs.has(pA) || !r.addrs.has(p6) {
		t.Fatal("desired addresses not added")
	}
	if r.ann.started(pA.Addr()) != 1 || r.ann.started(p6.Addr()) != 1 {
		t.Fatalf("announcements started: %v", r.ann.starts)
	}
	if got := r.rec.kinds(); !slices.Equal(got, []Kind{Added, Added}) {
		t.Errorf("changes %v, want two added", got)
	}
	if c := r.rec.cs[0]; c.Group != "pbx" || c.At.IsZero() {
		t.Errorf("change lacks group or time: %+v", c)
	}
	if got := r.loop.Held(); !slices.Equal(got, []netip.Prefix{pA, p6}) {
		t.Errorf("Held = %v", got)
	}

	// A second pass with nothing changed does nothing.
	r.rec.reset()
	must(t, r.loop.Reconcile(t.Context()))
	if len(r.rec.kinds()) != 0 || r.addrs.adds != 2 || r.ann.started(pA.Addr()) != 1 {
		t.Errorf("steady state pass acted: changes %v, adds %d", r.rec.kinds(), r.addrs.adds)
	}
	if !r.addrs.has(node) {
		t.Error("the node's own address was touched")
	}
}

func TestVanishedAddressReaddedAndReannounced(t *testing.T) {
	r := newRig(Config{})
	must(t, r.loop.SetDesired("pbx", []string{pA.String()}, true))
	must(t, r.loop.Reconcile(t.Context()))
	r.rec.reset()

	r.addrs.vanish(pA)
	must(t, r.loop.Reconcile(t.Context()))
	if !r.addrs.has(pA) {
		t.Fatal("vanished address not put back")
	}
	if got := r.rec.kinds(); !slices.Equal(got, []Kind{Readded}) {
		t.Errorf("changes %v, want [readded]", got)
	}
	if n := r.ann.started(pA.Addr()); n != 2 {
		t.Errorf("announcement schedules started %d times, want a fresh one after the re-add", n)
	}
	if n := r.ann.runningFor(pA.Addr()); n != 1 {
		t.Errorf("%d schedules running, want exactly one (the old one stopped)", n)
	}
}

func TestUnwantedAddressRemoved(t *testing.T) {
	// Present after a restart, but the group is not ours to hold.
	r := newRig(Config{}, pA, node)
	must(t, r.loop.SetDesired("pbx", []string{pA.String()}, false))
	must(t, r.loop.Reconcile(t.Context()))
	if r.addrs.has(pA) {
		t.Fatal("unwanted address still present")
	}
	if !r.addrs.has(node) {
		t.Fatal("unmanaged address removed")
	}
	if got := r.rec.kinds(); !slices.Equal(got, []Kind{Removed}) {
		t.Errorf("changes %v, want [removed]", got)
	}
	if n := r.ann.started(pA.Addr()); n != 0 {
		t.Errorf("announced an address we do not hold")
	}
}

func TestReleaseStopsAnnouncing(t *testing.T) {
	r := newRig(Config{})
	must(t, r.loop.SetDesired("pbx", []string{pA.String()}, true))
	must(t, r.loop.Reconcile(t.Context()))
	must(t, r.loop.SetDesired("pbx", []string{pA.String()}, false))
	must(t, r.loop.Reconcile(t.Context()))
	if r.addrs.has(pA) {
		t.Fatal("released address still present")
	}
	if n := r.ann.runningFor(pA.Addr()); n != 0 {
		t.Errorf("%d announcement schedules still running for a released address", n)
	}
}

func TestGroupPrefixChangeRemovesOldPrefix(t *testing.T) {
	r := newRig(Config{})
	must(t, r.loop.SetDesired("pbx", []string{pA.String()}, true))
	must(t, r.loop.Reconcile(t.Context()))
	must(t, r.loop.SetDesired("pbx", []string{pB.String()}, true))
	must(t, r.loop.Reconcile(t.Context()))
	if r.addrs.has(pA) || !r.addrs.has(pB) {
		t.Fatalf("after moving the group from %v to %v: A=%v B=%v", pA, pB, r.addrs.has(pA), r.addrs.has(pB))
	}
}

// A new claim for an address we already hold re-announces it: neighbours
// may have been pointed elsewhere meanwhile.
func TestNewClaimReannouncesPresentAddress(t *testing.T) {
	r := newRig(Config{}, pA)
	must(t, r.loop.SetDesired("pbx", []string{pA.String()}, true))
	must(t, r.loop.Reconcile(t.Context()))
	if n := r.ann.started(pA.Addr()); n != 1 {
		t.Fatalf("present, held, not announced: started %d", n)
	}
	must(t, r.loop.SetDesired("pbx", []string{pA.String()}, true)) // same claim again: no re-announce
	must(t, r.loop.Reconcile(t.Context()))
	if n := r.ann.started(pA.Addr()); n != 1 {
		t.Fatalf("repeated identical desired state re-announced: started %d", n)
	}
	must(t, r.loop.SetDesired("pbx", []string{pA.String()}, false))
	must(t, r.loop.SetDesired("pbx", []string{pA.String()}, true)) // released then claimed again
	must(t, r.loop.Reconcile(t.Context()))
	if n := r.ann.started(pA.Addr()); n != 2 {
		t.Errorf("a new claim did not re-announce: started %d", n)
	}
}

func TestReleaseAll(t *testing.T) {
	r := newRig(Config{}, node)
	must(t, r.loop.SetDesired("pbx", []string{pA.String(), p6.String()}, true))
	must(t, r.loop.SetDesired("gw", []string{pB.String()}, true))
	must(t, r.loop.Reconcile(t.Context()))
	r.rec.reset()

	must(t, r.loop.ReleaseAll(t.Context()))
	for _, p := range []netip.Prefix{pA, pB, p6} {
		if r.addrs.has(p) {
			t.Errorf("%v still present after ReleaseAll", p)
		}
		if n := r.ann.runningFor(p.Addr()); n != 0 {
			t.Errorf("%v still announced after ReleaseAll", p)
		}
	}
	if !r.addrs.has(node) {
		t.Error("ReleaseAll removed the node's own address")
	}
	if got := r.rec.kinds(); len(got) != 3 || slices.ContainsFunc(got, func(k Kind) bool { return k != Removed }) {
		t.Errorf("changes %v, want three removed", got)
	}
	// A later pass must not put anything back.
	must(t, r.loop.Reconcile(t.Context()))
	if r.addrs.has(pA) || r.addrs.has(pB) || r.addrs.has(p6) {
		t.Error("a pass after ReleaseAll re-added an address")
	}
	if len(r.loop.Held()) != 0 {
		t.Errorf("Held after ReleaseAll = %v", r.loop.Held())
	}
}

// ReleaseAll deletes even when it cannot read the interface: leaving an
// address behind is how two holders happen.
func TestReleaseAllDeletesBlind(t *testing.T) {
	r := newRig(Config{})
	must(t, r.loop.SetDesired("pbx", []string{pA.String()}, true))
	must(t, r.loop.Reconcile(t.Context()))
	r.addrs.failList = errors.New("netlink dump interrupted")
	if err := r.loop.ReleaseAll(t.Context()); err == nil {
		t.Error("ReleaseAll hid the read error")
	}
	if r.addrs.has(pA) {
		t.Error("address left behind because the interface could not be read")
	}
}

func TestFailuresReportedAndRetried(t *testing.T) {
	r := newRig(Config{})
	r.addrs.failAdd = errors.New("EPERM")
	must(t, r.loop.SetDesired("pbx", []string{pA.String()}, true))
	if err := r.loop.Reconcile(t.Context()); err == nil {
		t.Fatal("failed add not returned")
	}
	c := r.rec.wait(t, Failed, pA)
	if c.Err == nil {
		t.Error("failed change without error")
	}

	// Add works again, but the first announcement fails: the address is
	// reported added, the announcement failure too, and the next pass
	// starts the schedule that never ran.
	r.addrs.failAdd = nil
	r.ann.fail = errors.New("link down")
	if err := r.loop.Reconcile(t.Context()); err == nil {
		t.Fatal("failed announcement not returned")
	}
	r.rec.wait(t, Added, pA)
	r.rec.wait(t, Failed, pA)
	r.ann.fail = nil
	must(t, r.loop.Reconcile(t.Context()))
	if n := r.ann.runningFor(pA.Addr()); n != 1 {
		t.Errorf("announcement not retried: %d running", n)
	}

	r.addrs.failList = errors.New("netlink busy")
	if err := r.loop.Reconcile(t.Context()); err == nil {
		t.Error("read failure not returned")
	}
}

func TestSetDesiredRejectsBadPrefix(t *testing.T) {
	r := newRig(Config{})
	if err := r.loop.SetDesired("pbx", []string{pA.String(), "192.0.2.300/24"}, true); err == nil {
		t.Fatal("bad prefix accepted")
	}
	must(t, r.loop.Reconcile(t.Context()))
	if r.addrs.has(pA) {
		t.Error("a rejected SetDesired changed desired state")
	}
}

func runLoop(t *testing.T, l *Loop) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
}

func TestRunReactsToWatcherSignal(t *testing.T) {
	changed := make(chan struct{}, 1)
	// A period far longer than the test: only the signal can cause the re-add.
	r := newRig(Config{Period: time.Hour, Changed: changed})
	must(t, r.loop.SetDesired("pbx", []string{pA.String()}, true))
	runLoop(t, r.loop)
	r.rec.wait(t, Added, pA)

	r.addrs.vanish(pA)
	changed <- struct{}{}
	r.rec.wait(t, Readded, pA)
}

func TestRunReactsToPeriod(t *testing.T) {
	r := newRig(Config{Period: 20 * time.Millisecond})
	must(t, r.loop.SetDesired("pbx", []string{pA.String()}, true))
	runLoop(t, r.loop)
	r.rec.wait(t, Added, pA)
	r.addrs.vanish(pA)
	r.rec.wait(t, Readded, pA)
}

func TestRunWakesOnSetDesired(t *testing.T) {
	r := newRig(Config{Period: time.Hour})
	runLoop(t, r.loop)
	must(t, r.loop.SetDesired("pbx", []string{pB.String()}, true))
	r.rec.wait(t, Added, pB)
}

func TestRunStopsAnnouncementsOnExit(t *testing.T) {
	r := newRig(Config{Period: time.Hour})
	must(t, r.loop.SetDesired("pbx", []string{pA.String()}, true))
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- r.loop.Run(ctx) }()
	r.rec.wait(t, Added, pA)
	cancel()
	must(t, <-done)
	if n := r.ann.runningFor(pA.Addr()); n != 0 {
		t.Errorf("%d schedules outlived Run", n)
	}
}

// Every change says why it was made: carrying out desired state someone set
// (the setter reports it) or correcting drift on the loop's own (a
// correction), also when the loop's own pass, not the setter's, did it.
func TestChangesCarryTheirCause(t *testing.T) {
	r := newRig(Config{})
	cause := func() []Cause {
		r.rec.mu.Lock()
		defer r.rec.mu.Unlock()
		var out []Cause
		for _, c := range r.rec.cs {
			out = append(out, c.Cause)
		}
		return out
	}
	must(t, r.loop.SetDesired("pbx", []string{pA.String()}, true))
	must(t, r.loop.Reconcile(t.Context())) // any pass, not only the setter's Apply
	if got := cause(); !slices.Equal(got, []Cause{Desired}) {
		t.Fatalf("claim: causes %v", got)
	}
	r.rec.reset()
	r.addrs.vanish(pA)
	must(t, r.loop.Reconcile(t.Context()))
	if got := cause(); !slices.Equal(got, []Cause{Drift}) {
		t.Fatalf("vanished and put back: causes %v", got)
	}
	r.rec.reset()
	must(t, r.loop.SetDesired("pbx", []string{pA.String()}, false))
	must(t, r.loop.Reconcile(t.Context()))
	if got := cause(); !slices.Equal(got, []Cause{Desired}) {
		t.Fatalf("release: causes %v", got)
	}
	r.rec.reset()
	must(t, r.addrs.Replace(pA)) // put back by someone else while not held
	must(t, r.loop.Reconcile(t.Context()))
	if got := r.rec.kinds(); !slices.Equal(got, []Kind{Removed}) || !slices.Equal(cause(), []Cause{Drift}) {
		t.Fatalf("foreign re-add: changes %v causes %v", got, cause())
	}
	r.rec.reset()
	must(t, r.loop.SetDesired("pbx", []string{pA.String()}, true))
	must(t, r.loop.Reconcile(t.Context()))
	r.rec.reset()
	must(t, r.loop.ReleaseAll(t.Context()))
	if got := cause(); !slices.Equal(got, []Cause{Desired}) {
		t.Fatalf("release all: causes %v", got)
	}
}
