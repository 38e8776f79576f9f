package dispatcher

import "testing"

func TestSatisfies(t *testing.T) {
	for _, tc := range []struct {
		flags            string
		active, disabled bool
	}{
		{"AP", true, false},
		{"IP", true, false}, // probed down by kamailio: its verdict stands
		{"TP", true, false},
		{"AX", false, false}, // not probing: set ap so kamailio watches it
		{"IX", false, false},
		{"DX", false, true},
		{"DP", false, true},
	} {
		d := Destination{Flags: tc.flags}
		if got := d.satisfies(Active); got != tc.active {
			t.Errorf("%s satisfies active = %t, want %t", tc.flags, got, tc.active)
		}
		if got := d.satisfies(Disabled); got != tc.disabled {
			t.Errorf("%s satisfies disabled = %t, want %t", tc.flags, got, tc.disabled)
		}
	}
}

func TestEntryLine(t *testing.T) {
	for _, tc := range []struct {
		e    Entry
		want string
	}{
		{Entry{Set: 1, URI: "sip:192.0.2.10:5060", State: Active}, "1 sip:192.0.2.10:5060 8 0"},
		{Entry{Set: 2, URI: "sip:192.0.2.11", State: Disabled, Priority: 5, Weight: 70, Attrs: "duid=b"},
			"2 sip:192.0.2.11 4 5 duid=b;weight=70;rweight=70"},
	} {
		got, err := tc.e.line()
		if err != nil || got != tc.want {
			t.Errorf("line(%+v) = %q, %v; want %q", tc.e, got, err, tc.want)
		}
	}
	for _, bad := range []Entry{
		{Set: 0, URI: "sip:a", State: Active},
		{Set: 1, URI: "", State: Active},
		{Set: 1, URI: "sip:a b", State: Active},
		{Set: 1, URI: "sip:a", State: 0},
		{Set: 1, URI: "sip:a", State: Active, Attrs: "weight=5"},
		{Set: 1, URI: "sip:a", State: Active, Attrs: "duid=a b"},
	} {
		if l, err := bad.line(); err == nil {
			t.Errorf("line(%+v) = %q, want an error", bad, l)
		}
	}
}
