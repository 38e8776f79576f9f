package ipexec

import (
	"context"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fanpbx/fan/lab/netlab/netlabtest"
	"github.com/fanpbx/fan/services/ipmover/internal/fence"
)

// TestReleaseAllWithoutTheBus plays systemd's ExecStopPost after an ipmover
// was killed holding addresses: from its state file alone, every address it
// was told to hold goes (IPv4 and IPv6), anything labelled as fan's goes,
// and the node's own addresses stay.
func TestReleaseAllWithoutTheBus(t *testing.T) {
	netlabtest.RequireRoot(t)
	lan := netlabtest.NewLAN(t, "fanrel", "n1")
	ns := lan.Hosts["n1"]
	dev := netlabtest.LANInterface
	ns.IP(t, "addr", "add", "198.51.100.11/24", "dev", dev)
	ns.IP(t, "addr", "add", "198.51.100.10/24", "dev", dev, "label", dev+":fan")
	ns.IP(t, "addr", "add", "198.51.100.20/24", "dev", dev)
	ns.IP(t, "addr", "add", "2001:db8::10/64", "dev", dev, "nodad")
	ns.IP(t, "addr", "add", "2001:db8::11/64", "dev", dev, "nodad")

	state := filepath.Join(t.TempDir(), "state.json")
	st, err := fence.Open(state, fence.DefaultKeep)
	if err != nil {
		t.Fatal(err)
	}
	// The claims the dead ipmover had recorded before adding them.
	if err := st.Record("0193a1b2-0000-7000-8000-000000000001", 4, "198.51.100.20/24", "2001:db8::10/64"); err != nil {
		t.Fatal(err)
	}
	s := New(Config{Interface: dev, StateFile: state}, slog.New(slog.DiscardHandler), "test")
	s.ns = ns.Handle
	for range 2 { // idempotent: ExecStopPost also runs after clean stops
		if err := s.ReleaseAll(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	out := ns.IP(t, "-o", "addr", "show", "dev", dev)
	for _, gone := range []string{"198.51.100.10/", "198.51.100.20/", "2001:db8::10/"} {
		if strings.Contains(out, " "+gone) {
			t.Errorf("%s still on %s after release-all:\n%s", gone, dev, out)
		}
	}
	for _, kept := range []string{"198.51.100.11/", "2001:db8::11/"} {
		if !strings.Contains(out, " "+kept) {
			t.Errorf("the node's own %s was removed:\n%s", kept, out)
		}
	}
}
