package allow

import (
	"errors"
	"net/netip"
	"testing"

	"github.com/fanpbx/fan/services/ipmover/internal/execute"
)

func TestCheck(t *testing.T) {
	l, err := New([]Group{
		{Name: "pbx", Prefixes: []netip.Prefix{netip.MustParsePrefix("198.51.100.10/32"), netip.MustParsePrefix("2001:db8::/64")}},
		{Name: "sbc", Prefixes: []netip.Prefix{netip.MustParsePrefix("203.0.113.0/28")}},
		{Name: "lan", Prefixes: []netip.Prefix{netip.MustParsePrefix("192.0.2.10/24")}},
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		group string
		addrs []string
		ok    bool
	}{
		{"exact address", "pbx", []string{"198.51.100.10/32"}, true},
		{"ipv6 in range", "pbx", []string{"2001:db8::10/64"}, true},
		{"address in a range", "sbc", []string{"203.0.113.5/28"}, true},
		{"group without addresses", "sbc", nil, true},
		{"address written with its netmask", "lan", []string{"192.0.2.10/24"}, true},
		{"longer netmask for that address", "lan", []string{"192.0.2.10/32"}, true},
		{"another address in that /24", "lan", []string{"192.0.2.99/24"}, false},
		{"unknown group", "voip", []string{"198.51.100.10/32"}, false},
		{"address outside", "pbx", []string{"198.51.100.11/32"}, false},
		{"other group's range", "pbx", []string{"203.0.113.5/28"}, false},
		{"wider netmask than allowed", "sbc", []string{"203.0.113.5/24"}, false},
		{"netmask wider than the /32", "pbx", []string{"198.51.100.10/24"}, false},
		{"one bad among good", "pbx", []string{"198.51.100.10/32", "192.0.2.1/32"}, false},
		{"not an address", "pbx", []string{"nonsense"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := l.Check(tc.group, tc.addrs)
			if tc.ok && err != nil {
				t.Fatalf("refused: %v", err)
			}
			if !tc.ok && !errors.Is(err, execute.ErrNotAllowed) {
				t.Fatalf("got %v, want ErrNotAllowed", err)
			}
		})
	}
}

func TestNewRefusesBadLists(t *testing.T) {
	p := []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")}
	for name, groups := range map[string][]Group{
		"duplicate": {{Name: "pbx", Prefixes: p}, {Name: "pbx", Prefixes: p}},
		"bad name":  {{Name: "a.b", Prefixes: p}},
		"no prefix": {{Name: "pbx"}},
	} {
		if _, err := New(groups); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	var zero List
	if err := zero.Check("pbx", nil); !errors.Is(err, execute.ErrNotAllowed) {
		t.Errorf("the zero list allowed a group: %v", err)
	}
}
