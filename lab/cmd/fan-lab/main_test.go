package main

import (
	"testing"
	"time"
)

func TestEventLine(t *testing.T) {
	at, source, summary, ok := eventLine("2026-12-01T19:02:26.123+00:00 arbiter.decision arbiter@ctl pbx failover n1->n2 epoch=1 id=abc cause=def")
	want := time.Date(2026, 12, 1, 19, 2, 26, 123e6, time.UTC)
	if !ok || !at.Equal(want) || source != "arbiter@ctl" || summary != "arbiter.decision: pbx failover n1->n2" {
		t.Errorf("eventLine = %v %q %q %v", at, source, summary, ok)
	}
	for _, line := range []string{
		"2026-12-01T19:02:26.123+00:00 node.heartbeat prober@n1 n1 seq=4",
		"19:02:26.123 arbiter.decision arbiter@ctl pbx hold", // a clock without a date
		"no event here",
	} {
		if _, _, _, ok := eventLine(line); ok {
			t.Errorf("eventLine(%q) printed a line the demo leaves out", line)
		}
	}
}
