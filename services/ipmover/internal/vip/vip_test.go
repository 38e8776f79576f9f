package vip

import (
	"context"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fanpbx/fan/lab/netlab/netlabtest"
	"github.com/fanpbx/fan/pkg/platform/waittest"
)

func TestLabel(t *testing.T) {
	for _, tc := range []struct{ ifname, want string }{
		{"eth0", "eth0:fan"},
		{"enp0s31f6", "enp0s31f6:fan"},
		{"abcdefghijk", "abcdefghijk:fan"}, // exactly 15
		{"abcdefghijkl", ""},               // would be 16: kernel limit
	} {
		got := Label(tc.ifname)
		if got != tc.want {
			t.Errorf("Label(%q) = %q, want %q", tc.ifname, got, tc.want)
		}
		if got != "" && !strings.HasPrefix(got, tc.ifname) {
			t.Errorf("Label(%q) = %q does not start with the interface name", tc.ifname, got)
		}
	}
}

func TestNormalizeRejectsForeignForms(t *testing.T) {
	p := netip.MustParsePrefix("::ffff:192.0.2.1/120")
	if _, err := normalize(p); err == nil {
		t.Errorf("normalize(%v) accepted a form the kernel stores differently", p)
	}
	if _, err := normalize(netip.Prefix{}); err == nil {
		t.Error("normalize accepted the zero prefix")
	}
}

type rig struct {
	pair *netlabtest.Pair
	m    *Manager
}

func newRig(t *testing.T) *rig {
	t.Helper()
	p := netlabtest.NewPair(t, "fanvip", "vip0", "peer0")
	m, err := New("vip0", nil, WithNamespace(p.A.Handle))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	return &rig{pair: p, m: m}
}

func (r *rig) find(t *testing.T, p netip.Prefix) (Address, bool) {
	t.Helper()
	all, err := r.m.List()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range all {
		if a.Prefix == p {
			return a, true
		}
	}
	return Address{}, false
}

func TestNewUnknownInterface(t *testing.T) {
	p := netlabtest.NewPair(t, "fanvip", "vip0", "peer0")
	if _, err := New("nosuch0", nil, WithNamespace(p.A.Handle)); err == nil {
		t.Fatal("New accepted an interface that does not exist")
	}
}

func TestIPv4ReplaceDeleteIdempotent(t *testing.T) {
	r := newRig(t)
	v4 := netip.MustParsePrefix("192.0.2.10/24")
	other := netip.MustParsePrefix("198.51.100.10/24")

	for i := range 2 { // the second add must be a no-op, not EEXIST
		if err := r.m.Replace(v4); err != nil {
			t.Fatalf("Replace #%d: %v", i+1, err)
		}
	}
	a, ok := r.find(t, v4)
	if !ok {
		t.Fatalf("%v not on the interface after Replace", v4)
	}
	if a.Label != "vip0:fan" {
		t.Errorf("label = %q, want vip0:fan", a.Label)
	}
	got, err := r.m.Present([]netip.Prefix{other, v4})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, []netip.Prefix{v4}) {
		t.Errorf("Present = %v, want [%v]", got, v4)
	}

	for i := range 2 { // deleting an absent address is success
		if err := r.m.Delete(v4); err != nil {
			t.Fatalf("Delete #%d: %v", i+1, err)
		}
	}
	if _, ok := r.find(t, v4); ok {
		t.Fatalf("%v still present after Delete", v4)
	}
	if got, _ := r.m.Present([]netip.Prefix{v4}); len(got) != 0 {
		t.Errorf("Present after delete = %v", got)
	}
}

func TestIPv6NoDAD(t *testing.T) {
	r := newRig(t)
	// The test namespaces switch DAD off for speed; switch it back on here,
	// or an address added without IFA_F_NODAD would pass too.
	r.pair.A.Sysctl(t, "net.ipv6.conf.vip0.accept_dad", "1")
	r.pair.B.Sysctl(t, "net.ipv6.conf.peer0.accept_dad", "1")
	// The peer already answers for the address: the split-brain case, in
	// which DAD would mark our copy dadfailed and leave it unusable.
	v6 := netip.MustParsePrefix("2001:db8::10/64")
	r.pair.B.IP(t, "addr", "add", v6.String(), "dev", "peer0", "nodad")

	if err := r.m.Replace(v6); err != nil {
		t.Fatal(err)
	}
	if err := r.m.Replace(v6); err != nil {
		t.Fatalf("second Replace: %v", err)
	}
	a, ok := r.find(t, v6)
	if !ok {
		t.Fatalf("%v not present", v6)
	}
	if a.Flags&(unix.IFA_F_TENTATIVE|unix.IFA_F_DADFAILED) != 0 {
		t.Errorf("flags %#x: address is tentative or dadfailed", a.Flags)
	}
	if a.Flags&unix.IFA_F_NODAD == 0 {
		t.Errorf("flags %#x: IFA_F_NODAD not set", a.Flags)
	}
	if err := r.m.Delete(v6); err != nil {
		t.Fatal(err)
	}
	if err := r.m.Delete(v6); err != nil {
		t.Fatalf("second Delete: %v", err)
	}
	if _, ok := r.find(t, v6); ok {
		t.Fatal("still present after Delete")
	}
}

// An address someone added with DAD on, which lost DAD to the peer, is not
// "present", and Replace turns it into a usable one.
func TestIPv6DADFailedIsRepaired(t *testing.T) {
	r := newRig(t)
	r.pair.A.Sysctl(t, "net.ipv6.conf.vip0.accept_dad", "1")
	v6 := netip.MustParsePrefix("2001:db8::20/64")
	r.pair.B.IP(t, "addr", "add", v6.String(), "dev", "peer0", "nodad")
	r.pair.A.IP(t, "addr", "add", v6.String(), "dev", "vip0")
	waittest.Until(t, 10*time.Second, "DAD to fail", func() bool {
		a, ok := r.find(t, v6)
		return ok && a.Flags&unix.IFA_F_DADFAILED != 0
	})
	if got, err := r.m.Present([]netip.Prefix{v6}); err != nil || len(got) != 0 {
		t.Fatalf("Present = %v, %v; a dadfailed address must count as absent", got, err)
	}
	if err := r.m.Replace(v6); err != nil {
		t.Fatal(err)
	}
	a, ok := r.find(t, v6)
	if !ok || a.Flags&(unix.IFA_F_DADFAILED|unix.IFA_F_TENTATIVE) != 0 {
		t.Fatalf("after Replace: present=%v flags=%#x", ok, a.Flags)
	}
	if got, _ := r.m.Present([]netip.Prefix{v6}); len(got) != 1 {
		t.Fatalf("Present after repair = %v", got)
	}
}

func TestWatchSignalsExternalDelete(t *testing.T) {
	r := newRig(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	ch, err := r.m.Watch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	v4 := netip.MustParsePrefix("203.0.113.10/24")
	if err := r.m.Replace(v4); err != nil {
		t.Fatal(err)
	}
	waitSignal(t, ch, "our own add")
	drain(ch)

	r.pair.A.IP(t, "addr", "del", v4.String(), "dev", "vip0")
	waitSignal(t, ch, "an external delete")

	cancel()
	deadline := time.After(5 * time.Second)
	for {
		select {
		case _, ok := <-ch:
			if !ok {
				return
			}
		case <-deadline:
			t.Fatal("watch channel not closed after cancel")
		}
	}
}

func waitSignal(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case _, ok := <-ch:
		if !ok {
			t.Fatalf("watch closed while waiting for %s", what)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("no signal after %s", what)
	}
}

func drain(ch <-chan struct{}) {
	for {
		select {
		case <-ch:
		default:
			return
		}
	}
}
