package events

import (
	"errors"
	"testing"
)

func TestBeaconRoundTrip(t *testing.T) {
	b := Beacon{Node: "n1", Seq: 7, IntervalMS: 100, At: goldenTime}
	data, err := b.Encode()
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeBeacon(data)
	if err != nil || got != b {
		t.Fatalf("round trip: %+v, %v", got, err)
	}
	if s := BeaconSubject("lab", "n1"); s != "fan.live.lab.n1" {
		t.Fatalf("subject %q", s)
	}
	for _, bad := range []string{`{"node":"n.1","interval_ms":100}`, `{"node":"n1"}`, `nope`} {
		if _, err := DecodeBeacon([]byte(bad)); err == nil {
			t.Errorf("accepted %s", bad)
		}
	}
	big := make([]byte, 2048)
	if _, err := DecodeBeacon(big); !errors.Is(err, ErrTooLarge) {
		t.Errorf("oversized beacon: %v", err)
	}
}
