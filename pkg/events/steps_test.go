package events

import "testing"

func TestStepServer(t *testing.T) {
	for _, c := range []struct {
		name, step, server string
		ok                 bool
	}{
		{StepOn(StepDNSVerified, "203.0.113.53:53"), StepDNSVerified, "203.0.113.53:53", true},
		{StepDNSVerified, StepDNSVerified, "", false},
		{StepDNSVerified + ":", StepDNSVerified, "", false},
		{StepOn(StepDNSUpdateAccepted, "203.0.113.53:53"), StepDNSVerified, "", false},
		{StepReceived, StepDNSVerified, "", false},
	} {
		server, ok := StepServer(c.name, c.step)
		if server != c.server || ok != c.ok {
			t.Errorf("StepServer(%q, %q) = %q, %v; want %q, %v", c.name, c.step, server, ok, c.server, c.ok)
		}
	}
}
