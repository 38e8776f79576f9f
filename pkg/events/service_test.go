package events

import (
	"strings"
	"testing"
)

func TestServiceStatusSubjectStaysOutOfStreams(t *testing.T) {
	s := ServiceStatusSubject("lab", "prober", "n1")
	if s != "fan.svc.lab.prober.n1.status" {
		t.Fatalf("subject %q", s)
	}
	// A status request captured by the audit or command stream would be
	// stored (and, for commands, consumed by an executor).
	for _, root := range []string{EventRoot, CommandRoot, LeaseRoot} {
		if strings.HasPrefix(s, root+".") {
			t.Fatalf("%q is inside %s.>", s, root)
		}
	}
	if !strings.HasPrefix(s, strings.TrimSuffix(AllServiceStatus("lab"), ">")) {
		t.Fatalf("%q not matched by %q", s, AllServiceStatus("lab"))
	}
}
