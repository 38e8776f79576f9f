package events

import (
	"os"
	"path/filepath"
	"testing"
)

// FuzzDecode: Decode must never panic, and whatever it accepts must encode
// and decode again to the same type (run: go test -fuzz FuzzDecode ./pkg/events).
func FuzzDecode(f *testing.F) {
	files, _ := filepath.Glob(filepath.Join("testdata", "*.golden.json"))
	for _, p := range files {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte(`{}`))
	f.Add([]byte(`{"type":"command.claim_ip","version":1,"data":null}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		e, p, err := Decode(b)
		if err != nil {
			return
		}
		out, err := e.Encode()
		if err != nil {
			t.Fatalf("accepted envelope does not encode: %v", err)
		}
		e2, p2, err := Decode(out)
		if err != nil {
			t.Fatalf("re-decode of accepted envelope failed: %v", err)
		}
		if e2.Type != e.Type || p2.EventType() != p.EventType() {
			t.Fatalf("type changed across round trip: %s -> %s", e.Type, e2.Type)
		}
	})
}
