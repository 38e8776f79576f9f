package statuspage

import (
	"encoding/json"
	"log/slog"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/bus/bustest"
	"github.com/fanpbx/fan/pkg/platform/logtest"
)

// Before the state bucket's watch has delivered anything (its consumer
// waits for the NATS meta leader, which may be moving while the page
// starts), the page reads the group status itself instead of saying that
// no arbiter leads.
func TestSnapshotBeforeTheWatchReadsTheStatus(t *testing.T) {
	s := bustest.Server(t)
	arb := bustest.Connect(t, s, bus.Identity{Cluster: "lab", Service: "arbiter", Node: "ctl"})
	kv, err := arb.StateKV(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	g := events.GroupStatus{Group: "pbx", Holder: "n1", Epoch: 3, Since: time.Now()}
	v, err := json.Marshal(g)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(t.Context(), events.GroupStatusKey("lab", g.Group), v); err != nil {
		t.Fatal(err)
	}
	viewer := bustest.Connect(t, s, bus.Identity{Cluster: "lab", Service: "fanctl-serve", Node: "noc"})
	// The hub is not run: its watch never delivers.
	h := newHub(viewer, "lab", Config{TimelineMax: 10}, slog.New(slog.NewTextHandler(&logtest.Buffer{}, nil)))
	var snap Snapshot
	if err := json.Unmarshal(h.current(t.Context()), &snap); err != nil {
		t.Fatal(err)
	}
	if snap.Error != "" || len(snap.Groups) != 1 || snap.Groups[0].Status.Holder != "n1" {
		t.Fatalf("snapshot before the watch: %+v, want pbx held by n1 and no error", snap)
	}
}
