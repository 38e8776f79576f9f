package stack

import (
	"os"
	"strings"
	"testing"
)

// Every service's configuration carries the bus identity the stack gives it:
// insecure_lab on a plain bus, its own nkey and the lab CA otherwise.
func TestConfigsCarryBusAuth(t *testing.T) {
	s := &Stack{dir: t.TempDir(), data: map[string]any{
		"Cluster": "lab", "Group": "pbx", "NATS": "nats://198.51.100.2:4222", "Nodes": []string{"n1", "n2"},
		"VIP": "192.0.2.100/24", "Node": "n1", "NodeAddr": "192.0.2.11", "NodeAddrs": map[string]string{"n1": "192.0.2.11"},
		"Dir": "/tmp/x", "Interval": "200ms", "Timeout": "150ms", "PeerInterval": "200ms", "PeerTimeout": "150ms",
		"PresenceInterval": "100ms", "Rise": 2, "Fall": 3, "Replicas": 1,
	}}
	for svc := range configTemplates {
		p, err := s.writeConfig("n1", svc, s.data)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := os.ReadFile(p)
		if !strings.Contains(string(b), "\nbus:\n  url: nats://198.51.100.2:4222\n  insecure_lab: true\n") {
			t.Errorf("%s: bus section without insecure_lab:\n%s", svc, b)
		}
	}
}
