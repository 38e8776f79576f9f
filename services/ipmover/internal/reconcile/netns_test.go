package reconcile_test

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/fanpbx/fan/lab/netlab/netlabtest"
	"github.com/fanpbx/fan/services/ipmover/internal/announce"
	"github.com/fanpbx/fan/services/ipmover/internal/reconcile"
	"github.com/fanpbx/fan/services/ipmover/internal/vip"
)

// With the real address manager, watcher and announcer in a namespace, an
// external `ip addr del` of a held address is undone within one period, and
// the address is announced again; ReleaseAll then takes it off for good.
func TestExternalDeleteUndoneInNamespace(t *testing.T) {
	p := netlabtest.NewPair(t, "fanrec", "vip0", "peer0")
	held := netip.MustParsePrefix("192.0.2.10/24")
	held6 := netip.MustParsePrefix("2001:db8::10/64")

	m, err := vip.New("vip0", nil, vip.WithNamespace(p.A.Handle))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	link, err := announce.Open("vip0", nil, announce.WithNamespace(p.A.Handle))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { link.Close() })
	ann, err := announce.New(link, announce.Config{FirstCount: 2, FirstInterval: 50 * time.Millisecond}, nil)
	if err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithCancel(t.Context())
	changed, err := m.Watch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	readded := make(chan reconcile.Change, 10)
	loop := reconcile.New(m, ann, reconcile.Config{
		Period:  reconcile.DefaultPeriod,
		Changed: changed,
		OnChange: func(c reconcile.Change) {
			if c.Kind == reconcile.Readded {
				readded <- c
			}
		},
	})
	if err := loop.SetDesired("pbx", []string{held.String(), held6.String()}, true); err != nil {
		t.Fatal(err)
	}
	// The critical path: apply synchronously, as the service does for a claim.
	if err := loop.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if got, _ := m.Present([]netip.Prefix{held, held6}); len(got) != 2 {
		t.Fatalf("after Reconcile present = %v", got)
	}
	done := make(chan error, 1)
	go func() { done <- loop.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	startedBefore := ann.Started()
	requestsBefore := link.Stats().ARPRequests

	start := time.Now()
	p.A.IP(t, "addr", "del", held.String(), "dev", "vip0")
	select {
	case c := <-readded:
		if c.Prefix != held {
			t.Fatalf("re-added %v, want %v", c.Prefix, held)
		}
	case <-time.After(reconcile.DefaultPeriod):
		t.Fatalf("external delete not undone within one period (%v)", reconcile.DefaultPeriod)
	}
	t.Logf("re-added %v after %v", held, time.Since(start))
	if got, _ := m.Present([]netip.Prefix{held}); len(got) != 1 {
		t.Fatal("reported re-added but not present")
	}
	if ann.Started() <= startedBefore || link.Stats().ARPRequests <= requestsBefore {
		t.Errorf("re-added address not re-announced: schedules %d->%d, ARP requests %d->%d",
			startedBefore, ann.Started(), requestsBefore, link.Stats().ARPRequests)
	}
	all, err := m.List()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range all {
		if a.Prefix == held && a.Label != "vip0:fan" {
			t.Errorf("re-added address label %q", a.Label)
		}
	}

	if err := loop.ReleaseAll(ctx); err != nil {
		t.Fatal(err)
	}
	if got, _ := m.Present([]netip.Prefix{held, held6}); len(got) != 0 {
		t.Fatalf("after ReleaseAll present = %v", got)
	}
	if ann.Active() != 0 {
		t.Errorf("%d announcement schedules running after ReleaseAll", ann.Active())
	}
}
