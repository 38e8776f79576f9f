package decide

import (
	"testing"
	"time"
)

func TestConfigDigest(t *testing.T) {
	base := func() Config {
		return Config{Cluster: "lab", NewID: func() string { return "x" }, Groups: []Group{{Name: "pbx", Addresses: []string{"198.51.100.10/24"},
			Nodes: []string{"n1", "n2"}, HealthCheck: "pbx", HealthFrom: map[string]HealthSource{"n2": {Observer: "n1", Check: "peer-n2"}}}}}
	}
	a, b := base(), base()
	b.NewID = nil
	b.HoldDown = DefaultHoldDown // the default spelled out is the same policy
	if a.Digest() != b.Digest() {
		t.Fatalf("equal policies differ: %s %s", a.Digest(), b.Digest())
	}
	b.HoldDown = time.Hour
	if a.Digest() == b.Digest() {
		t.Fatal("a different hold-down has the same digest")
	}
	c := base()
	c.Groups[0].Nodes = []string{"n2", "n1"}
	if a.Digest() == c.Digest() {
		t.Fatal("a different priority order has the same digest")
	}
}
