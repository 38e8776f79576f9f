package bus

import (
	"strings"
	"testing"
)

func TestLeaderServersAndSystemValidate(t *testing.T) {
	cases := []struct {
		name string
		cfg  Config
		want string // substring of the error; "" for valid
	}{
		{"none", Config{URL: "nats://127.0.0.1:4222"}, ""},
		{"leaders", Config{URL: "nats://127.0.0.1:4222", LeaderServers: []string{"nats-ctl", "nats-b"}}, ""},
		{"duplicate", Config{URL: "nats://127.0.0.1:4222", LeaderServers: []string{"x", "x"}}, "bus.leader_servers[1]"},
		{"empty name", Config{URL: "nats://127.0.0.1:4222", LeaderServers: []string{""}}, "bus.leader_servers[0]"},
		{"system user", Config{URL: "nats://127.0.0.1:4222", System: &SystemAccount{User: "sys", Password: "p"}}, ""},
		{"system without password", Config{URL: "nats://127.0.0.1:4222", System: &SystemAccount{User: "sys"}}, "bus.system.password"},
		{"system two ways", Config{URL: "nats://127.0.0.1:4222", System: &SystemAccount{User: "sys", Password: "p", Creds: "c"}}, "bus.system"},
		{"system empty", Config{URL: "nats://127.0.0.1:4222", System: &SystemAccount{}}, "bus.system"},
		{"system without url", Config{System: &SystemAccount{Creds: "c"}}, "bus.url"},
	}
	for _, c := range cases {
		err := c.cfg.Validate()
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: %v", c.name, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%s: error %v, want one naming %s", c.name, err, c.want)
		}
	}
}
