package events

import "testing"

func init() {
	addSamples(map[Type]Payload{
		TypeNodePresence: NodePresence{Node: "n1", Presence: PresenceOffline, LastHeartbeat: goldenTime, SilentMS: 300_500, ThresholdMS: 300_000},
	})
}

func TestPresenceSubjectAndKeys(t *testing.T) {
	p := samples()[TypeNodePresence]
	if got := Subject(goldenEnvelope(t, p), p); got != "fan.evt.lab.registry.n1.presence" {
		t.Fatalf("subject %q", got)
	}
	if RegistryKey("lab", "n1") != "registry.lab.n1" || AllRegistryKeys("lab") != "registry.lab.*" {
		t.Fatal("registry keys")
	}
	if err := (NodePresence{Node: "n1", Presence: "away", LastHeartbeat: goldenTime, ThresholdMS: 1}).Validate(); err == nil {
		t.Fatal("unknown presence accepted")
	}
}
